"""Checkpoint tiers as plain data, so they travel to stage actors and are built where they are used.

    {"kind": "keeper", "name": "keeper-a", "node_id": "...", "job_id": "...", "dir": "/dev/shm/..."}
                                 a node's store (node / peer tier): processes on that node use the directory
                                 itself, others go through the node's keeper actor
    {"kind": "keeper_push", "name": "keeper-c", "node_id": "<c>", "job_id": "...", "via_node_id": "<a>"}
                                 write-only peer tier: keeper a pushes chunks it already holds to keeper c
                                 (the writing rank sends its bytes once, to its own node's keeper)
    {"kind": "dir", ...} or {"kind": "s3", ...}: the durable storage (storage/spec.py: storage_spec)
Any spec may carry "rate_bytes_per_s": the tier is then wrapped in a ThrottledTier (a realistic cloud link).
Every built tier is wrapped in a TimedTier that records how long reads from it took (wall span and bytes).
"""
from __future__ import annotations

import threading
import time

from autohet_ray import ConfigError

KINDS = ("keeper", "keeper_push", "dir", "s3")


def push_spec(peer: dict, local: dict) -> dict:
    """The write-only spec that replicates to keeper `peer` through keeper `local` (both keeper specs)."""
    assert peer["kind"] == local["kind"] == "keeper", (peer, local)
    return {"kind": "keeper_push", "name": peer["name"], "node_id": peer["node_id"], "job_id": peer["job_id"],
            "via_node_id": local["node_id"]}


def build_tier(spec: dict, *, keeper_timeout_s: float = 30.0):
    """The Tier object of a spec (inside whichever process will use it)."""
    kind = spec.get("kind")
    if kind == "keeper" and spec.get("dir") and _on_node(spec["node_id"]):
        from autohet_ray.checkpoint.tiers.localdir import LocalDirTier
        tier = LocalDirTier(spec["dir"], name=spec["name"], fsync=False)
    elif kind == "keeper":
        from autohet_ray.elastic.keeper import KeeperTier, get_keeper
        try:
            handle = get_keeper(spec["job_id"], spec["node_id"])
        except ValueError:                         # the keeper (or its node) is gone: unavailable, not fatal
            handle = None
        tier = KeeperTier(handle, spec["name"], timeout_s=keeper_timeout_s) if handle else _GoneTier(spec["name"])
    elif kind == "keeper_push":
        from autohet_ray.elastic.keeper import get_keeper, keeper_name
        tier = KeeperPushTier(get_keeper(spec["job_id"], spec["via_node_id"]),
                              keeper_name(spec["job_id"], spec["node_id"]), spec["name"],
                              timeout_s=keeper_timeout_s)
    elif kind == "dir":
        from autohet_ray.checkpoint.tiers.localdir import LocalDirTier
        tier = LocalDirTier(spec["path"], name=spec["name"], fsync=spec.get("fsync", False))
    elif kind == "s3":
        from autohet_ray.checkpoint.tiers.s3 import S3Config, S3Tier
        tier = S3Tier(S3Config(bucket=spec["bucket"], prefix=spec.get("prefix", ""),
                               endpoint_url=spec.get("endpoint_url")), name=spec["name"])
    else:
        raise ConfigError(f"tier spec kind {kind!r}; valid: {', '.join(KINDS)}")
    if spec.get("rate_bytes_per_s"):
        from autohet_ray.checkpoint.tiers.throttle import ThrottledTier
        tier = ThrottledTier(tier, spec["rate_bytes_per_s"])
    return TimedTier(tier)


def _on_node(node_id: str) -> bool:
    import ray
    return ray.is_initialized() and ray.get_runtime_context().get_node_id() == node_id


class KeeperPushTier:
    """Replicas made keeper to keeper: `put_chunk` asks the local keeper (which took the chunk just before,
    as the snapshotter writes the node tier first) to push it to the peer keeper; the blob argument is not
    sent again. Reads are not served here (restores read the peer keeper itself)."""

    def __init__(self, via, peer_actor_name: str, name: str, *, timeout_s: float = 30.0):
        self.via, self.peer_actor_name, self.name, self.timeout_s = via, peer_actor_name, name, timeout_s

    def put_chunk(self, key: str, blob: bytes) -> None:
        self.put_chunks([(key, blob)])

    def put_chunks(self, items: list[tuple[str, bytes]]) -> None:
        """One keeper-to-keeper push for all of them."""
        import ray

        from autohet_ray.checkpoint.errors import TierUnavailableError
        keys = [key for key, _ in items]
        try:
            sent = ray.get(self.via.replicate.remote(keys, self.peer_actor_name), timeout=self.timeout_s)
        except (ray.exceptions.RayError, ValueError) as err:
            raise TierUnavailableError(self.name, f"push via local keeper: {type(err).__name__}") from err
        assert sent == sum(len(blob) for _, blob in items), (keys, sent)


class _GoneTier:
    """A keeper that no longer exists: every call is TierUnavailableError (reported by the restore)."""

    def __init__(self, name: str):
        self.name = name

    def __getattr__(self, attr):
        from autohet_ray.checkpoint.errors import TierUnavailableError

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
