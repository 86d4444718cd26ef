"""The durable storage (a directory or s3://bucket/prefix) as a tier spec, for the job's checkpoints and files:

    {"kind": "dir", "name": "storage", "path": "/ckpt/run-7"}
    {"kind": "s3", "name": "storage", "bucket": "b", "prefix": "run-7/", "endpoint_url": None}
Either may carry "rate_bytes_per_s": the tier is then throttled (a realistic S3 link, elastic/tiers.py).
The tier's name is what committed manifests list among each chunk's replicas and what restore reports and
metrics.jsonl count bytes under. Older jobs named it "cloud": their manifests still restore (no reader picks a
tier by the names a manifest lists; tests/unit/test_checkpoint_restore.py), and a resume names it anew."""
from __future__ import annotations

import os

from autohet_ray import ConfigError
from autohet_ray.checkpoint.tier_specs import location  # noqa: F401 (re-exported)

STORAGE_TIER = "storage"           # the storage tier's name in manifests and reports ("cloud" before)


def split_s3(url: str) -> tuple[str, str]:
    """(bucket, key prefix) of s3://bucket/prefix; ConfigError when it names no bucket."""
    bucket, _, key = url[len("s3://"):].partition("/")
    if not bucket:
        raise ConfigError(f"{url!r} names no bucket; use s3://bucket/prefix")
    return bucket, key


def as_prefix(key: str) -> str:
    """A key prefix that ends in "/" (or the empty one)."""
    return key if not key or key.endswith("/") else key + "/"


def storage_spec(url: str, *, name: str = STORAGE_TIER, endpoint_url: str | None = None,
                 rate_bytes_per_s: float | None = None) -> dict:
    """The tier spec of a storage URL: `s3://bucket[/prefix]` or a local directory path."""
    if not url:
        raise ConfigError("storage must be a directory or s3://bucket/prefix, got an empty string")
    if url.startswith("s3://"):
        bucket, prefix = split_s3(url)
        spec = {"kind": "s3", "name": name, "bucket": bucket, "prefix": as_prefix(prefix), "endpoint_url": endpoint_url}
    elif "://" in url:
        raise ConfigError(f"storage {url!r}: unknown scheme; use a directory path or s3://bucket/prefix")
    else:
        spec = {"kind": "dir", "name": name, "path": url}
    if rate_bytes_per_s is not None:
        spec["rate_bytes_per_s"] = float(rate_bytes_per_s)
    return spec


def check_storage(spec: dict, *, create: bool = True) -> None:
    """ConfigError unless the storage of `spec` (a `storage_spec`) can be used: a directory that exists or
    (with `create`) can be made and is writable; an S3 bucket that answers these credentials."""
    if spec["kind"] == "s3":
        from autohet_ray.checkpoint.tiers.s3 import S3Config, check_bucket  # lazy: boto3, for S3 only
        check_bucket(S3Config(bucket=spec["bucket"], prefix=spec.get("prefix", ""),
                              endpoint_url=spec.get("endpoint_url")))
        return
    assert spec["kind"] == "dir", spec
    path = spec["path"]
    if create and not os.path.exists(path):
        try:
            os.makedirs(path)
        except OSError as err:
            raise ConfigError(f"storage directory {path!r} cannot be created: {err.strerror}") from None
    if not os.path.isdir(path):
        raise ConfigError(f"storage {path!r} is not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"storage directory {path!r} is not writable")


def storage_url(spec: dict) -> str:
    """The directory or s3:// URL a storage spec stands for, as the user names it."""
    if spec["kind"] == "s3":
        return f"s3://{spec['bucket']}/{spec.get('prefix', '')}".rstrip("/")
    return spec["path"]
