"""Committing snapshot steps from the controller: node-store manifests once every rank's fast lane has written
(each live keeper holds the manifest), storage manifests once every rank's upload finished, promotion of a
committed node-store step to the storage (each keeper uploads what it holds), and garbage collection of older
steps. Commits to a keeper that died meanwhile are skipped and reported, never silent.

Without node stores (a plain, non-elastic job) the fast lane writes to the storage itself: a fast commit is
then a storage commit."""
from __future__ import annotations

import contextlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace

import ray

from autohet_ray.job.config import TrainJob
from autohet_ray.checkpoint import collect_garbage, commit_step, find_manifest, scan_manifests
from autohet_ray.checkpoint.copy_check import report_refused
from autohet_ray.checkpoint.errors import CheckpointError, TierUnavailableError
from autohet_ray.checkpoint.holdings import hand_over_copies, second_copies, spread_uploads
from autohet_ray.elastic.keeper import get_keeper, keeper_name, stop_dropped_keeper
from autohet_ray.elastic.liveness import settled_ok
from autohet_ray.elastic.tiers import build_tier
from autohet_ray.recovery.dropped import DroppedKeepers
from autohet_ray.recovery.report import one_line, report_failure


class Committer:
    def __init__(self, *, keeper_specs: dict[str, dict], storage: dict, extra: dict, gc_every: int,
                 control_timeout_s: float = TrainJob.control_timeout_s):
        self.keeper_specs = keeper_specs                # node name -> keeper spec (shared with the controller)
        self.keepers = {node: build_tier(spec, keeper_timeout_s=10.0) for node, spec in keeper_specs.items()}
        self.storage_spec, self.storage = storage, build_tier(storage)
        self.extra, self.gc_every, self.control_timeout_s = extra, gc_every, control_timeout_s
        self.step_extra = lambda step: {}              # what a step's manifest records of it (the data position)
        self.committed: list[int] = []
        self.storage_committed: list[int] = []
        self.pending_storage: dict[int, list] = {}     # step -> refs of every rank's storage records
        self.skipped: list[str] = []
        self.copies: list = []                          # refs of re-replications after a loss (background)
        self._gc_pool = ThreadPoolExecutor(1, thread_name_prefix="ckpt-gc")
        self._gc: Future | None = None
        self.dropped = DroppedKeepers(stop=stop_dropped_keeper)

    def add_keeper(self, node: str, spec: dict) -> None:
        self.dropped.rejoined(spec["node_id"])
        self.keeper_specs[node] = spec
        self.keepers[node] = build_tier(spec, keeper_timeout_s=10.0)

    def drop_keeper(self, node: str, reason: str = "no reason given") -> None:
        """Stop committing to `node`'s keeper (its node is lost or leaving), printed with `reason`; the keeper is
        stopped (its store removed) once a newer step is committed elsewhere."""
        newest = self.committed[-1] if self.committed else None
        if self.keepers.pop(node, None) is not None:
            spec = self.keeper_specs.get(node, {})
            report_failure(newest, f"keeper of node {node} dropped", spec.get("name"), reason)
        spec = self.keeper_specs.pop(node, None)
        if spec is not None:
            self.dropped.drop(spec, newest if newest is not None else -1)

    def hand_over_stores(self, leaving: list[str], reason: str, timeout_s: float) -> int:
        """Drop the stores of `leaving` nodes (alive: a notice or a drain) once each chunk of the newest committed
        step they hold has two copies among the staying stores (copied from them, waited for up to `timeout_s`;
        a copy not made by then is printed): a loss among the stayers right after cannot take the step's last
        copy. Returns the bytes copied."""
        newest = self.committed[-1] if self.committed else None
        manifest = self.newest_manifest() if leaving and newest not in (None, *self.storage_committed) else None
        names = {self.keeper_specs[node]["name"]: node for node in self.keepers}
        staying = {name: node for name, node in names.items() if node not in leaving}
        copies = hand_over_copies(manifest.records, staying, {n: v for n, v in names.items() if v in leaving}) \
            if manifest is not None and staying else {}
        refs = self.send_copies(copies, manifest)
        ready, late = ray.wait(refs, num_returns=len(refs), timeout=timeout_s) if refs else ([], [])
        if late:
            self.skip(newest, f"{len(late)} of the copies from the leaving stores of {leaving}", None,
                      f"not made within {timeout_s:.0f} s; they go on while the job trains")
            self.copies += late
        copied = self.copied_bytes(ready, f"a copy from the leaving stores of {leaving}")
        for node in leaving:
            self.drop_keeper(node, reason)
        return copied

    def skip(self, step: int | None, what: str, tier: str | None, reason) -> None:
        """Record and print a failure the job continues past (a missed commit, upload or collection)."""
        self.skipped.append(report_failure(step, what, tier, reason))

    def commit_fast(self, step: int, records_per_rank: list[list]) -> None:
        records = [r for rank_records in records_per_rank for r in rank_records]
        if not self.keeper_specs:                       # no node stores: the fast lane wrote to the storage
            commit_step(step, records, [self.storage], extra=self.extra | self.step_extra(step))
            self.committed.append(step)
            self.storage_committed.append(step)
            return
        if not self.keepers:
            raise CheckpointError(f"step {step}: no live keeper to take the manifest")
        node_of = {id(tier): node for node, tier in self.keepers.items()}
        missed = []

        def unavailable(tier, err):
            missed.append(tier)
            self.skip(step, f"manifest commit to the keeper of node {node_of[id(tier)]}", tier.name, err)
        commit_step(step, records, list(self.keepers.values()), extra=self.extra | self.step_extra(step),
                    on_unavailable=unavailable)
        if len(missed) == len(self.keepers):
            raise CheckpointError(f"step {step}: no live keeper took the manifest: "
                                  f"{self.skipped[-len(self.keepers):]}")
        self.committed.append(step)
        self.dropped.reap(step, self._gc_pool)

    def note_restored(self, step: int) -> None:
        """The group now continues from committed step `step` (restored from some tier)."""
        self.committed = sorted({*self.committed, step})
        if step in scan_manifests([self.storage]).steps:
            self.storage_committed = sorted({*self.storage_committed, step})

    def add_storage(self, step: int, refs: list) -> None:
        self.pending_storage[step] = refs

    def poll_storage(self, *, wait: bool = False, timeout_s: float = 600.0) -> None:
        """Commit the storage manifest of every step whose uploads all finished (all of them when `wait`)."""
        self.settle_copies()
        for step in sorted(self.pending_storage):
            refs = self.pending_storage[step]
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s if wait else 0)
            if len(ready) < len(refs):
                continue
            try:
                records = [r for rank_records in ray.get(refs) for r in rank_records]
            except ray.exceptions.RayError as err:     # an upload failed: this step stays off the storage
                self.skip(step, "storage upload skipped", self.storage.name, _cause(err))
                del self.pending_storage[step]
                continue
            commit_step(step, records, [self.storage], extra=self.extra | self.step_extra(step))
            self.storage_committed.append(step)
            del self.pending_storage[step]
            self.dropped.reap(step, self._gc_pool)

    def forget_pending(self) -> None:
        """Uploads of a failed group never commit (their chunks are swept by a later collection)."""
        self.pending_storage.clear()

    def orphans_of_newest(self) -> tuple[int, list]:
        """(newest committed step, its chunk records that no live node store holds: every copy was on a lost
        node); no records when the storage holds the step or no live store has its manifest."""
        if not self.committed or self.committed[-1] in self.storage_committed or not self.keepers:
            return (self.committed[-1] if self.committed else -1), []
        step, reachable = self.committed[-1], self._answering_keepers()
        try:
            manifest = find_manifest([self.keepers[node] for node in sorted(reachable)], step)
        except CheckpointError:
            return step, []
        live = {self.keeper_specs[node]["name"] for node in reachable}
        return step, [r for r in manifest.records if not live & set(r.replicas)]

    def _answering_keepers(self, timeout_s: float = 3.0) -> set[str]:
        """The nodes whose keepers answer now: a node going down with the lost ones (not yet named lost, as two
        nodes reclaimed together are not always detected together) holds no usable copy either."""
        refs = {}
        for node in self.keeper_specs:
            try:
                refs[node] = self._keeper(node).has.remote("liveness-probe")
            except ValueError:                          # its actor is gone
                continue
        ready = set(ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)[0]) if refs else set()
        return {node for node, ref in refs.items() if ref in ready and settled_ok(ref)}

    def rereplicate_newest(self, also_held: dict[str, set[str]] | None = None) -> int:
        """After a node loss: copy each chunk of the newest committed step that only one live node store still
        holds to a second live store (the keepers copy between themselves, in the background, while the job
        re-plans), so that another loss before the next commit cannot take the step's last copy. A step already
        in the storage needs no copy. `also_held`: key -> nodes whose stores hold that chunk beyond what the
        manifest records (written since, from live state). Returns the number of chunks being copied."""
        if not self.committed or self.committed[-1] in self.storage_committed or len(self.keepers) < 2:
            return 0
        manifest = self.newest_manifest()
        copies = second_copies(manifest.records, self.node_of_store(), also_held or {}) if manifest else {}
        self.copies += self.send_copies(copies, manifest)
        return sum(len(keys) for keys in copies.values())

    def newest_manifest(self):
        """The newest committed step's manifest from the live node stores (None, the reason in `skipped`)."""
        try:
            return find_manifest(list(self.keepers.values()), self.committed[-1]) if self.committed else None
        except CheckpointError as err:
            self.skip(self.committed[-1], "no second copy made after the loss", None, err)
            return None

    def send_copies(self, copies: dict[tuple, list[str]], manifest) -> list:
        """Start keeper-to-keeper copies ((source node, target node) -> keys of `manifest`'s chunks, each kept
        only when it hashes to the manifest's digest); the calls' references (see `copied_bytes`)."""
        digest_of = {r.key: r.digest for r in manifest.records} if copies else {}
        refs = []
        for (source, target), keys in copies.items():
            dst = self.keeper_specs[target]
            with contextlib.suppress(ValueError):   # the source's keeper is gone: the restore reads elsewhere
                refs.append(self._keeper(source).replicate.remote({k: digest_of[k] for k in keys},
                                                                  keeper_name(dst["job_id"], dst["node_id"])))
        return refs

    def copied_bytes(self, refs: list, what: str) -> int:
        """The bytes the settled keeper copies `refs` made. Each copy that failed (its keeper died, the call raised)
        or that a keeper refused (a digest mismatch) is printed and kept in `skipped`; `what` names the copies."""
        total, newest = 0, (self.committed[-1] if self.committed else None)
        for ref in refs:
            try:
                out = ray.get(ref)
            except ray.exceptions.RayError as err:
                self.skip(newest, what, None, _cause(err))
                continue
            report_refused(out["refused"], self.skipped)
            total += out["bytes"]
        return total

    def settle_copies(self) -> None:
        """Report the background re-replications that finished (refused copies printed), keep the rest."""
        if self.copies:
            ready, self.copies = ray.wait(self.copies, num_returns=len(self.copies), timeout=0)
            self.copied_bytes(ready, "a background copy between node stores")

    def promote(self, step: int, timeout_s: float = 600.0) -> int:
        """Copy committed node-store step `step` to the storage and commit it there: every chunk is uploaded
        by one keeper holding it (spread over the holders, in parallel), then the manifest. Returns the bytes
        uploaded; CheckpointError when some chunk has no live holder."""
        manifest = find_manifest(list(self.keepers.values()), step)
        node_of = self.node_of_store()
        todo = list(manifest.records)
        uploaded, dead, bad = 0, set(), {}              # bad: key -> stores whose copy failed its hash
        while todo:
            batches = spread_uploads(todo, node_of, dead)
            if batches is None:
                raise CheckpointError(f"step {step}: chunk {todo[0].key!r} has no live node store with a good "
                                      f"copy to upload it from (held by {list(todo[0].replicas)}; lost: "
                                      f"{sorted(dead)}; refused copies from: {sorted(bad.get(todo[0].key, ()))})")
            refs = {node: self._keeper(node).upload.remote({r.key: r.digest for r in records}, self.storage_spec)
                    for node, records in batches.items()}
            todo = []
            for node, ref in refs.items():
                try:
                    out = ray.get(ref, timeout=timeout_s)
                except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError, ValueError):
                    dead.add(node)                      # its keeper (or node) is gone: another holder uploads
                    todo += batches[node]
                    continue
                except ray.exceptions.RayTaskError as err:     # the upload itself failed: say why
                    raise CheckpointError(f"step {step}: node {node}'s store could not upload to the storage: "
                                          f"{_cause(err)}") from None
                uploaded += out["bytes"]
                todo += self._refused_uploads(out["refused"], batches[node], bad)
        records = [replace(r, replicas=tuple(sorted({*r.replicas, self.storage.name} - bad.get(r.key, set()))))
                   for r in manifest.records]
        commit_step(step, records, [self.storage], extra=manifest.extra)
        self.storage_committed.append(step)
        return uploaded

    def _refused_uploads(self, refused: list[dict], batch: list, bad: dict[str, set]) -> list:
        """Print the refused uploads of one holder's `batch`; its records to upload again from another holder
        (the refusing store no longer counts as one)."""
        report_refused(refused, self.skipped)
        again = []
        by_key = {r.key: r for r in batch}
        for refusal in refused:
            bad.setdefault(refusal["key"], set()).add(refusal["source"])
            record = by_key[refusal["key"]]
            again.append(replace(record, replicas=tuple(x for x in record.replicas if x not in bad[record.key])))
        return again

    def maybe_collect(self, step: int) -> None:
        """Collect old steps in the background (one collection at a time; a busy collector skips a turn)."""
        if not self.gc_every or step % self.gc_every or len(self.committed) < 2:
            return
        if self._gc is not None and not self._gc.done():
            return
        self._gc = self._gc_pool.submit(self._collect, step, list(self.committed), list(self.storage_committed),
                                        frozenset(self.pending_storage))

    def _collect(self, step: int, committed: list[int], storage_committed: list[int], uploading: frozenset) -> None:
        """Old steps off every node store and the storage; a step still uploading stays in the node stores (the
        upload reads it there) and the storage is left alone meanwhile."""
        for node, tier in list(self.keepers.items()):
            try:
                collect_garbage(tier, keep_last=2, committed=committed, in_use=uploading)
            except TierUnavailableError as err:
                self.skip(step, f"collection of old steps on the keeper of node {node}", tier.name, err)
        if len(storage_committed) >= 2 and not uploading:
            collect_garbage(self.storage, keep_last=2, committed=storage_committed)

    def close(self) -> None:
        """Wait for a running collection (its errors surface here)."""
        if self._gc is not None:
            self._gc.result(timeout=self.control_timeout_s)    # TimeoutError: a collection hung
        self._gc_pool.shutdown(wait=True)

    def node_of_store(self) -> dict[str, str]:
        """Store name -> node of the live keepers."""
        return {self.keeper_specs[node]["name"]: node for node in self.keepers}

    def _keeper(self, node: str):
        """The keeper actor of `node` (ValueError when it is gone)."""
        return get_keeper(self.keeper_specs[node]["job_id"], self.keeper_specs[node]["node_id"])

    def manifest_tiers(self, mode: str) -> list:
        return [self.storage] if mode == "cloud_only" else [*self.keepers.values(), self.storage]

    def committed_steps(self, mode: str) -> list[int]:
        """Committed steps any reachable manifest tier holds, newest first."""
        return sorted(scan_manifests(self.manifest_tiers(mode)).steps, reverse=True)


def _cause(err) -> str:
    """A Ray task error's own message (its first line), without the remote traceback Ray wraps it in."""
    cause = getattr(err, "cause", None)
    return one_line(cause if cause is not None else err)
