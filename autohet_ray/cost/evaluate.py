"""Iteration time and per-device peak memory of any plan (pure and deterministic).

Each stage's iteration = its last gradient action (the last backward; under a split-backward schedule the
last weight-gradient action) in the event-simulated timeline of its pipeline's schedule, then its layer-wise
gradient all-reduces across pipelines (each starting once all holders are done, so later stages sync while
earlier ones cool down), then its optimizer step; the iteration ends with the slowest stage.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from autohet_ray import ConfigError
from autohet_ray.cluster.spec import Cluster
from autohet_ray.cost.timeline import simulate_cached
from autohet_ray.cost.sync import gradient_sync_times, sync_buckets, sync_end_times
from autohet_ray.cost.terms import (OPTIMIZER_BYTES_PER_PARAM, GroupCostTable, activation_message_bytes,
                                    inter_link, intra_link, p2p_time)
from autohet_ray.model.spec import ModelSpec
from autohet_ray.plan.schedule import PLAN_SCHEDULES, SPLIT_BACKWARD, in_flight_bound
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
    sync_exposed_s: dict[str, float] = field(default_factory=dict)
    """"node:gpu" -> seconds its gradient sync runs past its last gradient action (the part not overlapped)."""

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
                  table: GroupCostTable | None = None, buckets: dict | None = None) -> Evaluation:
    """Price a plan; raises ConfigError if it is structurally invalid, reports infeasible memory in the result.
    `buckets`: the plan's `sync_buckets` when already computed (they do not depend on the schedule)."""
    validate_plan(plan, cluster, model)
    tables = plan_tables(plan, cluster, model, profile, table)
    stage_times, link_times, pipe_times = [], [], []
    memory, capacity, opt_time = {}, {}, 0.0
    last_grad, opt_s = {}, {}
    split = plan.schedule in SPLIT_BACKWARD
    for k, pipeline in enumerate(plan.pipelines):
        p, m, table = len(pipeline.stages), pipeline.num_microbatches, tables[k]
        parts = []                     # per stage: (forward, backward, weight-gradient) seconds per micro-batch
        for j, stage in enumerate(pipeline.stages):
            gc = table.get(stage.device_type, stage.tp)
            first, last = j == 0, j == p - 1
            parts.append(gc.stage_split(stage.num_layers, first, last, split))
            mem = gc.stage_memory(stage.num_layers, first, last, in_flight_bound(plan.schedule, p, j, m))
            params = gc.stage_params(stage.num_layers, first, last)
            opt_s[(k, j)] = params * OPTIMIZER_BYTES_PER_PARAM / gc.hbm_Bps
            opt_time = max(opt_time, opt_s[(k, j)])
            for d in stage.devices:
                memory[f"{stage.node}:{d}"] = mem
                capacity[f"{stage.node}:{d}"] = gc.capacity_bytes
        links = [stage_link_time(plan, cluster, profile, model, a, b, plan.micro_batch_of(k))
                 for a, b in zip(pipeline.stages, pipeline.stages[1:])]
        stage_times.append(tuple(sum(part) for part in parts))
        link_times.append(tuple(links))
        slots = simulate_cached(tuple(f for f, _, _ in parts), tuple(b + (0.0 if split else w) for _, b, w in parts),
                                tuple(links), m, plan.schedule, tuple(w for _, _, w in parts) if split else None)
        pipe_times.append(max(slot.end_s for slot in slots))
        for slot in slots:
            if slot.kind == ("W" if split else "B") and slot.microbatch == m - 1:
                last_grad[(k, slot.stage)] = slot
    buckets = sync_buckets(plan, cluster, model, profile) if buckets is None else buckets
    sync = max(gradient_sync_times(plan, cluster, model, profile, buckets).values(), default=0.0)
    synced = sync_end_times(buckets,
                            lambda key, unit: _gradient_final(plan.pipelines[key[0]], key[1], tables[key[0]],
                                                                      last_grad[key], unit, split))
    iteration = max(synced[key] + opt_s[key] for key in synced)
    exposed = {f"{stage.node}:{d}": synced[(k, j)] - last_grad[(k, j)].end_s
               for k, pipeline in enumerate(plan.pipelines) for j, stage in enumerate(pipeline.stages)
               for d in stage.devices}
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
                      profile_kind=profile.kind, sync_exposed_s=exposed)


def _gradient_final(pipeline, j: int, table: GroupCostTable, last, unit, split: bool) -> float:
    """When a unit's gradient is final on stage j: its last gradient action (`last`: the last backward, or
    the last W) runs the head, then the layers from the last to the first, then the embedding, each taking
    its share of that action (under a split schedule the embedding's gradient is final before the last W)."""
    kind, lowest = unit
    if kind == "stage":
        return last.end_s
    if kind == "embedding":
        return last.start_s if split else last.end_s
    stage = pipeline.stages[j]
    gc = table.get(stage.device_type, stage.tp)
    is_last = j == len(pipeline.stages) - 1
    head, per_layer = (gc.head_wgrad_s, gc.layer_wgrad_s) if split else (gc.head_s, gc.layer_s)
    head = head if is_last else 0.0
    done = head if kind == "head" else head + (stage.layers[1] - lowest) * per_layer
    total = head + stage.num_layers * per_layer if split else gc.stage_time(stage.num_layers, j == 0, is_last)
    return last.start_s + (last.end_s - last.start_s) * done / total if total > 0 else last.end_s


def best_schedule(plan: Plan, cluster: Cluster, model: ModelSpec, profile: ProfileDB,
                  table: GroupCostTable | None = None,
                  schedules: tuple[str, ...] = PLAN_SCHEDULES) -> tuple[Plan, Evaluation]:
    """The plan under the fastest of `schedules` that fits in memory (under the first if none fits). Split-
    backward schedules are skipped when every pipeline has one stage (no bubble to fill; 1F1B is as fast)."""
    if all(len(p.stages) == 1 for p in plan.pipelines) and any(s not in SPLIT_BACKWARD for s in schedules):
        schedules = tuple(s for s in schedules if s not in SPLIT_BACKWARD)
    buckets = sync_buckets(plan, cluster, model, profile)
    priced = []
    for schedule in schedules:
        candidate = plan.with_schedule(schedule)
        priced.append((candidate, evaluate_plan(candidate, cluster, model, profile, table, buckets)))
    fitting = [entry for entry in priced if entry[1].feasible]
    return min(fitting, key=lambda entry: entry[1].iteration_time_s) if fitting else priced[0]


def price_plan(plan: Plan, cluster: Cluster, model: ModelSpec, profile: ProfileDB) -> Plan:
    """The plan with its `predicted` filled in; ConfigError if it does not fit in memory."""
    ev = evaluate_plan(plan, cluster, model, profile)
    if not ev.feasible:
        raise ConfigError(f"plan is infeasible: {ev.reason}")
    return plan.with_predicted(ev.predicted())
