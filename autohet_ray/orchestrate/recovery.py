"""The elastic controller: train with tiered snapshots, and on a lost node or stage actor re-plan on what is
left and resume from the cheapest copies of the newest committed step.

States: new -> running -> recovering (detect) -> replanning (plan, restart, fetch, load) -> running ... -> closed.

    ctl = ElasticController(job)               # job: ElasticJob (plain data)
    ctl.start()                                # discover, profile (analytic, once), plan, keepers, actors
    for _ in range(n): ctl.step()              # a failure inside step() recovers and returns the first step
    ctl.recoveries[-1]                         # phases: detect, replan, restart, fetch (per tier), load, first step
    ctl.close()

Snapshots: after every step each chunk lands in 1 + `num_peers` node stores (place_copies: another GPU type
first; data-parallel copies written where they are, the rest pushed to peers), and in the cloud tier every
`cloud_every` steps. The driver commits a step while the next one computes, so a node loss costs at most the
step in flight plus one.
"""
from __future__ import annotations

import time

import ray

from autohet_ray.checkpoint import find_manifest, place_copies
from autohet_ray.cluster.spec import cluster_from_dict
from autohet_ray.model.spec import model_from_dict
from autohet_ray.orchestrate.data import synthetic_batch
from autohet_ray.orchestrate.discovery import check_plan_fits, discover
from autohet_ray.orchestrate.elastic_commit import Committer
from autohet_ray.orchestrate.elastic_config import (ElasticJob, merge_restores, plan_summary, tier_order,
                                                    tiling_holdings, without_nodes)
from autohet_ray.orchestrate.elastic_group import ElasticGroup, GroupFailure
from autohet_ray.orchestrate.elastic_tiers import push_spec
from autohet_ray.orchestrate.keeper import keeper_spec, stop_keeper


class RecoveryFailed(RuntimeError):
    """Recovery could not name the failure, or no committed step could be restored."""


class ElasticController:
    def __init__(self, job: ElasticJob):
        self.job = job
        self.model = model_from_dict(job.model)
        self.seq_len = job.seq_len or self.model.max_seq_len
        self.base_cluster = cluster_from_dict(job.cluster)
        self.state = "new"
        self.found = self.profile = self.plan = self.group = self.committer = None
        self.keeper_specs: dict[str, dict] = {}
        self.lost: list[str] = []
        self.draining: set[str] = set()      # ids of nodes with a spot notice or a Ray drain: planned around
        self.gone: set[str] = set()          # ids of nodes confirmed lost before Ray's health checks said so
        self.step_index = 0                  # completed optimizer steps of the live group
        self.history: list[dict] = []
        self.recoveries: list[dict] = []
        self.fault_at: float | None = None
        self.snapped: set[int] = set()       # steps the live group snapshotted
        self.snapshots = job.checkpoint      # snapshot after each step (benchmarks toggle it to measure cost)
        self.restore_mode = "local_first"    # how step() restores after a failure ("cloud_only": the baseline)
        self.time_scale = 0.0                # the emulated clock's scale, once the first launch fixed it

    # -- setup ---------------------------------------------------------------------------------------------
    def start(self, *, restore: str | None = None) -> dict:
        """Discover, profile once, start keepers, plan, place and (with restore='cloud_only'/'local_first')
        load the newest committed step. Returns the launch report."""
        from autohet_ray.profile.analytic import analytic_profile, with_micro_batches
        from autohet_ray.orchestrate.spot import draining_nodes
        assert self.state == "new", self.state
        self.draining = set(draining_nodes())
        self.found = discover(without_nodes(self.base_cluster, self._dead_nodes()))
        self.profile = analytic_profile(self.model, self.found.cluster, self.seq_len,
                                        with_micro_batches(self.job.micro_batch))
        for node in self.found.nodes:
            self.keeper_specs[node.name] = keeper_spec(node.node_id, node.name)
        self.committer = Committer(keeper_specs=self.keeper_specs, cloud_spec=self.job.storage,
                                   extra={"job": self.job.to_dict()}, gc_every=self.job.gc_every)
        report = self._launch(restore)
        self.state = "running"
        return report

    def _launch(self, restore: str | None, reuse: dict[str, list] | None = None, plan: dict | None = None) -> dict:
        """Plan on self.found, start the group, optionally restore, configure snapshots; phase seconds."""
        from autohet_ray.planner import plan_training
        from autohet_ray.plan.schema import plan_from_dict
        t0 = time.perf_counter()
        if plan is not None:
            self.plan = plan_from_dict(plan)
        elif self.job.plan is not None and self.plan is None:
            self.plan = plan_from_dict(self.job.plan)
        else:
            self.plan = plan_training(cluster=self.found.cluster, model=self.model, profile=self.profile,
                                      global_batch=self.job.global_batch, seq_len=self.seq_len,
                                      micro_batch=self.job.micro_batch,
                                      time_limit_s=self.job.plan_time_limit_s,
                                      schedules=self.job.schedules()).plan
        check_plan_fits(self.plan, self.found)
        t1 = time.perf_counter()
        reuse = reuse if reuse is not None else {}
        self.group = ElasticGroup(self.plan, self.found.node_ids, reuse=reuse)
        for leftover in (a for actors in reuse.values() for a in actors):
            ray.kill(leftover, no_restart=True)
        pacers, paced = self._pacers()
        setup = self.group.setup(model_spec=self.model.to_dict(), seed=self.job.seed, lr=self.job.lr,
                                 dtype=self.job.dtype, collective_timeout_s=self.job.collective_timeout_s,
                                 timeout_s=self.job.setup_timeout_s, pacers=pacers)
        t2 = time.perf_counter()
        restart_parts = {f"restart_{k}": v for k, v in setup.items() if k != "setup_s"}
        report = {"replan_s": t1 - t0, "restart_s": t2 - t1, **restart_parts, "plan": plan_summary(self.plan), **paced,
                  "num_ranks": len(self.group.actors), "reused_actors": self.group.num_reused}
        self.step_index = 0
        if restore:
            report |= self._restore(restore)
        self.snapped = set()
        if self.job.checkpoint:
            start = time.perf_counter()
            self._configure_snapshots()
            report["configure_snapshots_s"] = time.perf_counter() - start
        return report

    def _configure_snapshots(self) -> None:
        holdings = dict(enumerate(self.group.call("holdings", timeout_s=60)))
        pipeline_of = {rank: slot["pipeline"] for rank, slot in enumerate(self.group.slots)}
        rank_nodes = {rank: slot["node"] for rank, slot in enumerate(self.group.slots)}
        node_gpu = {n.name: n.device_type for n in self.found.nodes}
        copies = place_copies(tiling_holdings(holdings, pipeline_of), rank_nodes, node_gpu,
                              copies=1 + min(self.job.num_peers, len(node_gpu) - 1))
        cloud = self.job.storage if self.job.cloud_every else None
        refs = []
        for rank, actor in enumerate(self.group.actors):
            local = self.keeper_specs[rank_nodes[rank]]
            peers = {p: push_spec(self.keeper_specs[p], local) for p in sorted(copies.push[rank])}
            routes = {local["name"]: copies.local[rank], **{peers[p]["name"]: copies.push[rank][p] for p in peers}}
            if cloud:
                routes[cloud.get("name", "cloud")] = copies.upload[rank]
            ordered = {tier: sorted(items, key=lambda i: (i[0], i[1].offsets)) for tier, items in routes.items()}
            refs.append(actor.configure_snapshots.remote(routes=ordered, local=local, peers=list(peers.values()),
                                                         cloud=cloud, cloud_every=self.job.cloud_every))
        self.group.gather(refs, 60)

    def _restore(self, mode: str) -> dict:
        """Load the newest committed step whose chunks some tier still holds into every rank."""
        steps = self.committer.committed_steps(mode)
        if not steps:
            raise RecoveryFailed(f"no committed step in the {mode} tiers; nothing to resume from")
        rank_nodes = [slot["node"] for slot in self.group.slots]
        errors = []
        for step in steps:
            manifest = find_manifest(self.committer.manifest_tiers(mode), step)
            body = manifest.to_json()
            refs = [actor.restore.remote(manifest_json=body,
                                         tiers=tier_order(rank_nodes[r], self.keeper_specs, self.job.storage, mode))
                    for r, actor in enumerate(self.group.actors)]
            try:
                outs = self.group.gather(refs, self.job.setup_timeout_s)
            except GroupFailure as err:            # e.g. a chunk no tier holds: try the previous step
                errors.append(f"step {step}: {err}")
                continue
            self.step_index = step
            return {"restored_step": step, "mode": mode, "skipped_steps": errors, **merge_restores(outs)}
        raise RecoveryFailed("no committed step could be restored: " + "; ".join(errors))

    # -- training --------------------------------------------------------------------------------------------
    def step(self, fault_hook=None) -> dict:
        """One training step (and the commit of the previous snapshot meanwhile). On a failure: recover,
        and return the metrics of the first step after recovery (with "recovery" attached)."""
        assert self.state == "running", self.state
        try:
            return self._step_once(fault_hook)
        except GroupFailure as failure:
            return self.recover(failure, mode=self.restore_mode)

    def _step_once(self, fault_hook=None) -> dict:
        job, group = self.job, self.group
        batch = ray.put(synthetic_batch(vocab_size=self.model.vocab_size, global_batch=job.global_batch,
                                        seq_len=self.seq_len, seed=job.seed, step=self.step_index))
        start = time.perf_counter()
        snap = self.snapshots and job.checkpoint
        refs = [a.train_step.remote(batch, snapshot=snap) for a in group.actors]
        self._inflight = refs
        prev = self.step_index
        fresh = self._snapshotted(prev) and prev not in self.committer.committed
        fast = [a.fast_records.remote(prev) for a in group.actors] if fresh else []
        if fault_hook is not None:
            fault_hook(self)
        if fast:
            self.committer.commit_fast(prev, group.gather(fast, 120))
            if self._is_cloud_step(prev):
                self.committer.add_cloud(prev, [a.cloud_records.remote(prev) for a in group.actors])
            self.committer.poll_cloud()
            self.committer.maybe_collect(prev)
        outs = group.gather(refs)
        wall = time.perf_counter() - start
        self.step_index += 1
        if snap:
            self.snapped.add(self.step_index)
        metrics = {"step": self.step_index, "loss": outs[0]["loss"], "grad_norm": outs[0]["grad_norm"],
                   "wall_s": wall, "snapshot_copy_s": max(o.get("snapshot_copy_s", 0.0) for o in outs),
                   "snapshot_wait_s": max(o.get("snapshot_wait_s", 0.0) for o in outs),
                   "compute_s": max(o["timings"]["step"] for o in outs)}
        self.history.append(metrics)
        return metrics

    def _snapshotted(self, step: int) -> bool:
        """Whether the live group took a snapshot of `step` (it snapshots every step it computed)."""
        return step in self.snapped

    def _pacers(self) -> tuple[list[dict] | None, dict]:
        """Per rank, the emulated clock of the plan's devices (None when the job is not paced); the scale is
        fixed at the first launch, so re-plans keep one clock."""
        from autohet_ray.orchestrate.pacer import rank_pacers
        if not (self.job.time_scale or self.job.iteration_wall_s):
            return None, {}
        pacers, self.time_scale, predicted = rank_pacers(
            self.plan, self.found.cluster, self.model, self.profile,
            time_scale=self.time_scale or self.job.time_scale, iteration_wall_s=self.job.iteration_wall_s)
        return pacers, {"time_scale": self.time_scale, "predicted_iteration_s": predicted}

    def set_cloud_every(self, steps: int) -> None:
        """Change the cloud cadence between steps (0: node stores only); the last step is flushed first."""
        from dataclasses import replace
        assert self.state == "running", self.state
        self.flush()
        self.job = replace(self.job, cloud_every=steps)
        self._configure_snapshots()

    def _is_cloud_step(self, step: int) -> bool:
        return bool(self.job.cloud_every) and step % self.job.cloud_every == 0

    def flush(self, timeout_s: float = 600.0) -> dict:
        """Commit the last snapshot everywhere (a spot notice, or before stopping): the fast lane, then the
        cloud upload of every pending step (and of the last step, uploaded now if it was not a cloud step)."""
        step = self.step_index
        if self._snapshotted(step) and step not in self.committer.committed:
            self.committer.commit_fast(step, self.group.call("fast_records", step, timeout_s=timeout_s))
            if self._is_cloud_step(step):
                self.committer.add_cloud(step, [a.cloud_records.remote(step) for a in self.group.actors])
        self.committer.poll_cloud(wait=True, timeout_s=timeout_s)
        return {"committed": self.committer.committed[-1:], "cloud_committed": self.committer.cloud_committed[-1:]}

    # -- spot notices -----------------------------------------------------------------------------------------
    def check_notices(self, board=None) -> dict | None:
        """Act on spot notices (the watchers' NoticeBoard) and on Ray's drain signal between steps: flush a
        checkpoint, acknowledge (the watcher then drains its node), and re-plan without the noticed nodes, so
        no step is lost. None when nothing is pending."""
        from autohet_ray.orchestrate.spot import draining_nodes
        assert self.state == "running", self.state
        pending = set(ray.get(board.pending.remote())) if board is not None else set()
        names = {n.node_id: n.name for n in self.found.nodes}
        noticed = sorted({names[i] for i in pending | set(draining_nodes()) if i in names})
        if not noticed and not pending:
            return None
        start = time.perf_counter()
        self.flush()
        flush_s = time.perf_counter() - start
        for node_id in pending:
            ray.get(board.ack.remote(node_id))
        if not noticed:
            return {"nodes": [], "flush_s": flush_s}
        self.draining.update(i for i, name in names.items() if name in noticed)
        completed = self.step_index
        report = self.replan(reason=f"spot notice: node(s) {noticed} will be preempted")
        for node in noticed:
            self.committer.drop_keeper(node)
            self.keeper_specs.pop(node, None)
        report |= {"nodes": noticed, "flush_s": flush_s, "lost_steps": completed - report["restored_step"]}
        return report

    def check_joins(self, plan: dict | None = None) -> dict | None:
        """Re-plan onto nodes of the cluster file that joined since the last plan (replacement spot nodes the
        autoscaler brought); None when none joined. `plan`: run this plan instead of planning."""
        assert self.state == "running", self.state
        current = {n.name for n in self.found.nodes}
        dead = set(self._dead_nodes())
        joined = sorted(n.name for n in self.base_cluster.nodes if n.name not in current | dead)
        if not joined:
            return None
        return {"joined": joined, **self.replan(reason=f"node(s) {joined} joined", plan=plan)}

    # -- recovery --------------------------------------------------------------------------------------------
    def mark_fault(self) -> None:
        """Tests and benchmarks note when they inject a failure (detection is timed from here)."""
        self.fault_at = time.perf_counter()

    def recover(self, failure: GroupFailure, *, mode: str = "local_first") -> dict:
        seen_at = time.perf_counter()
        self.state = "recovering"
        t0 = self.fault_at or seen_at
        lost = self._detect(failure)
        detect_s = time.perf_counter() - t0
        completed = self.step_index
        salvage_start = time.perf_counter()
        reuse = self.group.salvage(getattr(self, "_inflight", []), set(lost["dead_ranks"]))
        salvage_phases = {f"salvage_{k}": v for k, v in self.group.salvage_phases.items()}
        self.committer.forget_pending()
        for node in lost["lost_nodes"]:
            self.committer.drop_keeper(node)
            self.keeper_specs.pop(node, None)
        self.lost += lost["lost_nodes"]
        salvage_s = time.perf_counter() - salvage_start
        report = self.replan(mode=mode, reason=lost["message"], reuse=reuse)
        report |= {"detect_s": detect_s, "step_failed_s": seen_at - t0, "salvage_s": salvage_s,
                   **salvage_phases, **lost,
                   "lost_steps": completed - report["restored_step"]}
        report["total_s"] = time.perf_counter() - t0       # every phase, and whatever lies between them
        self.recoveries[-1] = report
        self.fault_at = None
        return {**self.history[-1], "recovery": report}

    def replan(self, *, mode: str = "local_first", reason: str = "requested",
               reuse: dict[str, list] | None = None, plan: dict | None = None) -> dict:
        """Re-plan on the live nodes of the cluster file (also when nodes rejoined; `plan`: run this plan
        instead of planning), restart (reusing the live group's actors on surviving nodes), restore, step."""
        self.state = "replanning"
        if self.group is not None and self.group.actors:
            self.flush()
            reuse = self.group.salvage([], set())
        discover_start = time.perf_counter()
        self.found = discover(without_nodes(self.base_cluster, self._dead_nodes()))
        for node in self.found.nodes:
            if node.name not in self.keeper_specs:          # a replacement node: a keeper of its own
                self.keeper_specs[node.name] = keeper_spec(node.node_id, node.name)
                self.committer.keepers[node.name] = _build(self.keeper_specs[node.name])
        discover_s = time.perf_counter() - discover_start
        report = {"reason": reason, "discover_s": discover_s, **self._launch(mode, reuse, plan)}
        self.recoveries.append(report)
        self.state = "running"
        start = time.perf_counter()
        self._step_once()
        report["first_step_s"] = time.perf_counter() - start
        return report

    def _dead_nodes(self) -> list[str]:
        """Nodes of the cluster file with no live Ray node (alive, raylet not refusing) that is not draining or
        already found lost. One `ray.nodes()` call and one probe per node."""
        from autohet_ray.orchestrate.liveness import refused_raylets
        alive = [n for n in ray.nodes() if n["Alive"]]
        refused = refused_raylets(alive)
        live = [n for n in alive if n["NodeID"] not in refused]
        usable = lambda node_id: node_id is not None and node_id not in self.draining | self.gone  # noqa: E731
        return [n.name for n in self.base_cluster.nodes if not usable(self._node_id(n.name, live))]

    def _node_id(self, name: str, live: list[dict]) -> str | None:
        """The live node (of `live`, entries of `ray.nodes()`) named `name`, a non-draining one first (a
        replacement may join before the drained node is gone)."""
        ids = [raw["NodeID"] for raw in live if (raw.get("Labels") or {}).get("autohet.io/node") == name]
        return min(ids, key=lambda i: i in self.draining | self.gone, default=None)

    def _detect(self, failure: GroupFailure) -> dict:
        """Name the cause: a lost node of the plan (Ray marks it dead, or its raylet refuses connections, which
        is conclusive and faster than Ray's health checks; a raylet that only stays silent counts once the
        node's stage actors are silent too), or a dead stage actor on a node whose keeper still answers."""
        from autohet_ray.orchestrate.liveness import keeper_alive, probe
        deadline = time.perf_counter() + self.job.detect_timeout_s
        ids = self.found.node_ids
        plan_nodes = sorted({s["node"] for s in self.group.slots})
        while time.perf_counter() < deadline:
            raw = {n["NodeID"]: n for n in ray.nodes()}
            verdicts = {node: "dead" if not raw.get(ids[node], {}).get("Alive") else
                        probe((raw[ids[node]]["NodeManagerAddress"], int(raw[ids[node]]["NodeManagerPort"])))
                        for node in plan_nodes}
            lost = {node for node, v in verdicts.items() if v in ("dead", "refused")}
            dead = []
            if not lost:
                dead, silent = self.group.ping(timeout_s=0.25)
                node_of = lambda ranks: {self.group.slots[r]["node"] for r in ranks}  # noqa: E731
                lost = {node for node in node_of(silent) | node_of(dead) if verdicts[node] == "silent"}
                for node in sorted(node_of(dead) - lost):    # the node lives: is it only the actor?
                    verdict = keeper_alive(ids[node])
                    if verdict is None:                      # undecided: ask again
                        dead = []
                    elif not verdict:
                        lost.add(node)
            if lost or dead:
                self.gone |= {ids[node] for node in lost}
                return self._named_failure(sorted(lost), dead, failure)
            time.sleep(0.2)
        raise RecoveryFailed(f"a step failed but Ray reports no lost node or dead actor within "
                             f"{self.job.detect_timeout_s:g} s: {failure}")

    def _named_failure(self, lost_nodes: list[str], dead: list[int], failure: GroupFailure) -> dict:
        ranks = [r for r, s in enumerate(self.group.slots) if s["node"] in lost_nodes] or dead
        named = "; ".join(self.group.describe(r) for r in ranks)
        what = f"lost node(s) {lost_nodes}" if lost_nodes else "dead stage actor(s)"
        return {"lost_nodes": lost_nodes, "dead_ranks": ranks, "message": f"{what}: {named} (first error: {failure})"}

    def close(self) -> None:
        if self.committer is not None:
            self.committer.close()
        if self.group is not None:
            self.group.kill()
            self.group = None
        for spec in self.keeper_specs.values():
            stop_keeper(spec["node_id"])
        self.state = "closed"


def _build(spec: dict):
    from autohet_ray.orchestrate.elastic_tiers import build_tier
    return build_tier(spec, keeper_timeout_s=10.0)
