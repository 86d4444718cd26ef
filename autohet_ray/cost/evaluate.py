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
from autohet_ray.cost.memory import stage_peak_memory
from autohet_ray.cost.sharding import shard_ways, sharded_buckets
from autohet_ray.profile.precision import profile_dtype, profile_precision
from autohet_ray.cost.timeline import simulate_cached
from autohet_ray.cost.sync import gradient_sync_times, sync_buckets, sync_end_times
from autohet_ray.cost.terms import (GroupCostTable, activation_message_bytes, boundary_seconds, inter_link, intra_link,
                                     plan_tables)
from autohet_ray.model.spec import ModelSpec
from autohet_ray.plan.schedule import PLAN_SCHEDULES, SPLIT_BACKWARD
from autohet_ray.plan.schema import LinkTimes, Plan, Predicted, StageTimes
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
    back_link_times_s: tuple[tuple[float, ...], ...] = ()     # per boundary, a gradient back (link_times_s: forward)
    stage_parts_s: tuple[tuple[tuple[float, float, float], ...], ...] = ()   # per stage: (F, B, W) of one micro-batch
    stage_sync_end_s: tuple[tuple[float, ...], ...] = ()      # per stage: when its gradients are synchronized
    stage_optimizer_s: tuple[tuple[float, ...], ...] = ()
    dtype: str = ""

    def predicted(self) -> Predicted:
        stages = tuple(tuple(StageTimes(fwd_s=f, bwd_s=b, wgrad_s=w, sync_end_s=sync, optimizer_s=opt)
                             for (f, b, w), sync, opt in zip(parts, syncs, opts))
                       for parts, syncs, opts in zip(self.stage_parts_s, self.stage_sync_end_s,
                                                     self.stage_optimizer_s))
        links = tuple(tuple(LinkTimes(activation_s=a, gradient_s=g) for a, g in zip(fwd, back))
                      for fwd, back in zip(self.link_times_s, self.back_link_times_s))
        return Predicted(iteration_time_s=self.iteration_time_s, samples_per_s=self.samples_per_s,
                         peak_memory_bytes=max(self.memory_bytes.values(), default=0),
                         peak_memory_bytes_per_device=dict(self.memory_bytes), profile_kind=self.profile_kind,
                         stages=stages, links=links, capacity_bytes_per_device=dict(self.capacity_bytes),
                         dtype=self.dtype)


def stage_link_times(plan: Plan, cluster: Cluster, profile: ProfileDB, model: ModelSpec, a, b,
                     micro_batch: int | None = None) -> tuple[float, float]:
    """(an activation from stage a to stage b, its gradient back) in seconds, as the runtime's bridge moves
    them (terms.boundary_seconds): over NVLink/PCIe inside a node, the NIC between nodes."""
    elem = profile_precision(profile).activation_bytes
    msg = activation_message_bytes(model, micro_batch or plan.micro_batch, plan.seq_len, elem)
    if a.node == b.node:
        wire, shared = intra_link(profile, cluster, a.device_type), False
    else:
        wire, shared = inter_link(profile, cluster, a.node, b.node), True
    forward = boundary_seconds(msg, a.tp, b.tp, wire, shared, intra_link(profile, cluster, b.device_type))
    backward = boundary_seconds(msg, b.tp, a.tp, wire, shared, intra_link(profile, cluster, a.device_type))
    return forward, backward


def stage_link_time(plan: Plan, cluster: Cluster, profile: ProfileDB, model: ModelSpec, a, b,
                    micro_batch: int | None = None) -> float:
    """One activation transfer from stage a to stage b (see stage_link_times)."""
    return stage_link_times(plan, cluster, profile, model, a, b, micro_batch)[0]


def evaluate_plan(plan: Plan, cluster: Cluster, model: ModelSpec, profile: ProfileDB,
                  table: GroupCostTable | None = None, buckets: dict | None = None) -> Evaluation:
    """Price a plan; raises ConfigError if it is structurally invalid, reports infeasible memory in the result.
    `buckets`: the plan's `sync_buckets` when already computed (they do not depend on the schedule)."""
    validate_plan(plan, cluster, model)
    tables = plan_tables(plan, cluster, model, profile, table)
    stage_times, link_times, back_times, pipe_times, all_parts = [], [], [], [], []
    memory, capacity, opt_time = {}, {}, 0.0
    last_grad, opt_s = {}, {}
    split = plan.schedule in SPLIT_BACKWARD
    for k, pipeline in enumerate(plan.pipelines):
        p, m, table = len(pipeline.stages), pipeline.num_microbatches, tables[k]
        parts = []                     # per stage: (forward, backward, weight-gradient) seconds per micro-batch
        for j, stage in enumerate(pipeline.stages):
            gc = table.get(stage.device_type, stage.tp, stage.recompute, shard_ways(plan, k, j, model))
            first, last = j == 0, j == p - 1
            parts.append(gc.stage_split(stage.num_layers, first, last, split))
            mem = stage_peak_memory(gc, plan.schedule, p, j, m, stage.num_layers)
            opt_s[(k, j)] = gc.optimizer_s(stage.num_layers, first, last)
            opt_time = max(opt_time, opt_s[(k, j)])
            for d in stage.devices:
                memory[f"{stage.node}:{d}"] = mem
                capacity[f"{stage.node}:{d}"] = gc.capacity_bytes
        both = [stage_link_times(plan, cluster, profile, model, a, b, plan.micro_batch_of(k))
                for a, b in zip(pipeline.stages, pipeline.stages[1:])]
        links, back = tuple(f for f, _ in both), tuple(g for _, g in both)
        stage_times.append(tuple(sum(part) for part in parts))
        link_times.append(links)
        back_times.append(back)
        all_parts.append(tuple(parts))
        slots = simulate_cached(tuple(f for f, _, _ in parts), tuple(b + (0.0 if split else w) for _, b, w in parts),
                                links, m, plan.schedule, tuple(w for _, _, w in parts) if split else None,
                                None if back == links else back)
        pipe_times.append(max(slot.end_s for slot in slots))
        for slot in slots:
            if slot.kind == ("W" if split else "B") and slot.microbatch == m - 1:
                last_grad[(k, slot.stage)] = slot
    buckets = sync_buckets(plan, cluster, model, profile) if buckets is None else buckets
    buckets, gather_s = sharded_buckets(plan, buckets, profile)
    for key, seconds in gather_s.items():                 # the new weights' all-gather follows the update
        opt_s[key] += seconds
        opt_time = max(opt_time, opt_s[key])
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
    shape = [range(len(p.stages)) for p in plan.pipelines]
    return Evaluation(feasible=not over, reason=reason, iteration_time_s=iteration,
                      samples_per_s=plan.global_batch / iteration, pipeline_times_s=tuple(pipe_times),
                      stage_times_s=tuple(stage_times), link_times_s=tuple(link_times), sync_time_s=sync,
                      optimizer_time_s=opt_time, memory_bytes=memory, capacity_bytes=capacity,
                      profile_kind=profile.kind, sync_exposed_s=exposed, back_link_times_s=tuple(back_times),
                      stage_parts_s=tuple(all_parts),
                      stage_sync_end_s=tuple(tuple(synced[(k, j)] for j in js) for k, js in enumerate(shape)),
                      stage_optimizer_s=tuple(tuple(opt_s[(k, j)] for j in js) for k, js in enumerate(shape)),
                      dtype=profile_dtype(profile))


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
    gc = table.get(stage.device_type, stage.tp, stage.recompute)
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
