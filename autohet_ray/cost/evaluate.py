"""Iteration time and per-device peak memory of any plan (pure and deterministic).

Each stage's iteration = its last backward in the (event-simulated) 1F1B timeline of its pipeline, then its
layer-wise gradient all-reduces across pipelines (each starting once all holders are done, so later stages
sync while earlier ones cool down), then its optimizer step; the iteration ends with the slowest stage.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from autohet_ray import ConfigError
from autohet_ray.cluster.spec import Cluster
from autohet_ray.cost.pipeline import in_flight
from autohet_ray.cost.timeline import simulate
from autohet_ray.cost.sync import gradient_sync_times, sync_buckets, sync_end_times
from autohet_ray.cost.terms import (OPTIMIZER_BYTES_PER_PARAM, GroupCostTable, activation_message_bytes,
                                    inter_link, intra_link, p2p_time)
from autohet_ray.model.spec import ModelSpec
from autohet_ray.plan.schema import Plan, Predicted
from autohet_ray.plan.validate import validate_plan
from autohet_ray.profile.db import ProfileDB


@dataclass(frozen=True, kw_only=True)
class Evaluation:
    feasible: bool
    reason: str
    iteration_time_s: float
    samples_per_s: float
    pipeline_times_s: tuple[float, ...]
    stage_times_s: tuple[tuple[float, ...], ...]
    link_times_s: tuple[tuple[float, ...], ...]
    sync_time_s: float
    optimizer_time_s: float
    memory_bytes: dict[str, int] = field(default_factory=dict)      # "node:gpu" -> peak bytes
    capacity_bytes: dict[str, int] = field(default_factory=dict)
    profile_kind: str = "analytic"

    def predicted(self) -> Predicted:
        return Predicted(iteration_time_s=self.iteration_time_s, samples_per_s=self.samples_per_s,
                         peak_memory_bytes=max(self.memory_bytes.values(), default=0),
                         peak_memory_bytes_per_device=dict(self.memory_bytes), profile_kind=self.profile_kind)


def plan_tables(plan: Plan, cluster: Cluster, model: ModelSpec, profile: ProfileDB,
                table: GroupCostTable | None = None) -> list[GroupCostTable]:
    """The cost table of each pipeline's micro-batch size (`table`: one already built, reused if it fits)."""
    tables = {table.micro_batch: table} if table is not None and table.seq_len == plan.seq_len else {}
    for k in range(len(plan.pipelines)):
        mb = plan.micro_batch_of(k)
        if mb not in tables:
            tables[mb] = GroupCostTable(model=model, cluster=cluster, profile=profile, micro_batch=mb,
                                        seq_len=plan.seq_len)
    return [tables[plan.micro_batch_of(k)] for k in range(len(plan.pipelines))]


def stage_link_time(plan: Plan, cluster: Cluster, profile: ProfileDB, model: ModelSpec, a, b,
                    micro_batch: int | None = None) -> float:
    """One activation transfer from stage a to stage b: NVLink/PCIe inside a node, the NIC between nodes."""
    msg = activation_message_bytes(model, micro_batch or plan.micro_batch, plan.seq_len)
    if a.node == b.node:
        return p2p_time(msg, intra_link(profile, cluster, a.device_type))
    return p2p_time(msg, inter_link(profile, cluster, a.node, b.node))


def evaluate_plan(plan: Plan, cluster: Cluster, model: ModelSpec, profile: ProfileDB,
                  table: GroupCostTable | None = None) -> Evaluation:
    """Price a plan; raises ConfigError if it is structurally invalid, reports infeasible memory in the result."""
    validate_plan(plan, cluster, model)
    tables = plan_tables(plan, cluster, model, profile, table)
    stage_times, link_times, pipe_times = [], [], []
    memory, capacity, opt_time = {}, {}, 0.0
    last_backward, opt_s = {}, {}
    for k, pipeline in enumerate(plan.pipelines):
        p, m, table = len(pipeline.stages), pipeline.num_microbatches, tables[k]
        times = []
        for j, stage in enumerate(pipeline.stages):
            gc = table.get(stage.device_type, stage.tp)
            first, last = j == 0, j == p - 1
            times.append(gc.stage_time(stage.num_layers, first, last))
            mem = gc.stage_memory(stage.num_layers, first, last, in_flight(j, p, m))
            params = gc.stage_params(stage.num_layers, first, last)
            opt_s[(k, j)] = params * OPTIMIZER_BYTES_PER_PARAM / gc.hbm_Bps
            opt_time = max(opt_time, opt_s[(k, j)])
            for d in stage.devices:
                memory[f"{stage.node}:{d}"] = mem
                capacity[f"{stage.node}:{d}"] = gc.capacity_bytes
        links = [stage_link_time(plan, cluster, profile, model, a, b, plan.micro_batch_of(k))
                 for a, b in zip(pipeline.stages, pipeline.stages[1:])]
        stage_times.append(tuple(times))
        link_times.append(tuple(links))
        fwd = [t * table.get(s.device_type, s.tp).layer_fwd_fraction for t, s in zip(times, pipeline.stages)]
        slots = simulate(fwd, [t - f for t, f in zip(times, fwd)], links, m)
        pipe_times.append(max(slot.end_s for slot in slots))
        for slot in slots:
            if slot.kind == "B" and slot.microbatch == m - 1:
                last_backward[(k, slot.stage)] = slot
    buckets = sync_buckets(plan, cluster, model, profile)
    sync = max(gradient_sync_times(plan, cluster, model, profile, buckets).values(), default=0.0)
    synced = sync_end_times(buckets,
                            lambda key, unit: _gradient_final(plan.pipelines[key[0]], key[1], tables[key[0]],
                                                                      last_backward[key], unit))
    iteration = max(synced[key] + opt_s[key] for key in synced)
    over = {d: memory[d] - capacity[d] for d in memory if memory[d] > capacity[d]}
    reason = ""
    if over:
        worst = max(over, key=over.get)
        reason = (f"out of memory on {worst}: needs {memory[worst] / 1e9:.1f} GB, "
                  f"{capacity[worst] / 1e9:.1f} GB usable ({over[worst] / 1e9:.1f} GB missing)")
    return Evaluation(feasible=not over, reason=reason, iteration_time_s=iteration,
                      samples_per_s=plan.global_batch / iteration, pipeline_times_s=tuple(pipe_times),
                      stage_times_s=tuple(stage_times), link_times_s=tuple(link_times), sync_time_s=sync,
                      optimizer_time_s=opt_time, memory_bytes=memory, capacity_bytes=capacity,
                      profile_kind=profile.kind)


def _gradient_final(pipeline, j: int, table: GroupCostTable, last_backward, unit) -> float:
    """When a unit's gradient is final on stage j: its last backward runs the head, then the layers from the
    last to the first, then the embedding, each taking its share of the stage's compute."""
    kind, lowest = unit
    if kind in ("stage", "embedding"):
        return last_backward.end_s
    stage = pipeline.stages[j]
    gc = table.get(stage.device_type, stage.tp)
    head = gc.head_s if j == len(pipeline.stages) - 1 else 0.0
    done = head if kind == "head" else head + (stage.layers[1] - lowest) * gc.layer_s
    total = gc.stage_time(stage.num_layers, j == 0, j == len(pipeline.stages) - 1)
    return last_backward.start_s + (last_backward.end_s - last_backward.start_s) * done / total


def price_plan(plan: Plan, cluster: Cluster, model: ModelSpec, profile: ProfileDB) -> Plan:
    """The plan with its `predicted` filled in; ConfigError if it does not fit in memory."""
    ev = evaluate_plan(plan, cluster, model, profile)
    if not ev.feasible:
        raise ConfigError(f"plan is infeasible: {ev.reason}")
    return plan.with_predicted(ev.predicted())
