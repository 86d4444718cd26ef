"""The best plan for an availability state, from the real planner, timed; one planning per state.

The alive nodes of a pool are the first k nodes of that GPU type in the cluster file (only counts matter to
the planner). The planner runs as the controller's re-plan does: `plan_training` with the job's time limit,
on the profile the job started with (here the analytic one for the whole cluster).
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Callable

from autohet_ray import ConfigError
from autohet_ray.cluster.spec import Cluster, cluster_from_dict
from autohet_ray.model.costs import layer_params
from autohet_ray.model.spec import ModelSpec
from autohet_ray.plan.schema import Plan
from autohet_ray.profile.db import ProfileDB
from autohet_ray.replay.phases import CHECKPOINT_BYTES_PER_PARAM
from autohet_ray.replay.timeline import State


@dataclass(frozen=True, kw_only=True)
class PlannedState:
    state: State
    samples_per_s: float            # the cost model's prediction for the plan (0: nothing fits)
    iteration_time_s: float
    nodes_used: tuple[int, ...]     # nodes of each pool the plan runs on
    bytes_per_node: float           # checkpointed state on the plan's fullest node
    planning_s: float               # wall time of the planner for this state (measured)
    hit_time_limit: bool = False
    gpus_used: int = 0
    planning_cpu_s: float | None = None   # CPU time of the planner (the wall time above includes waiting for CPU)
    plan: dict | None = None        # the plan (Plan.to_dict without its prediction), to derive figures from
    snapshot_bytes_per_gpu: float | None = None   # bytes the busiest rank snapshots per step (see spot_replay)

    def fits_in(self, state: State) -> bool:
        """The plan's nodes are all still alive in `state` (same-type nodes are interchangeable)."""
        return self.samples_per_s > 0 and all(u <= k for u, k in zip(self.nodes_used, state))


Planner = Callable[[State], PlannedState]


class PlanCache:
    """Plans each state once and remembers it; `planner` does the work (the real planner, or a test's)."""

    def __init__(self, planner: Planner, progress: Callable[[str], None] | None = None):
        self.planner, self.progress = planner, progress
        self.plans: dict[State, PlannedState] = {}

    def get(self, state: State) -> PlannedState:
        if state not in self.plans:
            planned = self.planner(state)
            assert planned.state == state
            self.plans[state] = planned
            if self.progress:
                self.progress(f"planned {state}: {planned.samples_per_s:.1f} samples/s on {planned.gpus_used} "
                              f"GPUs in {planned.planning_s:.1f} s ({len(self.plans)} states)")
        return self.plans[state]

    def save(self, path: str, meta: dict) -> None:
        """The plans with the request they answer (`meta`), so a later replay can reuse them."""
        rows = [asdict(p) | {"state": list(p.state), "nodes_used": list(p.nodes_used)} for p in self.plans.values()]
        with open(path, "w") as f:
            json.dump({"meta": meta, "plans": rows}, f)

    def load(self, path: str, meta: dict) -> None:
        """Plans saved by `save` for the same request; their planning times are the ones measured then."""
        with open(path) as f:
            saved = json.load(f)
        if saved.get("meta") != meta:
            raise ConfigError(f"{path} holds plans for {saved.get('meta')}, not for {meta}")
        for row in saved["plans"]:
            planned = PlannedState(**(row | {"state": tuple(row["state"]), "nodes_used": tuple(row["nodes_used"])}))
            self.plans[planned.state] = planned


def sub_cluster(cluster: Cluster, pools: tuple[str, ...], state: State) -> Cluster | None:
    """The cluster with the first state[i] nodes of pool i's GPU type; None when no node is alive."""
    raw = cluster.to_dict()
    keep, taken = [], dict.fromkeys(pools, 0)
    for node in raw["nodes"]:
        device = node["device"]
        if device not in taken:
            raise ConfigError(f"node {node['name']} has GPU type {device}, which no pool covers; pools: {pools}")
        if taken[device] < state[pools.index(device)]:
            keep.append(node)
            taken[device] += 1
    if not keep:
        return None
    raw["nodes"] = keep
    return cluster_from_dict(raw)


def pool_sizes(cluster: Cluster, pools: tuple[str, ...]) -> tuple[int, ...]:
    return tuple(sum(1 for n in cluster.nodes if n.device == p) for p in pools)


def plan_bytes_per_node(plan: Plan, model: ModelSpec) -> float:
    """Checkpointed bytes on the plan's fullest node (a TP group holds its stage's parameters once)."""
    per_node: dict[str, float] = {}
    for pipe in plan.pipelines:
        for j, stage in enumerate(pipe.stages):
            params = stage.num_layers * layer_params(model, "layer")
            params += layer_params(model, "embedding") if j == 0 else 0
            params += layer_params(model, "head") if j == len(pipe.stages) - 1 else 0
            per_node[stage.node] = per_node.get(stage.node, 0.0) + params * CHECKPOINT_BYTES_PER_PARAM
    return max(per_node.values())


def without_prediction(plan: dict) -> dict:
    """The plan's structure (the replay keeps the prediction's figures in PlannedState)."""
    return {k: v for k, v in plan.items() if k != "predicted"}


def real_planner(*, cluster: Cluster, pools: tuple[str, ...], model: ModelSpec, profile: ProfileDB,
                 global_batch: int, seq_len: int, time_limit_s: float) -> Planner:
    from autohet_ray.planner import plan_training  # lazy: PySCIPOpt; a replay may plan without it

    def plan(state: State) -> PlannedState:
        sub = sub_cluster(cluster, pools, state)
        start, cpu = time.perf_counter(), time.process_time()
        try:
            result = None if sub is None else plan_training(
                cluster=sub, model=model, profile=profile, global_batch=global_batch, seq_len=seq_len,
                time_limit_s=time_limit_s)
        except ConfigError:              # the model does not fit on what is alive: the job waits
            result = None
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        if result is None:
            return PlannedState(state=state, samples_per_s=0.0, iteration_time_s=float("inf"),
                                nodes_used=(0,) * len(pools), bytes_per_node=0.0, planning_s=wall, planning_cpu_s=cpu)
        device_of = {n.name: n.device for n in sub.nodes}
        used = {s.node for p in result.plan.pipelines for s in p.stages}
        return PlannedState(
            state=state, samples_per_s=result.evaluation.samples_per_s,
            iteration_time_s=result.evaluation.iteration_time_s,
            nodes_used=tuple(sum(1 for n in used if device_of[n] == p) for p in pools),
            bytes_per_node=plan_bytes_per_node(result.plan, model), planning_s=wall, planning_cpu_s=cpu,
            hit_time_limit=result.hit_time_limit, plan=without_prediction(result.plan.to_dict()),
            gpus_used=sum(s.tp for p in result.plan.pipelines for s in p.stages))
    return plan
