"""`autohet data prepare` on Ray: tokenize a corpus in parallel into a dataset (autohet_ray/data/), and fetch an
s3:// dataset to the node for training.

Each part of the input files (data/parts.py) is one Ray task (one CPU, the tokenizer kept on one thread). The
driver keeps `workers` tasks in flight, ships local files' bytes to them (the nodes need not share a file
system; S3 inputs are read by the tasks), writes the shards in order as they arrive, and the index last.
"""
from __future__ import annotations

import contextlib
import os
import sys
import time

import ray

from autohet_ray import ConfigError
from autohet_ray.data.index import check_val_fraction
from autohet_ray.data.parts import group_into_parts, tokenize_files
from autohet_ray.data.tokenize import (read_tokenizer_json, special_ids, tokenizer_from_json, train_byte_level_bpe,
                                       vocab_size_of)
from autohet_ray.data.writer import DatasetWriter
from autohet_ray.storage.datasets import all_documents, dataset_output, list_inputs, read_source

DEFAULT_SHARD_BYTES = 16 << 20
PROGRESS_EVERY_S = 2.0


@ray.remote(num_cpus=1)
def tokenize_part(files: list[tuple[str, bytes | None]], tokenizer_json: str, *, eos_id: int, dtype: str,
                  text_field: str, endpoint_url: str | None) -> tuple:
    """data.parts.tokenize_files on one core; a file given without bytes is read here (S3)."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"       # one task, one core
    os.environ["RAYON_NUM_THREADS"] = "1"
    files = [(name, data if data is not None else read_source(name, endpoint_url)) for name, data in files]
    return tokenize_files(files, tokenizer_json, eos_id=eos_id, dtype=dtype, text_field=text_field)


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
    put = dataset_output(out, endpoint_url)
    started = time.perf_counter()
    text = given or train_byte_level_bpe(all_documents(sources, text_field, endpoint_url), train_vocab)
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
