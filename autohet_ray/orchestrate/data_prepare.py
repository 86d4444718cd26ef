"""`autohet data prepare` on Ray: tokenize a corpus in parallel into a dataset (autohet_ray/data/).

The input files are grouped, in sorted order, into parts of about `shard_bytes` input bytes; each part is one
Ray task (one CPU, the tokenizer kept on one thread) and becomes one shard. The grouping depends on the files
only, so any number of workers writes the same dataset. The driver keeps `workers` tasks in flight, ships
local files' bytes to them (the nodes need not share a file system; S3 inputs are read by the tasks), writes
the shards in order as they arrive, and the index last.
"""
from __future__ import annotations

import contextlib
import fnmatch
import functools
import glob
import json
import os
import sys
import time
from dataclasses import dataclass

import ray

from autohet_ray import ConfigError
from autohet_ray.data.documents import documents_of
from autohet_ray.data.index import INDEX_FILE, check_val_fraction, token_dtype
from autohet_ray.data.tokenize import (encode_documents, read_tokenizer_json, special_ids, tokenizer_from_json,
                                       train_byte_level_bpe, vocab_size_of)
from autohet_ray.data.writer import DatasetWriter, check_output_directory, directory_put

DEFAULT_SHARD_BYTES = 16 << 20
PROGRESS_EVERY_S = 2.0


@dataclass(frozen=True)
class Source:
    name: str
    """Local path, or s3://bucket/key."""
    size: int


def list_inputs(patterns: list[str], *, endpoint_url: str | None = None) -> list[Source]:
    """The files of every --input (a file, a directory (recursively), a glob, or s3://bucket/prefix-or-glob),
    sorted by name; ConfigError for one that names nothing."""
    sources: dict[str, Source] = {}
    for pattern in patterns:
        found = _list_s3(pattern, endpoint_url) if pattern.startswith("s3://") else _list_local(pattern)
        if not found:
            raise ConfigError(f"--input {pattern!r} matches no files")
        sources.update((s.name, s) for s in found)
    return [sources[name] for name in sorted(sources)]


def _list_local(pattern: str) -> list[Source]:
    if glob.has_magic(pattern):
        paths = glob.glob(pattern, recursive=True)
    elif os.path.isdir(pattern):
        paths = glob.glob(os.path.join(pattern, "**", "*"), recursive=True)
    elif os.path.exists(pattern):
        paths = [pattern]
    else:
        raise ConfigError(f"--input {pattern!r}: no such file or directory")
    return [Source(p, os.path.getsize(p)) for p in paths if os.path.isfile(p)]


@functools.lru_cache(maxsize=4)
def _s3_client(endpoint_url: str | None):
    """A boto3 client (thread-safe, so one per process and endpoint)."""
    from autohet_ray.checkpoint.tiers.s3 import S3Config, make_client
    return make_client(S3Config(bucket="any", endpoint_url=endpoint_url))


def _split_s3(url: str) -> tuple[str, str]:
    bucket, _, key = url[len("s3://"):].partition("/")
    if not bucket:
        raise ConfigError(f"{url!r} names no bucket; use s3://bucket/prefix")
    return bucket, key


def _list_s3(url: str, endpoint_url: str | None) -> list[Source]:
    from autohet_ray.checkpoint.tiers.s3 import S3Config, check_bucket
    bucket, key = _split_s3(url)
    check_bucket(S3Config(bucket=bucket, endpoint_url=endpoint_url))
    magic = [i for i, ch in enumerate(key) if ch in "*?["]
    prefix = key[:magic[0]] if magic else key
    pages = _s3_client(endpoint_url).get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    objects = [o for page in pages for o in page.get("Contents", []) if not o["Key"].endswith("/")]
    return [Source(f"s3://{bucket}/{o['Key']}", o["Size"]) for o in objects
            if not magic or fnmatch.fnmatchcase(o["Key"], key)]


def read_source(name: str, endpoint_url: str | None = None) -> bytes:
    if name.startswith("s3://"):
        bucket, key = _split_s3(name)
        return _s3_client(endpoint_url).get_object(Bucket=bucket, Key=key)["Body"].read()
    with open(name, "rb") as f:
        return f.read()


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


@ray.remote(num_cpus=1)
def tokenize_part(files: list[tuple[str, bytes | None]], tokenizer_json: str, *, eos_id: int, dtype: str,
                  text_field: str, endpoint_url: str | None) -> tuple:
    """(tokens, documents, input bytes) of one part; a file given without bytes is read here (S3)."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"       # one task, one core
    os.environ["RAYON_NUM_THREADS"] = "1"
    tokenizer = _cached_tokenizer(tokenizer_json)
    documents, num_bytes = [], 0
    for name, data in files:
        data = data if data is not None else read_source(name, endpoint_url)
        num_bytes += len(data)
        documents += documents_of(name, data, text_field=text_field)
    tokens = encode_documents(tokenizer, documents, eos_id=eos_id, dtype=token_dtype(vocab_size_of(tokenizer)))
    assert tokens.dtype.name == dtype
    return tokens, len(documents), num_bytes


@functools.lru_cache(maxsize=1)
def _cached_tokenizer(tokenizer_json: str):
    """One tokenizer per worker process and dataset (a large vocabulary takes a while to load)."""
    return tokenizer_from_json(tokenizer_json)


def _output(out: str, endpoint_url: str | None):
    """The `put` of --out (a directory, or s3://bucket/prefix), after checking it can take a new dataset."""
    if not out.startswith("s3://"):
        check_output_directory(out)
        return directory_put(out)
    from autohet_ray.checkpoint.tiers.s3 import S3Config, check_bucket
    bucket, prefix = _split_s3(out)
    prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"
    check_bucket(S3Config(bucket=bucket, endpoint_url=endpoint_url))
    client = _s3_client(endpoint_url)
    if client.list_objects_v2(Bucket=bucket, Prefix=prefix + INDEX_FILE).get("KeyCount", 0):
        raise ConfigError(f"--out {out!r} already holds a prepared dataset ({INDEX_FILE}); choose another --out")
    return lambda name, data: client.put_object(Bucket=bucket, Key=prefix + name, Body=data)


def download_dataset(url: str, directory: str, *, endpoint_url: str | None = None) -> str:
    """Copy the dataset at s3://bucket/prefix into `directory` (a cache: files already there whose hash the
    index records are kept), the index last; returns `directory`, ready for `Dataset.open`."""
    from botocore.exceptions import ClientError
    from autohet_ray.data.index import TOKENIZER_FILE, hash_bytes, index_from_dict
    bucket, prefix = _split_s3(url)
    prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"
    try:
        raw = read_source(f"s3://{bucket}/{prefix}{INDEX_FILE}", endpoint_url)
    except ClientError as err:
        raise ConfigError(f"--data {url!r} holds no prepared dataset ({INDEX_FILE}: {err})") from None
    index = index_from_dict(json.loads(raw), f"{url}/{INDEX_FILE}")
    os.makedirs(directory, exist_ok=True)
    put = directory_put(directory)
    for shard in index.shards:
        local = os.path.join(directory, shard.file)
        if os.path.isfile(local) and hash_bytes(read_source(local)) == shard.xxh3_64:
            continue
        put(shard.file, read_source(f"s3://{bucket}/{prefix}{shard.file}", endpoint_url))
    put(TOKENIZER_FILE, read_source(f"s3://{bucket}/{prefix}{TOKENIZER_FILE}", endpoint_url))
    put(INDEX_FILE, raw)
    return directory


def _all_documents(sources: list[Source], text_field: str, endpoint_url: str | None):
    for source in sources:
        yield from documents_of(source.name, read_source(source.name, endpoint_url), text_field=text_field)


@contextlib.contextmanager
def ray_for_prepare(address: str | None, workers: int | None):
    """Ray as the caller has it, the cluster at `address` (or RAY_ADDRESS), or a local Ray of `workers` CPUs."""
    if ray.is_initialized():
        yield
        return
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address)
    else:                               # "local": a new Ray even where another runs on this machine
        ray.init(address="local", num_cpus=workers or os.cpu_count(), include_dashboard=False)
    try:
        yield
    finally:
        ray.shutdown()


def prepare_dataset(inputs: list[str], out: str, *, tokenizer: str | None = None, train_vocab: int | None = None,
                    val_fraction: float = 0.0, workers: int | None = None, text_field: str = "text",
                    eos_token: str | None = None, shard_bytes: int = DEFAULT_SHARD_BYTES,
                    endpoint_url: str | None = None, progress=None) -> dict:
    """Tokenize `inputs` on the connected Ray cluster into the dataset `out`. Its index and figures."""
    assert ray.is_initialized(), "connect to Ray first (ray_for_prepare)"
    progress = progress or sys.stderr
    if workers is not None and workers < 1:
        raise ConfigError(f"--workers {workers} must be >= 1")
    check_val_fraction(val_fraction)
    if (tokenizer is None) == (train_vocab is None):
        raise ConfigError("data prepare needs exactly one of --tokenizer DIR or --train-tokenizer VOCAB")
    given = read_tokenizer_json(tokenizer) if tokenizer is not None else None
    workers = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
    sources = list_inputs(inputs, endpoint_url=endpoint_url)
    put = _output(out, endpoint_url)
    started = time.perf_counter()
    text = given or train_byte_level_bpe(_all_documents(sources, text_field, endpoint_url), train_vocab)
    tok = tokenizer_from_json(text)
    eos_id, mask_id = special_ids(tok, eos_token=eos_token)
    writer = DatasetWriter(put, tokenizer_json=text, vocab_size=vocab_size_of(tok), eos_id=eos_id, mask_id=mask_id)
    tokenized = time.perf_counter()
    totals = _run_parts(group_into_parts(sources, shard_bytes), ray.put(text), writer, workers=workers,
                        text_field=text_field, endpoint_url=endpoint_url, progress=progress)
    index = writer.finish(val_fraction=val_fraction)
    done = time.perf_counter()
    figures = {"files": len(sources), "shards": len(index.shards), "documents": index.num_documents,
               "tokens": index.num_tokens, "bytes": totals["bytes"], "workers": workers,
               "tokenizer_s": tokenized - started, "tokenize_s": done - tokenized, "fingerprint": index.fingerprint}
    print(f"data prepare: {figures['bytes'] / 1e6:.1f} MB -> {index.num_tokens} tokens in {len(index.shards)} "
          f"shards, {index.train_tokens} train / {index.validation_tokens} validation, {done - tokenized:.1f} s "
          f"on {workers} worker(s) -> {out}", file=progress, flush=True)
    return {"index": index.to_dict(), **figures}


def _run_parts(parts, tokenizer_ref, writer: DatasetWriter, *, workers: int, text_field: str,
               endpoint_url: str | None, progress) -> dict:
    """Run the parts' tasks, `workers` at a time, writing their shards in order. Input bytes and tokens."""
    total_bytes = sum(s.size for part in parts for s in part)
    pending, results, submitted, written = {}, {}, 0, 0
    counted = {"bytes": 0, "tokens": 0}

    def submit_more():
        nonlocal submitted
        while submitted < len(parts) and len(pending) < workers:
            files = [(s.name, None if s.name.startswith("s3://") else read_source(s.name)) for s in parts[submitted]]
            ref = tokenize_part.remote(files, tokenizer_ref, eos_id=writer.eos_id, dtype=writer.dtype.name,
                                       text_field=text_field, endpoint_url=endpoint_url)
            pending[ref] = submitted
            submitted += 1

    started = last_report = time.perf_counter()
    # on an error the tasks still running are left to finish and dropped, not ray.cancel()ed: cancelling a task
    # as it completes crashed this driver in Ray 2.60 ("Tried to complete task that was not pending", seen in CI)
    submit_more()
    while written < len(parts):
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=PROGRESS_EVERY_S)
        for ref in ready:
            results[pending.pop(ref)] = _result(ref)
        submit_more()                   # before writing: no worker waits on the driver's writes
        while written in results:
            tokens, num_documents, num_bytes = results.pop(written)
            if num_documents:
                writer.add_shard(tokens, num_documents)
            counted["bytes"] += num_bytes
            counted["tokens"] += len(tokens)
            written += 1
        if time.perf_counter() - last_report >= PROGRESS_EVERY_S or written == len(parts):
            last_report = time.perf_counter()
            _report(counted, total_bytes, last_report - started, written, len(parts), progress)
    return counted


def _result(ref):
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as err:          # a user error in a task: its own one-line message
        if isinstance(err.cause, ConfigError):
            raise ConfigError(str(err.cause)) from None
        raise


def _report(counted: dict, total_bytes: int, elapsed: float, done: int, parts: int, progress) -> None:
    rate = max(elapsed, 1e-9)
    print(f"data prepare: {counted['bytes'] / 1e6:.1f}/{total_bytes / 1e6:.1f} MB, {done}/{parts} parts, "
          f"{counted['bytes'] / rate / 1e6:.2f} MB/s, {counted['tokens'] / rate / 1e3:.1f} k tokens/s",
          file=progress, flush=True)
