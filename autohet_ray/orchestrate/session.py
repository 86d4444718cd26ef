"""Connect a plain caller (the CLI, jobs/train.py, a benchmark) to a Ray cluster, or start an emulated one."""
from __future__ import annotations

import contextlib
import os

import ray

from autohet_ray.cluster.spec import Cluster
from autohet_ray.emulate.cluster import emulated_cluster
from autohet_ray.orchestrate.discovery import discover


@contextlib.contextmanager
def ray_session(cluster: Cluster, *, address: str | None, emulate: bool, on_start=None):
    """Connect to a running Ray cluster (`address`, or RAY_ADDRESS as under `ray job submit`); with `emulate`
    and neither given, start an emulated cluster from the cluster file on this machine (shut down on exit).
    A caller already connected to Ray keeps its connection."""
    if ray.is_initialized():            # embedded in a program that is already connected: use its cluster
        yield None
        return
    address = address or os.environ.get("RAY_ADDRESS")
    if address is None and emulate:
        if on_start:
            on_start(cluster)
        with emulated_cluster(cluster) as started:
            yield started
        return
    ray.init(address=address or "auto")
    try:
        yield None
    finally:
        ray.shutdown()


def profile_on_ray(cluster: Cluster, model, seq_len: int, cache_dir: str | None):
    from autohet_ray.orchestrate.profiling import profile_cluster  # lazy: torch, for a measured profile only
    return profile_cluster(discover(cluster), model, seq_len, cache_dir=cache_dir)
