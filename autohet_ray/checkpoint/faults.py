"""Fault injection at named points of the checkpoint path, for tests.

    faults = Faults({"before_manifest_commit": 1})    # fail at the first hit of that point
    faults.maybe_fail("before_manifest_commit")        # raises InjectedFault

An armed point may also run an action instead of raising (e.g. SIGKILL the process mid-upload).
"""
from __future__ import annotations

import threading
from collections import Counter
from typing import Callable

from autohet_ray import ConfigError
from autohet_ray.checkpoint.errors import InjectedFault

POINTS = (
    "snapshot_copy",           # copying shards to CPU (the synchronous part)
    "snapshot_write",          # writing a chunk to the node's memory tier
    "replicate",               # copying a chunk to a peer node's tier
    "upload",                  # writing a chunk to the job's storage
    "upload_part",             # after each part of an S3 multipart upload
    "before_manifest_commit",  # all chunks written, manifest not yet committed
    "after_manifest_commit",   # manifest committed, old steps not yet collected
)


class Faults:
    """Named fault points; `arm` maps a point to the 1-based hit that fails, or to (hit, action)."""

    def __init__(self, arm: dict[str, int | tuple[int, Callable[[], None]]] | None = None):
        self._arm: dict[str, tuple[int, Callable[[], None] | None]] = {}
        for point, spec in (arm or {}).items():
            if point not in POINTS:
                raise ConfigError(f"unknown fault point {point!r}; valid: {', '.join(POINTS)}")
            hit, action = spec if isinstance(spec, tuple) else (spec, None)
            if not isinstance(hit, int) or hit < 1:
                raise ConfigError(f"fault point {point!r}: hit must be an int >= 1, got {hit!r}")
            self._arm[point] = (hit, action)
        self.hits: Counter[str] = Counter()
        self._lock = threading.Lock()

    def arm_next(self, point: str, action: Callable[[], None] | None = None) -> None:
        """Fail (or run `action`) at the next hit of `point`."""
        if point not in POINTS:
            raise ConfigError(f"unknown fault point {point!r}; valid: {', '.join(POINTS)}")
        with self._lock:
            self._arm[point] = (self.hits[point] + 1, action)

    def maybe_fail(self, point: str) -> None:
        assert point in POINTS, f"unknown fault point {point!r}"
        with self._lock:
            self.hits[point] += 1
            hit = self.hits[point]
        armed = self._arm.get(point)
        if armed is None or armed[0] != hit:
            return
        if armed[1] is not None:
            armed[1]()
            return
        raise InjectedFault(point, hit)


NO_FAULTS = Faults()
