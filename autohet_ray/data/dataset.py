"""A prepared dataset, read through memory maps: training samples in the plan-independent order, validation
batches, and the data position that every committed step records.

Sample j of a split is the window of seq_len + 1 tokens [j*(seq_len+1), (j+1)*(seq_len+1)) of that split's
token stream (non-overlapping; a window may cross documents and shards, documents are separated by EOS).
input_ids are its first seq_len tokens and labels its last seq_len (next-token prediction).
"""
from __future__ import annotations

import os

import numpy as np

from autohet_ray import ConfigError
from autohet_ray.config_io import parse_json, read_text_file
from autohet_ray.data.index import INDEX_FILE, TOKENIZER_FILE, DataIndex, hash_bytes, index_from_dict
from autohet_ray.data.order import sample_ids

STATE_VERSION = 1


class Dataset:
    def __init__(self, directory: str, index: DataIndex, shards: list[np.ndarray]):
        assert len(shards) == len(index.shards)
        self.directory, self.index = directory, index
        self._shards = shards
        self._starts = np.cumsum([0] + [len(s) for s in shards])    # stream offset of each shard, and the end

    @classmethod
    def open(cls, directory: str, *, verify: bool = True) -> "Dataset":
        """Map the shards of a prepared dataset; with `verify`, check every shard's XXH3-64 first."""
        index = read_index(directory)
        shards = [_map_shard(directory, info.file, info.num_tokens, index.dtype) for info in index.shards]
        if verify:
            for info, tokens in zip(index.shards, shards):
                actual = hash_bytes(tokens)
                if actual != info.xxh3_64:
                    raise ConfigError(f"shard {os.path.join(directory, info.file)!r} is corrupt: its XXH3-64 is "
                                      f"{actual}, the index records {info.xxh3_64}; prepare the dataset again")
        return cls(directory, index, shards)

    @property
    def fingerprint(self) -> str:
        return self.index.fingerprint

    @property
    def tokenizer_path(self) -> str:
        return os.path.join(self.directory, TOKENIZER_FILE)

    # token stream -------------------------------------------------------------------------------------------
    def tokens(self, start: int, stop: int) -> np.ndarray:
        """Tokens [start, stop) of the whole stream (train then validation), as int64."""
        assert 0 <= start <= stop <= self.index.num_tokens, (start, stop, self.index.num_tokens)
        first = int(np.searchsorted(self._starts, start, side="right")) - 1
        pieces, position = [], start
        for k in range(max(first, 0), len(self._shards)):
            if position >= stop:
                break
            lo = position - int(self._starts[k])
            hi = min(stop, int(self._starts[k + 1])) - int(self._starts[k])
            pieces.append(self._shards[k][lo:hi])
            position += hi - lo
        return np.concatenate(pieces).astype(np.int64) if pieces else np.empty(0, dtype=np.int64)

    def num_samples(self, seq_len: int, split: str = "train") -> int:
        """Windows of seq_len + 1 tokens in `split` ("train" or "validation")."""
        if seq_len < 1:
            raise ConfigError(f"seq_len={seq_len} must be >= 1")
        return self._split_range(split)[1] // (seq_len + 1)

    def _split_range(self, split: str) -> tuple[int, int]:
        """(first stream token, number of tokens) of a split."""
        if split == "train":
            return 0, self.index.train_tokens
        if split == "validation":
            return self.index.train_tokens, self.index.validation_tokens
        raise ConfigError(f"split {split!r}; valid: train, validation")

    def windows(self, ids: np.ndarray, seq_len: int, split: str = "train") -> np.ndarray:
        """The samples `ids` of `split` as int64 [len(ids), seq_len + 1]."""
        first, _ = self._split_range(split)
        width = seq_len + 1
        assert ids.size == 0 or (ids.min() >= 0 and ids.max() < self.num_samples(seq_len, split)), ids
        rows = [self.tokens(first + int(j) * width, first + (int(j) + 1) * width) for j in ids]
        return np.stack(rows) if rows else np.empty((0, width), dtype=np.int64)

    # training and validation batches ------------------------------------------------------------------------
    def sample_ids(self, step: int, global_batch: int, seq_len: int, seed: int) -> np.ndarray:
        """The training samples of global batch `step`: positions [step*B, (step+1)*B) of the epoch order."""
        return sample_ids(step, global_batch, self._train_samples(seq_len, global_batch), seed)

    def global_batch(self, step: int, global_batch: int, seq_len: int, seed: int) -> dict:
        """{"input_ids", "labels": LongTensor[B, seq_len], "sample_ids": LongTensor[B]} of global batch
        `step`; each pipeline takes its contiguous rows, as of a synthetic batch."""
        ids = self.sample_ids(step, global_batch, seq_len, seed)
        return _as_batch(self.windows(ids, seq_len), ids)

    def val_batches(self, num_batches: int, global_batch: int, seq_len: int) -> list[dict]:
        """The first `num_batches` global batches of the validation split, in order (the same every call)."""
        available = self.num_samples(seq_len, "validation")
        if num_batches < 1 or num_batches * global_batch > available:
            raise ConfigError(f"--eval-batches {num_batches} x global batch {global_batch} needs "
                              f"{num_batches * global_batch} validation samples of {seq_len + 1} tokens; "
                              f"{self.directory!r} has {available} ({self.index.validation_tokens} validation "
                              "tokens): use fewer batches or prepare with a larger --val-fraction")
        batches = []
        for k in range(num_batches):
            ids = np.arange(k * global_batch, (k + 1) * global_batch, dtype=np.int64)
            batches.append(_as_batch(self.windows(ids, seq_len, "validation"), ids))
        return batches

    def _train_samples(self, seq_len: int, global_batch: int) -> int:
        check_corpus_size(self, global_batch=global_batch, seq_len=seq_len)
        return self.num_samples(seq_len)

    # data position ------------------------------------------------------------------------------------------
    def data_state(self, step: int, global_batch: int, seq_len: int, seed: int) -> dict:
        """The data position before global batch `step` is read (after steps 0..step-1): what a committed
        step records so that a resume or a re-plan reads exactly the next samples."""
        num = self._train_samples(seq_len, global_batch)
        consumed = step * global_batch
        return {"version": STATE_VERSION, "seed": seed, "epoch": consumed // num, "samples_consumed": consumed,
                "epoch_samples_consumed": consumed % num, "num_samples": num, "global_batch": global_batch,
                "seq_len": seq_len, "dataset_fingerprint": self.fingerprint,
                "tokenizer_fingerprint": self.index.tokenizer_fingerprint}

    def check_state(self, state: dict, *, seq_len: int | None = None, global_batch: int | None = None,
                    seed: int | None = None) -> int:
        """The step to continue at from a recorded data state; ConfigError when this dataset (or the given
        seq_len, global batch or seed) would read other samples than the run that recorded it."""
        if state.get("version") != STATE_VERSION:
            raise ConfigError(f"data state version {state.get('version')!r}; this autohet reads {STATE_VERSION}")
        if state["tokenizer_fingerprint"] != self.index.tokenizer_fingerprint:
            raise ConfigError(f"--data {self.directory!r} was tokenized by another tokenizer "
                              f"({self.index.tokenizer_fingerprint}) than the checkpoint's data "
                              f"({state['tokenizer_fingerprint']}); resume with the dataset the run trained on")
        if state["dataset_fingerprint"] != self.fingerprint:
            raise ConfigError(f"--data {self.directory!r} is dataset {self.fingerprint}, but the checkpoint "
                              f"trained on dataset {state['dataset_fingerprint']}; resume with that dataset")
        for name, value in (("seq_len", seq_len), ("global_batch", global_batch), ("seed", seed)):
            if value is not None and value != state[name]:
                raise ConfigError(f"{name}={value} differs from the checkpoint's {name}={state[name]}: the "
                                  "samples after it would not continue the run's order")
        assert state["samples_consumed"] % state["global_batch"] == 0, state
        return state["samples_consumed"] // state["global_batch"]


def check_corpus_size(dataset: Dataset, *, global_batch: int, seq_len: int) -> None:
    """ConfigError unless the training split holds at least one global batch of samples."""
    available = dataset.num_samples(seq_len)
    if global_batch < 1 or available < global_batch:
        raise ConfigError(f"--data {dataset.directory!r}: {dataset.index.train_tokens} training tokens make "
                          f"{available} samples of seq_len + 1 = {seq_len + 1} tokens, fewer than one global "
                          f"batch of {global_batch}; use a larger corpus, a smaller --global-batch or --seq-len")


def check_fits_model(index: DataIndex, model_spec) -> None:
    """ConfigError unless the dataset's token ids all fit the model's vocabulary (and a BERT model, trained
    by masked-language modelling, has a mask token)."""
    if index.vocab_size > model_spec.vocab_size:
        raise ConfigError(f"the dataset's tokenizer has {index.vocab_size} ids, more than {model_spec.name}'s "
                          f"vocab_size={model_spec.vocab_size}; use a model with vocab_size >= "
                          f"{index.vocab_size} or a smaller tokenizer")
    if model_spec.family == "bert" and index.mask_id is None:
        raise ConfigError(f"{model_spec.name} trains by masked-language modelling, but the dataset's tokenizer "
                          "has no mask token ([MASK], <mask> or <|mask|>)")


def read_index(directory: str) -> DataIndex:
    path = os.path.join(directory, INDEX_FILE)
    if not os.path.isfile(path):
        raise ConfigError(f"--data {directory!r} holds no prepared dataset ({INDEX_FILE} is missing); make one "
                          f"with `autohet data prepare --input ... --out {directory}`")
    return index_from_dict(parse_json(read_text_file(path, "dataset index"), repr(path)), path)


def _map_shard(directory: str, file: str, num_tokens: int, dtype: str) -> np.ndarray:
    path = os.path.join(directory, file)
    if not os.path.isfile(path):
        raise ConfigError(f"shard {path!r} named by the index is missing; prepare the dataset again")
    expected = num_tokens * np.dtype(dtype).itemsize
    if os.path.getsize(path) != expected:
        raise ConfigError(f"shard {path!r} is corrupt: it holds {os.path.getsize(path)} bytes, the index "
                          f"records {num_tokens} {dtype} tokens ({expected} bytes)")
    if num_tokens == 0:
        return np.empty(0, dtype=np.dtype(dtype).newbyteorder("<"))
    return np.memmap(path, dtype=np.dtype(dtype).newbyteorder("<"), mode="r", shape=(num_tokens,))


def _as_batch(windows: np.ndarray, ids: np.ndarray) -> dict:
    import torch  # lazy: torch; data/ imports without it
    tokens = torch.from_numpy(windows)
    return {"input_ids": tokens[:, :-1].contiguous(), "labels": tokens[:, 1:].contiguous(),
            "sample_ids": torch.from_numpy(ids.copy())}
