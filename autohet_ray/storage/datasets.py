"""Datasets in a directory or on S3 (no Ray; orchestrate/data_prepare.py runs the preparation): the input files of
`autohet data prepare`, where it writes a dataset, and the download of an s3:// dataset for training."""
from __future__ import annotations

import fnmatch
import functools
import json
import os

from autohet_ray import ConfigError
from autohet_ray.data.documents import documents_of
from autohet_ray.data.index import INDEX_FILE, TOKENIZER_FILE, hash_bytes, index_from_dict
from autohet_ray.data.parts import Source, list_local
from autohet_ray.data.writer import check_output_directory, directory_put
from autohet_ray.storage.spec import as_prefix, split_s3


def list_inputs(patterns: list[str], *, endpoint_url: str | None = None) -> list[Source]:
    """The files of every --input (a file, a directory (recursively), a glob, or s3://bucket/prefix-or-glob),
    sorted by name; ConfigError for one that names nothing."""
    sources: dict[str, Source] = {}
    for pattern in patterns:
        found = _list_s3(pattern, endpoint_url) if pattern.startswith("s3://") else list_local(pattern)
        if not found:
            raise ConfigError(f"--input {pattern!r} matches no files")
        sources.update((s.name, s) for s in found)
    return [sources[name] for name in sorted(sources)]


@functools.lru_cache(maxsize=4)
def _s3_client(endpoint_url: str | None):
    """A boto3 client (thread-safe, so one per process and endpoint)."""
    from autohet_ray.checkpoint.tiers.s3 import S3Config, make_client  # lazy: boto3, for S3 only
    return make_client(S3Config(bucket="any", endpoint_url=endpoint_url))


def _list_s3(url: str, endpoint_url: str | None) -> list[Source]:
    from autohet_ray.checkpoint.tiers.s3 import S3Config, check_bucket  # lazy: boto3, for S3 only
    bucket, key = split_s3(url)
    check_bucket(S3Config(bucket=bucket, endpoint_url=endpoint_url))
    magic = [i for i, ch in enumerate(key) if ch in "*?["]
    prefix = key[:magic[0]] if magic else key
    pages = _s3_client(endpoint_url).get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    objects = [o for page in pages for o in page.get("Contents", []) if not o["Key"].endswith("/")]
    return [Source(f"s3://{bucket}/{o['Key']}", o["Size"]) for o in objects
            if not magic or fnmatch.fnmatchcase(o["Key"], key)]


def read_source(name: str, endpoint_url: str | None = None) -> bytes:
    if name.startswith("s3://"):
        bucket, key = split_s3(name)
        return _s3_client(endpoint_url).get_object(Bucket=bucket, Key=key)["Body"].read()
    with open(name, "rb") as f:
        return f.read()


def dataset_output(out: str, endpoint_url: str | None):
    """The `put` of --out (a directory, or s3://bucket/prefix), after checking it can take a new dataset."""
    if not out.startswith("s3://"):
        check_output_directory(out)
        return directory_put(out)
    from autohet_ray.checkpoint.tiers.s3 import S3Config, check_bucket  # lazy: boto3, for S3 only
    bucket, prefix = split_s3(out)
    prefix = as_prefix(prefix)
    check_bucket(S3Config(bucket=bucket, endpoint_url=endpoint_url))
    client = _s3_client(endpoint_url)
    if client.list_objects_v2(Bucket=bucket, Prefix=prefix + INDEX_FILE).get("KeyCount", 0):
        raise ConfigError(f"--out {out!r} already holds a prepared dataset ({INDEX_FILE}); choose another --out")
    return lambda name, data: client.put_object(Bucket=bucket, Key=prefix + name, Body=data)


def download_dataset(url: str, directory: str, *, endpoint_url: str | None = None) -> str:
    """Copy the dataset at s3://bucket/prefix into `directory` (a cache: files already there whose hash the
    index records are kept), the index last; returns `directory`, ready for `Dataset.open`."""
    from botocore.exceptions import ClientError  # lazy: botocore, for S3 only
    bucket, prefix = split_s3(url)
    prefix = as_prefix(prefix)
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


def all_documents(sources: list[Source], text_field: str, endpoint_url: str | None):
    for source in sources:
        yield from documents_of(source.name, read_source(source.name, endpoint_url), text_field=text_field)
