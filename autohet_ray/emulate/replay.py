"""The emulated spot replay: an elastic job on an emulated Ray cluster whose nodes come and go as measured spot
traces say (one trace per GPU-type pool, scaled to the pool's nodes, on a compressed clock).

    with ReplayCluster(cluster, alive, system_config=...) as rc:
        out = run_replay(ctl, rc, actions, compression=C, notice_s=S, end_s=T)

A node leaves by being removed from Ray (`remove_node(allow_graceful=False)`: its raylet, workers and node store
die with it), mid-step, at the first step boundary after its trace time. With a notice lead S (trace seconds),
the node's fake instance-metadata endpoint (cloud/fake_imds.py) announces the termination S before (S / C wall
seconds before the removal, also where handling earlier events made the replay lag the trace): the node's
SpotWatcher reads it as on AWS, the controller flushes and re-plans without the node between steps, the
watcher drains it, and the removal later takes nothing the job still uses. A node joins by being added (a
fresh raylet, an empty store) and the controller re-plans onto it between steps (`check_joins`).
Trace time t maps to wall time t / C from the replay's start. No human input: the actions are the trace's.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import ray
from ray.cluster_utils import Cluster as RayTestCluster

from autohet_ray.checkpoint.node_store import sweep_node_stores
from autohet_ray.cloud.fake_imds import FakeImds
from autohet_ray.cluster.spec import Cluster
from autohet_ray.elastic.spot import start_board, start_watchers
from autohet_ray.emulate.cluster import EMULATED_OBJECT_STORE_BYTES, node_args
from autohet_ray.replay.emulated import NodeAction


class ReplayCluster:
    """A Ray test cluster of a head without GPUs (the driver, the notice board, the data preparation: it never
    leaves) and one emulated node per alive cluster-file node, each with its own fake metadata endpoint."""

    def __init__(self, cluster: Cluster, alive: list[str], *, system_config: dict | None = None, head_cpus: float = 1):
        self.cluster = cluster
        head = {"num_cpus": head_cpus, "num_gpus": 0, "include_dashboard": False,
                "object_store_memory": EMULATED_OBJECT_STORE_BYTES}
        if system_config:
            head["_system_config"] = system_config
        self.ray_cluster = RayTestCluster(initialize_head=True, head_node_args=head)
        self.handles: dict[str, object] = {}
        self.imds: dict[str, FakeImds] = {}
        self.seen: list[str] = []
        for name in alive:
            self.add(name, wait=False)
        self.ray_cluster.wait_for_nodes()
        ray.init(address=self.ray_cluster.address)

    def add(self, name: str, *, wait: bool = True) -> str:
        """Start node `name` (a new raylet and an empty node store) with a fresh metadata endpoint; its id."""
        assert name not in self.handles, name
        old = self.imds.pop(name, None)
        if old is not None:
            old.close()
        self.imds[name] = FakeImds()
        handle = self.ray_cluster.add_node(**node_args(self.cluster.node(name)))
        self.handles[name] = handle
        self.seen.append(handle.node_id)
        if wait:
            deadline = time.monotonic() + 60
            while not any(n["NodeID"] == handle.node_id and n["Alive"] for n in ray.nodes()):
                assert time.monotonic() < deadline, f"node {name} did not join"
                time.sleep(0.1)
        return handle.node_id

    def remove(self, name: str) -> None:
        """Kill node `name` at once (no graceful shutdown: its processes and node store are gone)."""
        handle = self.handles.pop(name)
        self.ray_cluster.remove_node(handle, allow_graceful=False)

    def notice(self, name: str, lead_wall_s: float) -> None:
        """Announce on the node's metadata endpoint that it is terminated in `lead_wall_s` wall seconds."""
        self.imds[name].post_notice(time.time() + lead_wall_s)

    def close(self) -> None:
        if ray.is_initialized():
            ray.shutdown()
        self.ray_cluster.shutdown()
        sweep_node_stores(self.seen)         # stores of nodes removed without their keeper's close
        for fake in self.imds.values():
            fake.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@dataclass
class ReplayLog:
    applied: list[dict]          # every action as applied: kind, node, event, trace time, wall time
    changes: list[dict]          # what the controller did: a recovery, a notice's re-plan, a join's re-plan
    segments: list[dict]         # wall-clock pieces with the cluster-file nodes alive (for the ideal)


class Replay:
    """Drives one controller through the actions: between steps it applies due actions, acts on notices and
    joins; removals due at a step boundary happen inside the next step (after its calls are sent)."""

    def __init__(self, ctl, rc: ReplayCluster, actions: list[NodeAction], *, compression: float,
                 alive: list[str], watch_interval_s: float = 1.0):
        self.ctl, self.rc, self.todo = ctl, rc, list(actions)
        self.compression, self.watch_interval_s = compression, watch_interval_s
        self.alive = set(alive)
        self.watched: set[str] = set()
        self.not_before: dict[str, float] = {}   # node -> wall time its notice's full lead has passed
        self.board = None
        self.log = ReplayLog(applied=[], changes=[], segments=[])
        self.t0 = None

    def trace_now(self) -> float:
        return (time.perf_counter() - self.t0) * self.compression

    def run(self, end_s: float, *, progress=None) -> ReplayLog:
        """Train until trace time `end_s` (and every action before it is applied)."""
        self.t0 = time.perf_counter()
        self.board = start_board(self.ctl.job_id)    # on the driver's node: the head, which never leaves
        self._segment()
        self._watch_new_nodes()
        while self.trace_now() < end_s or self.todo:
            removals = self._apply_due()
            self._between_steps(progress)
            metrics = self.ctl.step(fault_hook=self._remover(removals) if removals else None)
            if "recovery" in metrics:
                self._change("recovery", metrics["recovery"], metrics)
                self._watch_new_nodes()
            if progress:
                progress(metrics, self)
        self.log.segments[-1]["wall_end"] = time.perf_counter() - self.t0
        return self.log

    def _apply_due(self) -> list[NodeAction]:
        """Post due notices, add due nodes; the names whose removal is due (done by the next step)."""
        removals = []
        now, wall = self.trace_now(), time.perf_counter()
        while self.todo and self.todo[0].time_s <= now:
            head = self.todo[0]
            if removals and head.kind != "remove":
                break                              # later actions wait until the removals happened (next step)
            if head.kind == "remove" and wall < self.not_before.get(head.node, 0.0):
                break                              # a notice promises its lead, also when the replay lags
            action = self.todo.pop(0)
            if action.kind == "notice":
                lead_wall_s = (action.deadline_s - action.time_s) / self.compression
                self.rc.notice(action.node, lead_wall_s)
                self.not_before[action.node] = wall + lead_wall_s
            elif action.kind == "add":
                self.rc.add(action.node)
                self.alive.add(action.node)
                self._watch_new_nodes()        # from its start, as a node's own watcher would
            else:
                removals.append(action)
                continue                           # logged when it happens, inside the step
            self._applied(action, now)
        return removals

    def _remover(self, removals: list[NodeAction]):
        def remove(ctl) -> None:
            used = {s["node"] for s in ctl.group.slots}
            if used & {a.node for a in removals}:
                ctl.mark_fault()
            for action in removals:
                self.rc.remove(action.node)
                self.alive.discard(action.node)
                self.watched.discard(action.node)
                self._applied(action, self.trace_now(), in_plan=action.node in used)
            self._segment()
        return remove

    def _between_steps(self, progress) -> None:
        for kind, check in (("notice", lambda: self.ctl.check_notices(self.board)), ("join", self.ctl.check_joins)):
            report = check()
            if report is not None and report.get("plan"):
                first = self.ctl.step()                 # the first step on the new plan is part of the change
                self._change(kind, report, first)
                if "recovery" in first:                 # a loss during that step, recovered inside it
                    self._change("recovery", first["recovery"], first)
                self._watch_new_nodes()
                if progress:
                    progress(first, self)

    def _change(self, kind: str, report: dict, first_step: dict) -> None:
        entry = {"kind": kind, "wall_s": time.perf_counter() - self.t0, "trace_s": self.trace_now(),
                 "first_step_s": first_step["wall_s"], "step": first_step["step"],
                 **{k: v for k, v in report.items() if k not in ("earlier_rounds",)}}
        if kind == "recovery":     # the newest step committed before the loss (a restore keeps it in the list)
            entry["newest_committed"] = max(self.ctl.committer.committed, default=0)
        self.log.changes.append(entry)

    def _applied(self, action: NodeAction, now: float, **extra) -> None:
        self.log.applied.append({**asdict(action), "applied_trace_s": now,
                                 "wall_s": time.perf_counter() - self.t0, **extra})
        if action.kind == "add":
            self._segment()

    def _segment(self) -> None:
        wall = time.perf_counter() - self.t0
        if self.log.segments:
            self.log.segments[-1]["wall_end"] = wall
        self.log.segments.append({"wall_start": wall, "alive": sorted(self.alive)})

    def _watch_new_nodes(self) -> None:
        """A spot watcher of the job on every live node, polling that node's own metadata endpoint (a node that
        just joined is watched before the controller may plan onto it)."""
        for name in sorted(set(self.rc.handles) - self.watched):
            start_watchers([self.rc.handles[name].node_id], job_id=self.ctl.job_id,
                           provider=self.ctl.job.spot_provider, url=self.rc.imds[name].url,
                           interval_s=self.watch_interval_s, flush_timeout_s=60.0)
            self.watched.add(name)
