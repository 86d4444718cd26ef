"""Checkpoint tiers as plain data, so they travel to stage actors and are built where they are used.

    {"kind": "keeper", "name": "keeper-a", "node_id": "...", "job_id": "...", "dir": "/dev/shm/..."}
                                 a node's store (node / peer tier): processes on that node use the directory
                                 itself, others go through the node's keeper actor
    {"kind": "keeper_push", "name": "keeper-c", "node_id": "<c>", "job_id": "...", "via_node_id": "<a>"}
                                 write-only peer tier: keeper a pushes chunks it already holds to keeper c
                                 (the writing rank sends its bytes once, to its own node's keeper)
    {"kind": "dir", ...} or {"kind": "s3", ...}: the durable storage (storage/spec.py: storage_spec); a "dir"
                                 fsyncs every file and its directory unless it carries "fsync": False
Any spec may carry "rate_bytes_per_s": the tier is then wrapped in a ThrottledTier (a realistic S3 link).
Every built tier is wrapped in a TimedTier that records how long reads from it took (wall span and bytes).
The keeper kinds reached through an actor are built in elastic/tiers.py (Ray); the rest here.
"""
from __future__ import annotations

import os
import threading
import time

from autohet_ray import ConfigError
from autohet_ray.checkpoint.errors import TierUnavailableError
from autohet_ray.checkpoint.tiers.localdir import LocalDirTier
from autohet_ray.checkpoint.tiers.throttle import ThrottledTier

KINDS = ("keeper", "keeper_push", "dir", "s3")


def push_spec(peer: dict, local: dict) -> dict:
    """The write-only spec that replicates to keeper `peer` through keeper `local` (both keeper specs)."""
    assert peer["kind"] == local["kind"] == "keeper", (peer, local)
    return {"kind": "keeper_push", "name": peer["name"], "node_id": peer["node_id"], "job_id": peer["job_id"],
            "via_node_id": local["node_id"]}


def direct_tier(spec: dict):
    """The tier of a spec read without an actor: a node store's own directory (on its node), "dir" or "s3"."""
    kind = spec.get("kind")
    if kind == "keeper":                           # a node store: RAM (/dev/shm), fsync has nothing to flush to
        return LocalDirTier(spec["dir"], name=spec["name"], fsync=False)
    if kind == "dir":                              # the storage: durable by default (autohet_ray/durable.py)
        return LocalDirTier(spec["path"], name=spec["name"], fsync=spec.get("fsync", True))
    if kind == "s3":
        from autohet_ray.checkpoint.tiers.s3 import S3Config, S3Tier  # lazy: boto3, for S3 storage only
        return S3Tier(S3Config(bucket=spec["bucket"], prefix=spec.get("prefix", ""),
                               endpoint_url=spec.get("endpoint_url")), name=spec["name"])
    raise ConfigError(f"tier spec kind {kind!r}; valid: {', '.join(KINDS)}")


def wrap_tier(tier, spec: dict):
    """Throttled when the spec asks for a rate; always timed."""
    if spec.get("rate_bytes_per_s"):
        tier = ThrottledTier(tier, spec["rate_bytes_per_s"])
    return TimedTier(tier)


class GoneTier:
    """A keeper that no longer exists: every call is TierUnavailableError (reported by the restore)."""

    def __init__(self, name: str):
        self.name = name

    def __getattr__(self, attr):
        def gone(*_args, **_kw):
            raise TierUnavailableError(self.name, f"{attr}: keeper actor not found")
        return gone


class TimedTier:
    """Delegates to `inner`; records the wall span of its chunk reads (first start to last end) and bytes."""

    def __init__(self, inner):
        self.inner, self.name = inner, inner.name
        self._lock = threading.Lock()
        self.first_start = self.last_end = None
        self.read_bytes = 0

    def get_chunk(self, key: str) -> bytes:
        start = time.perf_counter()
        try:
            blob = self.inner.get_chunk(key)
        finally:
            end = time.perf_counter()
            with self._lock:
                self.first_start = start if self.first_start is None else min(self.first_start, start)
                self.last_end = end if self.last_end is None else max(self.last_end, end)
        with self._lock:
            self.read_bytes += len(blob)
        return blob

    def read_seconds(self) -> float:
        return 0.0 if self.first_start is None else self.last_end - self.first_start

    def __getattr__(self, attr):
        return getattr(self.inner, attr)


def location(spec: dict, name: str) -> str:
    """Where the object `name` of a tier spec lives, for messages and local files (a path or an s3:// URL)."""
    if spec["kind"] == "s3":
        return f"s3://{spec['bucket']}/{spec.get('prefix', '')}{name}"
    if spec["kind"] == "dir":
        return os.path.join(spec["path"], name)
    return os.path.join(spec.get("dir") or f"<node store of {spec['name']}>", name)
