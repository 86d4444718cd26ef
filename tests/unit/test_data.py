"""The data path without Ray: shards and index, the sample order, batches, data state, MLM and prefetching,
on real text (30 files of the Python standard library's own source)."""
import io
import os
import pathlib
import shutil
import sysconfig
import time

import numpy as np
import pytest
import xxhash

from autohet_ray import ConfigError
from autohet_ray.data import Dataset, Prefetcher, check_corpus_size, check_fits_model, mask_tokens
from autohet_ray.data.documents import documents_of
from autohet_ray.data.index import token_dtype
from autohet_ray.data.order import epoch_permutation, sample_ids
from autohet_ray.data.tokenize import (encode_documents, special_ids, tokenizer_from_json, train_byte_level_bpe,
                                       vocab_size_of)
from autohet_ray.data.writer import DatasetWriter, check_output_directory, directory_put
from autohet_ray.model.spec import load_model
from autohet_ray.runtime.vocab_ce import IGNORE_INDEX

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
VOCAB, SEQ, FILES_PER_SHARD = 1024, 64, 7


def stdlib_files(count=30):
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    return [p for p in sorted(root.glob("*.py")) if 1_000 < p.stat().st_size < 60_000][:count]


def write_dataset(out, files, tokenizer_json, *, val_fraction=0.1):
    """The pure half of `autohet data prepare`: one shard per FILES_PER_SHARD files."""
    check_output_directory(str(out))
    tok = tokenizer_from_json(tokenizer_json)
    eos, mask = special_ids(tok)
    writer = DatasetWriter(directory_put(str(out)), tokenizer_json=tokenizer_json, vocab_size=vocab_size_of(tok),
                           eos_id=eos, mask_id=mask)
    for start in range(0, len(files), FILES_PER_SHARD):
        docs = [d for p in files[start:start + FILES_PER_SHARD] for d in documents_of(str(p), p.read_bytes())]
        writer.add_shard(encode_documents(tok, docs, eos_id=eos, dtype=writer.dtype), len(docs))
    return writer.finish(val_fraction=val_fraction)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    files = stdlib_files()
    tokenizer_json = train_byte_level_bpe((p.read_text() for p in files), VOCAB)
    out = tmp_path_factory.mktemp("dataset")
    write_dataset(out, files, tokenizer_json)
    return {"files": files, "tokenizer_json": tokenizer_json, "dir": out, "dataset": Dataset.open(str(out))}


def test_stream_is_the_tokenizers_librarys_encoding_and_decodes_back(corpus):
    tok = tokenizer_from_json(corpus["tokenizer_json"])
    eos, _ = special_ids(tok)
    expected = []
    for p in corpus["files"]:
        text = p.read_bytes().decode("utf-8")                           # as read by prepare: no newline translation
        ids = tok.encode(text, add_special_tokens=False).ids
        assert tok.decode(ids) == text                                   # byte-level BPE is lossless
        expected += ids + [eos]
    ds = corpus["dataset"]
    assert ds.index.dtype == "uint16" and ds.index.vocab_size == VOCAB
    assert ds.tokens(0, ds.index.num_tokens).tolist() == expected
    assert ds.index.num_documents == len(corpus["files"])


def test_index_records_each_shards_xxh3_and_size(corpus):
    index = corpus["dataset"].index
    assert len(index.shards) == -(-len(corpus["files"]) // FILES_PER_SHARD)
    for shard in index.shards:
        data = (corpus["dir"] / shard.file).read_bytes()
        assert xxhash.xxh3_64(data).hexdigest() == shard.xxh3_64
        assert len(data) == 2 * shard.num_tokens
    assert index.train_tokens == index.num_tokens - round(0.1 * index.num_tokens)


def test_uint32_shards_past_65535_ids(tmp_path):
    assert token_dtype(65535).name == "uint16" and token_dtype(65536).name == "uint32"
    tokens = np.random.default_rng(0).integers(0, 70_000, 5_000).astype("<u4")
    writer = DatasetWriter(directory_put(str(tmp_path)), tokenizer_json="{}", vocab_size=70_000, eos_id=0,
                           mask_id=None)
    writer.add_shard(tokens, 1)
    writer.finish(val_fraction=0.0)
    assert (tmp_path / "shard-00000.bin").stat().st_size == 4 * len(tokens)
    assert Dataset.open(str(tmp_path)).tokens(0, len(tokens)).tolist() == tokens.tolist()


def test_corrupt_or_missing_shard_is_named(corpus, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(corpus["dir"], broken)
    path = broken / "shard-00001.bin"
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ConfigError, match="shard-00001.bin.*corrupt.*XXH3"):
        Dataset.open(str(broken))
    path.write_bytes(bytes(data[:-2]))
    with pytest.raises(ConfigError, match="shard-00001.bin.*bytes"):
        Dataset.open(str(broken))
    path.unlink()
    with pytest.raises(ConfigError, match="shard-00001.bin.*missing"):
        Dataset.open(str(broken))


def test_directory_without_index_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="index.json is missing.*autohet data prepare"):
        Dataset.open(str(tmp_path))


def test_order_is_a_seeded_permutation_of_seed_epoch_and_count_only():
    for num in (1, 2, 1000, 1025, 65_537):
        assert sorted(epoch_permutation(7, 0, num).tolist()) == list(range(num))
    order = epoch_permutation(7, 0, 1000)
    assert abs(np.corrcoef(np.arange(1000), order)[0, 1]) < 0.1                   # shuffled, not shifted
    assert epoch_permutation(7, 0, 1000).tolist() == order.tolist()
    assert epoch_permutation(7, 1, 1000).tolist() != order.tolist()
    assert epoch_permutation(8, 0, 1000).tolist() != order.tolist()
    big = 10**12                                                     # any size: a batch costs O(batch)
    assert len(set(sample_ids(3, 4096, big, seed=0).tolist())) == 4096


def test_any_per_pipeline_slicing_reassembles_the_same_samples(corpus):
    ds, batch_size = corpus["dataset"], 12
    for step in range(3):
        batch = ds.global_batch(step, batch_size, SEQ, seed=1)
        assert batch["sample_ids"].tolist() == ds.sample_ids(step, batch_size, SEQ, seed=1).tolist()
        for split in ([5, 7], [3, 3, 6], [12]):          # samples_of(k) of three plans
            offsets = np.cumsum([0] + split)
            pieces = [batch["sample_ids"][offsets[k]:offsets[k + 1]] for k in range(len(split))]
            assert np.concatenate(pieces).tolist() == batch["sample_ids"].tolist()
        windows = ds.windows(batch["sample_ids"].numpy(), SEQ)
        assert batch["input_ids"].tolist() == windows[:, :-1].tolist()
        assert batch["labels"].tolist() == windows[:, 1:].tolist()


def test_each_sample_exactly_once_per_epoch(corpus):
    ds, batch_size, seed = corpus["dataset"], 16, 3
    num = ds.num_samples(SEQ)
    seen = np.concatenate([ds.sample_ids(s, batch_size, SEQ, seed) for s in range(-(-num // batch_size))])
    assert sorted(seen[:num].tolist()) == list(range(num))          # epoch 0: every sample, once
    assert seen[num:].tolist() == epoch_permutation(seed, 1, num)[:len(seen) - num].tolist()
    first = ds.windows(np.array([0]), SEQ)[0]
    assert first.tolist() == ds.tokens(0, SEQ + 1).tolist()          # non-overlapping windows from the start


def test_data_state_resumes_and_refuses_other_data(corpus, tmp_path):
    ds = corpus["dataset"]
    state = ds.data_state(5, 16, SEQ, seed=2)
    assert state["samples_consumed"] == 80 and state["epoch"] == 0
    assert ds.check_state(state, seq_len=SEQ, global_batch=16, seed=2) == 5
    with pytest.raises(ConfigError, match="seq_len=32 differs"):
        ds.check_state(state, seq_len=32)
    resplit = tmp_path / "resplit"
    write_dataset(resplit, corpus["files"], corpus["tokenizer_json"], val_fraction=0.2)
    with pytest.raises(ConfigError, match="is dataset .* but the checkpoint trained on dataset"):
        Dataset.open(str(resplit)).check_state(state)
    other_tokenizer = train_byte_level_bpe((p.read_text() for p in corpus["files"][:10]), 512)
    retokenized = tmp_path / "retokenized"
    write_dataset(retokenized, corpus["files"], other_tokenizer)
    with pytest.raises(ConfigError, match="another tokenizer"):
        Dataset.open(str(retokenized)).check_state(state)


def test_validation_batches_are_the_held_out_tokens_in_order(corpus):
    ds = corpus["dataset"]
    first, again = ds.val_batches(2, 8, SEQ), ds.val_batches(2, 8, SEQ)
    assert all(a["input_ids"].equal(b["input_ids"]) for a, b in zip(first, again))
    train_end = ds.index.train_tokens
    assert first[0]["input_ids"][0].tolist() == ds.tokens(train_end, train_end + SEQ).tolist()
    assert first[1]["sample_ids"].tolist() == list(range(8, 16))
    with pytest.raises(ConfigError, match="validation samples"):
        ds.val_batches(10_000, 8, SEQ)


def test_corpus_smaller_than_a_global_batch_and_model_vocab_checks(corpus):
    ds = corpus["dataset"]
    check_corpus_size(ds, global_batch=16, seq_len=SEQ)
    with pytest.raises(ConfigError, match="fewer than one global batch of 100000"):
        check_corpus_size(ds, global_batch=100_000, seq_len=SEQ)
    with pytest.raises(ConfigError, match="fewer than one global batch"):
        ds.global_batch(0, 100_000, SEQ, seed=0)
    check_fits_model(ds.index, load_model("small-gpt"))                 # vocab 1024
    with pytest.raises(ConfigError, match="1024 ids, more than tiny-gpt's vocab_size=128"):
        check_fits_model(ds.index, load_model("tiny-gpt"))


def test_mlm_masks_15_percent_80_10_10_seeded_by_step(corpus):
    ds = corpus["dataset"]
    eos, mask = ds.index.eos_id, ds.index.mask_id
    batch = ds.global_batch(0, 64, 256, seed=0)
    masked = mask_tokens(batch, mask_id=mask, vocab_size=VOCAB, seed=0, step=0, special_ids=(eos,))
    chosen = masked["labels"] != IGNORE_INDEX
    eligible = (batch["input_ids"] != eos).sum(dim=1)
    assert chosen.sum(dim=1).tolist() == [max(1, round(0.15 * int(n))) for n in eligible]
    assert not chosen[batch["input_ids"] == eos].any()
    assert masked["labels"][chosen].tolist() == batch["input_ids"][chosen].tolist()
    became_mask = (masked["input_ids"][chosen] == mask).float().mean().item()
    kept = (masked["input_ids"][chosen] == batch["input_ids"][chosen]).float().mean().item()
    assert abs(became_mask - 0.8) < 0.03 and abs(kept - 0.1) < 0.03
    assert masked["input_ids"][~chosen].tolist() == batch["input_ids"][~chosen].tolist()
    again = mask_tokens(batch, mask_id=mask, vocab_size=VOCAB, seed=0, step=0, special_ids=(eos,))
    later = mask_tokens(batch, mask_id=mask, vocab_size=VOCAB, seed=0, step=1, special_ids=(eos,))
    assert again["input_ids"].equal(masked["input_ids"]) and not later["labels"].equal(masked["labels"])


def test_prefetcher_prepares_the_next_batch_while_a_step_runs(corpus):
    ds = corpus["dataset"]

    def slow_batch(step):
        time.sleep(0.05)
        return ds.global_batch(step, 8, SEQ, seed=0)

    with Prefetcher(slow_batch) as prefetch:
        for step in range(4):
            batch = prefetch.get(step)
            assert batch["input_ids"].equal(ds.global_batch(step, 8, SEQ, seed=0)["input_ids"])
            time.sleep(0.1)                                            # the step runs
        first_wait = prefetch.waited_s
        assert prefetch.stats()["misses"] == 1 and first_wait < 0.05 * 2.5      # unprefetched: 4 x 0.05
        rewound = prefetch.get(1)                                      # a re-plan resumes at an older step
        assert rewound["sample_ids"].tolist() == ds.sample_ids(1, 8, SEQ, seed=0).tolist()
        assert prefetch.stats()["misses"] == 2


def test_inputs_that_are_not_text_are_refused():
    with pytest.raises(ConfigError, match="'x.bin' is not text: .*NUL byte at offset 3"):
        documents_of("x.bin", b"abc\0def")
    with pytest.raises(ConfigError, match="'x.txt' is not UTF-8 text: invalid byte at offset 1"):
        documents_of("x.txt", b"a\xff")
    assert documents_of("a.jsonl", b'{"text": "one"}\n\n{"text": "two", "n": 1}\n') == ["one", "two"]
    with pytest.raises(ConfigError, match="'a.jsonl' line 2 has no string field 'body'"):
        documents_of("a.jsonl", b'{"body": "x"}\n{"text": "y"}\n', text_field="body")


def test_parquet_text_column():
    import pyarrow as pa
    import pyarrow.parquet as pq
    sink = io.BytesIO()
    pq.write_table(pa.table({"text": ["alpha", None, "beta"], "n": [1, 2, 3]}), sink)
    assert documents_of("t.parquet", sink.getvalue()) == ["alpha", "beta"]
    with pytest.raises(ConfigError, match="no column 'content'; its columns: text, n"):
        documents_of("t.parquet", sink.getvalue(), text_field="content")
    with pytest.raises(ConfigError, match="not a Parquet file"):
        documents_of("t.parquet", b"PAR1 nonsense")
