"""The on-disk format of a prepared dataset: token shards and the index that describes them.

A dataset directory holds `index.json`, `tokenizer.json` (the tokenizer that made it) and shards
`shard-00000.bin`, ... Each shard is the raw little-endian token ids of its documents, each document followed
by the EOS id; uint16 when the vocabulary has fewer than 65536 ids, else uint32. The shards in index order
form one token stream. The split is a token range of that stream: tokens [0, train_tokens) train, tokens
[train_tokens, num_tokens) are the validation split (the end of the corpus).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import numpy as np
import xxhash

from autohet_ray import ConfigError
from autohet_ray.safe_names import plain_name
from autohet_ray.config_io import dataclass_from_dict

INDEX_FILE = "index.json"
TOKENIZER_FILE = "tokenizer.json"
FORMAT = "autohet-tokens"
VERSION = 1
UINT16_VOCAB_LIMIT = 1 << 16
HASH_BLOCK_BYTES = 64 << 20


def token_dtype(vocab_size: int) -> np.dtype:
    """The narrowest id type holding every id of a vocabulary of `vocab_size`."""
    if vocab_size < 1:
        raise ConfigError(f"vocab_size={vocab_size} must be >= 1")
    return np.dtype("<u2") if vocab_size < UINT16_VOCAB_LIMIT else np.dtype("<u4")


def shard_name(number: int) -> str:
    return f"shard-{number:05d}.bin"


def hash_bytes(data) -> str:
    """XXH3-64 of a bytes-like object (a memmap is hashed in blocks, never copied whole)."""
    view = memoryview(data).cast("B")
    hasher = xxhash.xxh3_64()
    for start in range(0, len(view), HASH_BLOCK_BYTES):
        hasher.update(view[start:start + HASH_BLOCK_BYTES])
    return hasher.hexdigest()


def tokenizer_fingerprint(tokenizer_json: str) -> str:
    """The fingerprint of a tokenizer: XXH3-64 of its tokenizer.json text."""
    return "xxh3-64:" + xxhash.xxh3_64(tokenizer_json.encode("utf-8")).hexdigest()


@dataclass(frozen=True, kw_only=True)
class ShardInfo:
    file: str
    """File name inside the dataset directory."""
    num_tokens: int
    """Token ids in the shard (EOS separators included)."""
    num_documents: int
    xxh3_64: str
    """Hex XXH3-64 of the shard's bytes."""


@dataclass(frozen=True, kw_only=True)
class DataIndex:
    dtype: str
    """"uint16" or "uint32" (little-endian)."""
    vocab_size: int
    """Ids of the tokenizer, added tokens included."""
    eos_id: int
    """Separator appended after every document."""
    mask_id: int | None
    """The tokenizer's mask token (masked-language modelling), or None when it has none."""
    tokenizer_fingerprint: str
    shards: tuple[ShardInfo, ...]
    train_tokens: int
    """Tokens [0, train_tokens) of the stream train; the rest is the validation split."""

    def __post_init__(self):
        assert self.dtype == token_dtype(self.vocab_size).name, (self.dtype, self.vocab_size)
        assert 0 <= self.train_tokens <= self.num_tokens, (self.train_tokens, self.num_tokens)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.shards)

    @property
    def num_documents(self) -> int:
        return sum(s.num_documents for s in self.shards)

    @property
    def validation_tokens(self) -> int:
        return self.num_tokens - self.train_tokens

    @property
    def fingerprint(self) -> str:
        """Names the dataset: its tokens (shard hashes), split and tokenizer, not where it is stored."""
        identity = [self.dtype, self.vocab_size, self.eos_id, self.tokenizer_fingerprint, self.train_tokens,
                    [(s.num_tokens, s.xxh3_64) for s in self.shards]]
        return "xxh3-64:" + xxhash.xxh3_64(json.dumps(identity).encode()).hexdigest()

    def to_dict(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "dtype": self.dtype, "vocab_size": self.vocab_size,
                "eos_id": self.eos_id, "mask_id": self.mask_id,
                "tokenizer": {"file": TOKENIZER_FILE, "fingerprint": self.tokenizer_fingerprint},
                "num_tokens": self.num_tokens, "num_documents": self.num_documents,
                "split": {"train_tokens": self.train_tokens, "validation_tokens": self.validation_tokens,
                          "rule": "token range: [0, train_tokens) train, the rest of the stream validation"},
                "fingerprint": self.fingerprint, "shards": [asdict(s) for s in self.shards]}


def index_from_dict(raw: dict, where: str) -> DataIndex:
    """The DataIndex of a parsed index.json; ConfigError naming `where` when it is not one."""
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise ConfigError(f"{where} is not an autohet dataset index (format must be {FORMAT!r})")
    if raw.get("version") != VERSION:
        raise ConfigError(f"{where}: index version {raw.get('version')!r}; this autohet reads version {VERSION}")
    try:
        shards = tuple(dataclass_from_dict(ShardInfo, s, f"{where}: shards[{k}]") for k, s in enumerate(raw["shards"]))
        index = DataIndex(dtype=raw["dtype"], vocab_size=raw["vocab_size"], eos_id=raw["eos_id"],
                          mask_id=raw["mask_id"], tokenizer_fingerprint=raw["tokenizer"]["fingerprint"],
                          shards=shards, train_tokens=raw["split"]["train_tokens"])
    except (KeyError, TypeError, AssertionError) as err:
        raise ConfigError(f"{where} is malformed ({type(err).__name__}: {err})") from None
    for number, shard in enumerate(shards):          # each becomes a path in the dataset's directory
        plain_name(shard.file, where=where, field=f"shards[{number}].file")
    if raw.get("fingerprint") != index.fingerprint:
        raise ConfigError(f"{where}: recorded fingerprint {raw.get('fingerprint')!r} does not match its content "
                          f"({index.fingerprint}); the index was edited or damaged")
    return index


def index_json(index: DataIndex) -> str:
    return json.dumps(index.to_dict(), indent=1) + "\n"


def check_val_fraction(val_fraction: float) -> None:
    if not 0.0 <= val_fraction < 1.0:
        raise ConfigError(f"--val-fraction {val_fraction} must lie in [0, 1)")


def split_point(num_tokens: int, val_fraction: float) -> int:
    """train_tokens for a stream of `num_tokens` with `val_fraction` of it held out at the end."""
    check_val_fraction(val_fraction)
    return num_tokens - int(round(num_tokens * val_fraction))
