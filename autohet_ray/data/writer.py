"""Writing a dataset: shards in stream order, then tokenizer.json, then index.json last, so that a
preparation stopped half-way leaves no index and is never mistaken for a dataset. Where the files go is the
caller's `put(name, data)`: a local directory here (`directory_put`), S3 in storage/datasets.py."""
from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable

import numpy as np

from autohet_ray import ConfigError
from autohet_ray.data.index import (INDEX_FILE, TOKENIZER_FILE, DataIndex, ShardInfo, hash_bytes, index_json,
                                    shard_name, split_point, token_dtype, tokenizer_fingerprint)

Put = Callable[[str, bytes], None]


class DatasetWriter:
    def __init__(self, put: Put, *, tokenizer_json: str, vocab_size: int, eos_id: int, mask_id: int | None):
        assert 0 <= eos_id < vocab_size and (mask_id is None or 0 <= mask_id < vocab_size), (eos_id, mask_id)
        self._put, self._tokenizer_json = put, tokenizer_json
        self.vocab_size, self.eos_id, self.mask_id = vocab_size, eos_id, mask_id
        self.dtype = token_dtype(vocab_size)
        self.shards: list[ShardInfo] = []

    def add_shard(self, tokens: np.ndarray, num_documents: int) -> ShardInfo:
        """Write the next shard of the stream (a non-empty array of this dataset's dtype)."""
        assert tokens.dtype == self.dtype and tokens.ndim == 1 and len(tokens) > 0, (tokens.dtype, tokens.shape)
        data = np.ascontiguousarray(tokens).tobytes()
        info = ShardInfo(file=shard_name(len(self.shards)), num_tokens=len(tokens), num_documents=num_documents,
                         xxh3_64=hash_bytes(data))
        self._put(info.file, data)
        self.shards.append(info)
        return info

    def finish(self, *, val_fraction: float) -> DataIndex:
        """Write tokenizer.json and the index (holding out `val_fraction` of the tokens at the end)."""
        if not self.shards:
            raise ConfigError("the inputs hold no text: every input file is empty")
        num_tokens = sum(s.num_tokens for s in self.shards)
        index = DataIndex(dtype=self.dtype.name, vocab_size=self.vocab_size, eos_id=self.eos_id,
                          mask_id=self.mask_id, tokenizer_fingerprint=tokenizer_fingerprint(self._tokenizer_json),
                          shards=tuple(self.shards), train_tokens=split_point(num_tokens, val_fraction))
        self._put(TOKENIZER_FILE, self._tokenizer_json.encode("utf-8"))
        self._put(INDEX_FILE, index_json(index).encode("utf-8"))
        return index


def directory_put(directory: str) -> Put:
    """A `put` writing into a local directory (each file written whole, then renamed into place)."""
    def put(name: str, data: bytes) -> None:
        path = os.path.join(directory, name)
        # a name of its own: two jobs filling one cache never write (or rename away) each other's file
        fd, partial = tempfile.mkstemp(dir=os.path.dirname(path), prefix=f".{os.path.basename(path)}.",
                                       suffix=".partial")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                os.fchmod(f.fileno(), 0o644)           # mkstemp's 0600 would hide the dataset from others
            os.replace(partial, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(partial)
            raise
    return put


def check_output_directory(directory: str) -> None:
    """ConfigError unless `directory` can take a new dataset (created when missing)."""
    if os.path.exists(os.path.join(directory, INDEX_FILE)):
        raise ConfigError(f"--out {directory!r} already holds a prepared dataset ({INDEX_FILE}); remove it or "
                          "choose another --out")
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"--out {directory!r} cannot be created: {err.strerror}") from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ConfigError(f"--out {directory!r} is not writable")
