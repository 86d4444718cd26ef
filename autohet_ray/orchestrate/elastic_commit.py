"""Committing snapshot steps from the driver: node+peer manifests once every rank's fast lane has written
(each live keeper holds the manifest), cloud manifests once every rank's upload finished, and garbage
collection of older steps. Commits to a keeper that died meanwhile are skipped and reported, never silent."""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import ray

from autohet_ray.checkpoint import collect_garbage, commit_step, scan_manifests
from autohet_ray.checkpoint.errors import CheckpointError, TierUnavailableError
from autohet_ray.orchestrate.elastic_tiers import build_tier


class Committer:
    def __init__(self, *, keeper_specs: dict[str, dict], cloud_spec: dict, extra: dict, gc_every: int):
        self.keepers = {node: build_tier(spec, keeper_timeout_s=10.0) for node, spec in keeper_specs.items()}
        self.cloud = build_tier(cloud_spec)
        self.extra, self.gc_every = extra, gc_every
        self.committed: list[int] = []
        self.cloud_committed: list[int] = []
        self.pending_cloud: dict[int, list] = {}       # step -> refs of every rank's cloud records
        self.skipped: list[str] = []
        self._gc_pool = ThreadPoolExecutor(1, thread_name_prefix="ckpt-gc")
        self._gc: Future | None = None

    def drop_keeper(self, node: str) -> None:
        self.keepers.pop(node, None)

    def commit_fast(self, step: int, records_per_rank: list[list]) -> None:
        if not self.keepers:
            raise CheckpointError(f"step {step}: no live keeper to take the manifest")
        records = [r for rank_records in records_per_rank for r in rank_records]
        node_of = {id(tier): node for node, tier in self.keepers.items()}
        missed = []

        def unavailable(tier, err):
            missed.append(tier)
            self.skipped.append(f"step {step}: keeper of node {node_of[id(tier)]} unavailable ({err})")
        commit_step(step, records, list(self.keepers.values()), extra=self.extra, on_unavailable=unavailable)
        if len(missed) == len(self.keepers):
            raise CheckpointError(f"step {step}: no live keeper took the manifest: "
                                  f"{self.skipped[-len(self.keepers):]}")
        self.committed.append(step)

    def add_cloud(self, step: int, refs: list) -> None:
        self.pending_cloud[step] = refs

    def poll_cloud(self, *, wait: bool = False, timeout_s: float = 600.0) -> None:
        """Commit the cloud manifest of every step whose uploads all finished (all of them when `wait`)."""
        for step in sorted(self.pending_cloud):
            refs = self.pending_cloud[step]
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s if wait else 0)
            if len(ready) < len(refs):
                continue
            try:
                records = [r for rank_records in ray.get(refs) for r in rank_records]
            except ray.exceptions.RayError as err:     # an upload failed: this step stays off the cloud
                self.skipped.append(f"cloud step {step}: {str(err).splitlines()[0]}")
                del self.pending_cloud[step]
                continue
            commit_step(step, records, [self.cloud], extra=self.extra)
            self.cloud_committed.append(step)
            del self.pending_cloud[step]

    def forget_pending(self) -> None:
        """Uploads of a failed group never commit (their chunks are swept by a later collection)."""
        self.pending_cloud.clear()

    def maybe_collect(self, step: int) -> None:
        """Collect old steps in the background (one collection at a time; a busy collector skips a turn)."""
        if not self.gc_every or step % self.gc_every or len(self.committed) < 2:
            return
        if self._gc is not None and not self._gc.done():
            return
        self._gc = self._gc_pool.submit(self._collect, step, list(self.committed), list(self.cloud_committed),
                                        bool(self.pending_cloud))

    def _collect(self, step: int, committed: list[int], cloud_committed: list[int], uploading: bool) -> None:
        for node, tier in list(self.keepers.items()):
            try:
                collect_garbage(tier, keep_last=2, committed=committed)
            except TierUnavailableError as err:
                self.skipped.append(f"gc at step {step}: keeper of node {node} unavailable ({err})")
        if len(cloud_committed) >= 2 and not uploading:
            collect_garbage(self.cloud, keep_last=2, committed=cloud_committed)

    def close(self) -> None:
        """Wait for a running collection (its errors surface here)."""
        if self._gc is not None:
            self._gc.result()
        self._gc_pool.shutdown(wait=True)

    def manifest_tiers(self, mode: str) -> list:
        return [self.cloud] if mode == "cloud_only" else [*self.keepers.values(), self.cloud]

    def committed_steps(self, mode: str) -> list[int]:
        """Committed steps any reachable manifest tier holds, newest first."""
        return sorted(scan_manifests(self.manifest_tiers(mode)).steps, reverse=True)
