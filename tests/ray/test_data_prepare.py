"""`autohet data prepare` on a local Ray (2 CPUs): 30 files of the Python standard library's own source,
tokenized by Ray tasks, in and out of a directory and a real S3 API server (moto); bad input exits 2 with one
line naming it."""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import sysconfig
from dataclasses import replace

import pytest
import ray

from autohet_ray import ConfigError, cli
from autohet_ray.data import Dataset
from autohet_ray.data.tokenize import special_ids, tokenizer_from_json
from autohet_ray.checkpoint.node_store import STORE_ENV
from autohet_ray.model import PRESETS
from autohet_ray.data.training import TrainingData
from autohet_ray.storage.dataset_cache import dataset_cache_dir, local_dataset
from autohet_ray.storage.datasets import download_dataset

from s3_server import CREDENTIALS, client, moto_endpoint, new_bucket  # noqa: E402

pytestmark = pytest.mark.timeout(180)
ENV = {"AWS_ACCESS_KEY_ID": CREDENTIALS["aws_access_key_id"],
       "AWS_SECRET_ACCESS_KEY": CREDENTIALS["aws_secret_access_key"],
       "AWS_DEFAULT_REGION": CREDENTIALS["region_name"], "TOKENIZERS_PARALLELISM": "false"}


@pytest.fixture(scope="module")
def local_ray():
    saved = {k: os.environ.get(k) for k in ENV}
    os.environ.update(ENV)                      # before the raylet starts: the tasks read S3 with these
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    yield
    ray.shutdown()
    for k, v in saved.items():
        os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in sorted(root.glob("*.py")) if 1_000 < p.stat().st_size < 60_000][:30]
    folder = tmp_path_factory.mktemp("corpus")
    for p in files:
        shutil.copy(p, folder / p.name)
    return folder


def prepare(*args: str, capsys=None) -> tuple[int, str, str]:
    if capsys:
        capsys.readouterr()
    rc = cli.main(["data", "prepare", *args])
    out, err = capsys.readouterr() if capsys else ("", "")
    return rc, out, err


@pytest.fixture(scope="module")
def trained(local_ray, corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("trained") / "ds"
    rc = cli.main(["data", "prepare", "--input", str(corpus), "--train-tokenizer", "1024", "--out", str(out),
                   "--val-fraction", "0.1", "--workers", "2", "--shard-mb", "0.1", "--json"])
    assert rc == 0
    return out


def test_prepare_on_ray_is_the_tokenizers_librarys_encoding(trained, corpus):
    ds = Dataset.open(str(trained))
    tok = tokenizer_from_json((trained / "tokenizer.json").read_text())
    eos, mask = special_ids(tok)
    expected = []
    for p in sorted(corpus.iterdir()):
        expected += tok.encode(p.read_bytes().decode("utf-8"), add_special_tokens=False).ids + [eos]
    assert ds.tokens(0, ds.index.num_tokens).tolist() == expected
    assert ds.index.vocab_size == 1024 and ds.index.dtype == "uint16" and mask is not None
    assert len(ds.index.shards) >= 4 and ds.index.num_documents == 30
    assert ds.index.validation_tokens == round(0.1 * ds.index.num_tokens)


def test_any_worker_count_writes_the_same_dataset_and_shows_progress(trained, corpus, tmp_path, capsys):
    fingerprint = Dataset.open(str(trained)).fingerprint
    for workers in ("1", "2"):
        out = tmp_path / f"w{workers}"
        rc, stdout, stderr = prepare("--input", str(corpus), "--tokenizer", str(trained), "--out", str(out),
                                     "--val-fraction", "0.1", "--workers", workers, "--shard-mb", "0.1", "--json",
                                     capsys=capsys)
        assert rc == 0, stderr
        assert Dataset.open(str(out)).fingerprint == fingerprint
        assert json.loads(stdout.splitlines()[-1])["workers"] == int(workers)
        assert "MB/s" in stderr and "k tokens/s" in stderr


def test_s3_input_and_output(trained, corpus, tmp_path, capsys, monkeypatch):
    with moto_endpoint() as endpoint:
        bucket, s3 = new_bucket(endpoint), client(endpoint)
        for p in corpus.iterdir():
            s3.put_object(Bucket=bucket, Key=f"corpus/{p.name}", Body=p.read_bytes())
        s3.put_object(Bucket=bucket, Key="corpus/notes.md", Body=b"not matched by the glob")
        rc, _, stderr = prepare("--input", f"s3://{bucket}/corpus/*.py", "--tokenizer", str(trained),
                                "--out", f"s3://{bucket}/datasets/one", "--val-fraction", "0.1", "--shard-mb", "0.1",
                                "--endpoint-url", endpoint, capsys=capsys)
        assert rc == 0, stderr
        local = download_dataset(f"s3://{bucket}/datasets/one", str(tmp_path / "cache"), endpoint_url=endpoint)
        shard = pathlib.Path(local) / "shard-00001.bin"
        shard.write_bytes(b"\0" * shard.stat().st_size)                 # a damaged cached copy is fetched again
        download_dataset(f"s3://{bucket}/datasets/one", local, endpoint_url=endpoint)
        with pytest.raises(ConfigError, match="holds no prepared dataset"):
            download_dataset(f"s3://{bucket}/corpus", str(tmp_path / "none"), endpoint_url=endpoint)
        _trains_from_the_node_store_cache(f"s3://{bucket}/datasets/one", endpoint, s3, bucket, tmp_path,
                                          monkeypatch)
    assert Dataset.open(str(local)).fingerprint == Dataset.open(str(trained)).fingerprint


def _trains_from_the_node_store_cache(url, endpoint, s3, bucket, tmp_path, monkeypatch):
    """A job's s3:// dataset lands in the node store's cache; a later job on the node fetches no shard again
    (here the shards are gone from S3, and the second job still trains on the same batches)."""
    monkeypatch.setenv(STORE_ENV, str(tmp_path / "store"))
    model = replace(PRESETS["tiny-gpt"], vocab_size=1024)
    first = TrainingData(data=local_dataset(url, endpoint), model=model, global_batch=2, seq_len=16, seed=0)
    cache = pathlib.Path(dataset_cache_dir(url, str(tmp_path / "store")))
    assert pathlib.Path(first.dataset.directory) == cache and (cache / "shard-00001.bin").is_file()
    batch = first.batch(0)
    first.close()
    for obj in s3.list_objects_v2(Bucket=bucket, Prefix="datasets/one/shard-")["Contents"]:
        s3.delete_object(Bucket=bucket, Key=obj["Key"])
    again = TrainingData(data=local_dataset(url, endpoint), model=model, global_batch=2, seq_len=16, seed=0)
    assert all((again.batch(0)[k] == batch[k]).all() for k in batch if hasattr(batch[k], "all"))
    again.close()


def test_bad_input_gets_one_line_and_exit_2(trained, corpus, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "a.txt").write_text("")
    (empty / "b.txt").write_text("  \n")
    binary = tmp_path / "binary"
    binary.mkdir()
    (binary / "ok.py").write_text("print('hello')\n")
    (binary / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR")
    no_tokenizer = tmp_path / "no-tokenizer"
    no_tokenizer.mkdir()
    tok = ["--tokenizer", str(trained)]
    cases = [
        (["--input", str(tmp_path / "nowhere"), *tok], "nowhere': no such file or directory"),
        (["--input", str(corpus / "*.rst"), *tok], "*.rst' matches no files"),
        (["--input", str(empty), *tok], "the inputs hold no text"),
        (["--input", str(binary), *tok], "image.png' is not text"),
        (["--input", str(corpus), "--tokenizer", str(no_tokenizer)], "no-tokenizer': no tokenizer.json"),
        (["--input", str(corpus)], "exactly one of --tokenizer DIR or --train-tokenizer VOCAB"),
        (["--input", str(corpus), "--train-tokenizer", "100"], "needs at least 258 ids"),
        (["--input", str(corpus), "--val-fraction", "1.5", *tok], "--val-fraction 1.5 must lie in [0, 1)"),
    ]
    for args, message in cases:
        out = tmp_path / f"out-{len(os.listdir(tmp_path))}"
        rc, _, stderr = prepare(*args, "--out", str(out), capsys=capsys)
        assert rc == 2, (args, stderr)
        errors = [line for line in stderr.splitlines() if line.startswith("autohet data: error:")]
        assert len(errors) == 1 and message in errors[0], (args, stderr)
    rc, _, stderr = prepare("--input", str(corpus), *tok, "--out", str(trained), capsys=capsys)
    assert rc == 2 and "already holds a prepared dataset" in stderr


def test_data_check_names_a_corrupt_shard(trained, tmp_path, capsys):
    copy = tmp_path / "copy"
    shutil.copytree(trained, copy)
    assert cli.main(["data", "check", str(copy)]) == 0
    assert "every shard's hash matches" in capsys.readouterr().out
    shard = copy / "shard-00002.bin"
    data = bytearray(shard.read_bytes())
    data[0] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert cli.main(["data", "check", str(copy)]) == 2
    err = capsys.readouterr().err
    assert "shard-00002.bin" in err and "is corrupt" in err
