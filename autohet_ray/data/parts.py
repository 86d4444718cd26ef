"""The pure half of `autohet data prepare`: input files grouped into parts, and one part tokenized (no Ray;
orchestrate/data_prepare.py runs each part as a Ray task and writes the shards).

The files are grouped, in sorted order, into parts of about `shard_bytes` input bytes; each part becomes one
shard. The grouping depends on the files only, so any number of workers writes the same dataset."""
from __future__ import annotations

import functools
import glob
import os
from dataclasses import dataclass

from autohet_ray import ConfigError
from autohet_ray.data.documents import documents_of
from autohet_ray.data.index import token_dtype
from autohet_ray.data.tokenize import encode_documents, tokenizer_from_json, vocab_size_of


@dataclass(frozen=True)
class Source:
    name: str
    """Local path, or s3://bucket/key."""
    size: int


def list_local(pattern: str) -> list[Source]:
    """The files of a local --input: a file, a directory (recursively) or a glob."""
    if glob.has_magic(pattern):
        paths = glob.glob(pattern, recursive=True)
    elif os.path.isdir(pattern):
        paths = glob.glob(os.path.join(pattern, "**", "*"), recursive=True)
    elif os.path.exists(pattern):
        paths = [pattern]
    else:
        raise ConfigError(f"--input {pattern!r}: no such file or directory")
    return [Source(p, os.path.getsize(p)) for p in paths if os.path.isfile(p)]


def group_into_parts(sources: list[Source], shard_bytes: int) -> list[list[Source]]:
    """Consecutive sources, each group reaching `shard_bytes` input bytes (or holding the last files)."""
    parts, current, size = [], [], 0
    for source in sources:
        current.append(source)
        size += source.size
        if size >= shard_bytes:
            parts.append(current)
            current, size = [], 0
    return parts + ([current] if current else [])


@functools.lru_cache(maxsize=1)
def cached_tokenizer(tokenizer_json: str):
    """One tokenizer per worker process and dataset (a large vocabulary takes a while to load)."""
    return tokenizer_from_json(tokenizer_json)


def tokenize_files(files: list[tuple[str, bytes]], tokenizer_json: str, *, eos_id: int, dtype: str,
                   text_field: str) -> tuple:
    """(tokens, documents, input bytes) of one part, its files given as (name, bytes)."""
    tokenizer = cached_tokenizer(tokenizer_json)
    documents = [doc for name, data in files for doc in documents_of(name, data, text_field=text_field)]
    tokens = encode_documents(tokenizer, documents, eos_id=eos_id, dtype=token_dtype(vocab_size_of(tokenizer)))
    assert tokens.dtype.name == dtype
    return tokens, len(documents), sum(len(data) for _, data in files)
