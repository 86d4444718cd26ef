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
from autohet_ray.cost.timeline import Summary, simulate_summary
from autohet_ray.cost.sync import gradient_sync_times, sync_buckets, sync_end_times
from autohet_ray.cost.terms import (GroupCostTable, activation_message_bytes, boundary_seconds, inter_link, intra_link,
                                     plan_tables)
from autohet_ray.model.spec import ModelSpec
from autohet_ray.plan.schedule import PLAN_SCHEDULES, SPLIT_BACKWARD
from autohet_ray.plan.schema import LinkTimes, Plan, Predicted, StageTimes
from autohet_ray.plan.validate import validate_plan
from autohet_ray.profile.db import ProfileDB


# From this many micro-batches per stage on, a stage's schedule only repeats states it held already (1F1B and
# ZB-H1 reach their steady pattern within 2 p micro-batches): its peak memory is priced on that short schedule
SAME_MEMORY_FROM = 4
REPEATING_SCHEDULES = ("1f1b", "zb-h1")


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
    split = plan.schedule in SPLIT_BACKWARD
    stages = [_stage_terms(plan, k, tables[k], split, model) for k in range(len(plan.pipelines))]
    links = [_pipeline_links(plan, k, cluster, profile, model) for k in range(len(plan.pipelines))]
    timelines = [_timeline(parts, fwd, back, plan.pipelines[k].num_microbatches, plan.schedule, split)
                 for k, ((parts, _, _, _), (fwd, back)) in enumerate(zip(stages, links))]
    opt_s = {(k, j): terms[1][j] for k, terms in enumerate(stages) for j in range(len(terms[1]))}
    last_grad = {(k, j): slot for k, t in enumerate(timelines) for j, slot in enumerate(t.last_gradient)}
    buckets = sync_buckets(plan, cluster, model, profile) if buckets is None else buckets
    buckets, gather_s = sharded_buckets(plan, buckets, profile)
    for key, seconds in gather_s.items():                 # the new weights' all-gather follows the update
        opt_s[key] += seconds
    sync = max(gradient_sync_times(plan, cluster, model, profile, buckets).values(), default=0.0)
    synced = sync_end_times(buckets,
                            lambda key, unit: _gradient_final(plan.pipelines[key[0]], key[1], tables[key[0]],
                                                              last_grad[key], unit, split))
    memory, capacity = _device_memory(plan, stages)
    return _evaluation(plan, profile, stages, links, timelines, opt_s, synced, last_grad, sync, memory, capacity)


def _stage_terms(plan: Plan, k: int, table: GroupCostTable, split: bool, model: ModelSpec) -> tuple[tuple, ...]:
    """Pipeline k's per-stage (forward, backward, weight-gradient) seconds of one micro-batch, optimizer
    seconds, peak memory bytes under the plan's schedule, and usable capacity."""
    pipeline = plan.pipelines[k]
    p, m = len(pipeline.stages), pipeline.num_microbatches
    parts, opt, peak, capacity = [], [], [], []
    short = min(m, SAME_MEMORY_FROM * p) if plan.schedule in REPEATING_SCHEDULES else m
    for j, stage in enumerate(pipeline.stages):
        gc = table.get(stage.device_type, stage.tp, stage.recompute, shard_ways(plan, k, j, model))
        first, last = j == 0, j == p - 1
        parts.append(gc.stage_split(stage.num_layers, first, last, split))
        opt.append(gc.optimizer_s(stage.num_layers, first, last))
        peak.append(stage_peak_memory(gc, plan.schedule, p, j, short, stage.num_layers))
        capacity.append(gc.capacity_bytes)
    return tuple(parts), tuple(opt), tuple(peak), tuple(capacity)


def _pipeline_links(plan: Plan, k: int, cluster: Cluster, profile: ProfileDB, model: ModelSpec):
    """(activation seconds forward, gradient seconds back) per stage boundary of pipeline k."""
    stages = plan.pipelines[k].stages
    both = [stage_link_times(plan, cluster, profile, model, a, b, plan.micro_batch_of(k))
            for a, b in zip(stages, stages[1:])]
    return tuple(f for f, _ in both), tuple(g for _, g in both)


def _timeline(parts, links, back, m: int, schedule: str, split: bool) -> Summary:
    return simulate_summary(tuple(f for f, _, _ in parts), tuple(b + (0.0 if split else w) for _, b, w in parts),
                            links, m, schedule, tuple(w for _, _, w in parts) if split else None,
                            None if back == links else back)


def _device_memory(plan: Plan, stages) -> tuple[dict[str, int], dict[str, int]]:
    """("node:gpu" -> peak bytes, "node:gpu" -> usable bytes) from `_stage_terms` of every pipeline."""
    memory, capacity = {}, {}
    for pipeline, (_, _, peak, cap) in zip(plan.pipelines, stages):
        for j, stage in enumerate(pipeline.stages):
            for d in stage.devices:
                memory[f"{stage.node}:{d}"] = peak[j]
                capacity[f"{stage.node}:{d}"] = cap[j]
    return memory, capacity


def fits_in_memory(plan: Plan, cluster: Cluster, model: ModelSpec, profile: ProfileDB,
                   table: GroupCostTable | None = None) -> bool:
    """Whether `evaluate_plan(plan, ...)` would find the plan feasible, without simulating its timeline."""
    tables = plan_tables(plan, cluster, model, profile, table)
    split = plan.schedule in SPLIT_BACKWARD
    memory, capacity = _device_memory(plan, [_stage_terms(plan, k, tables[k], split, model)
                                             for k in range(len(plan.pipelines))])
    return not any(memory[d] > capacity[d] for d in memory)


def _out_of_memory(memory: dict[str, int], capacity: dict[str, int]) -> str:
    over = {d: memory[d] - capacity[d] for d in memory if memory[d] > capacity[d]}
    if not over:
        return ""
    worst = max(over, key=over.get)
    return (f"out of memory on {worst}: needs {memory[worst] / 1e9:.1f} GB, "
            f"{capacity[worst] / 1e9:.1f} GB usable ({over[worst] / 1e9:.1f} GB missing)")


def _evaluation(plan, profile, stages, links, timelines, opt_s, synced, last_grad, sync, memory,
                capacity) -> Evaluation:
    iteration = max(synced[key] + opt_s[key] for key in synced)
    exposed = {f"{stage.node}:{d}": synced[(k, j)] - last_grad[(k, j)].end_s
               for k, pipeline in enumerate(plan.pipelines) for j, stage in enumerate(pipeline.stages)
               for d in stage.devices}
    reason = _out_of_memory(memory, capacity)
    shape = [range(len(p.stages)) for p in plan.pipelines]
    return Evaluation(feasible=not reason, reason=reason, iteration_time_s=iteration,
                      samples_per_s=plan.global_batch / iteration,
                      pipeline_times_s=tuple(t.end_s for t in timelines),
                      stage_times_s=tuple(tuple(sum(part) for part in parts) for parts, *_ in stages),
                      link_times_s=tuple(fwd for fwd, _ in links), sync_time_s=sync,
                      optimizer_time_s=max(opt_s.values(), default=0.0), memory_bytes=memory,
                      capacity_bytes=capacity, profile_kind=profile.kind, sync_exposed_s=exposed,
                      back_link_times_s=tuple(back for _, back in links),
                      stage_parts_s=tuple(parts for parts, *_ in stages),
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
                  table: GroupCostTable | None = None, schedules: tuple[str, ...] = PLAN_SCHEDULES,
                  buckets: dict | None = None) -> tuple[Plan, Evaluation]:
    """The plan under the fastest of `schedules` that fits in memory (under the first if none fits). Split-
    backward schedules are skipped when every pipeline has one stage (no bubble to fill; 1F1B is as fast).
    Schedules that do not fit are not simulated (only the first is, when none fits). `buckets` as for
    evaluate_plan."""
    if all(len(p.stages) == 1 for p in plan.pipelines) and any(s not in SPLIT_BACKWARD for s in schedules):
        schedules = tuple(s for s in schedules if s not in SPLIT_BACKWARD)
    candidates = [plan.with_schedule(schedule) for schedule in schedules]
    fitting = [c for c in candidates if fits_in_memory(c, cluster, model, profile, table)] or candidates[:1]
    buckets = sync_buckets(plan, cluster, model, profile) if buckets is None else buckets
    priced = [(c, evaluate_plan(c, cluster, model, profile, table, buckets)) for c in fitting]
    fitting = [entry for entry in priced if entry[1].feasible]
    return min(fitting, key=lambda entry: entry[1].iteration_time_s) if fitting else priced[0]


def price_plan(plan: Plan, cluster: Cluster, model: ModelSpec, profile: ProfileDB) -> Plan:
    """The plan with its `predicted` filled in; ConfigError if it does not fit in memory."""
    ev = evaluate_plan(plan, cluster, model, profile)
    if not ev.feasible:
        raise ConfigError(f"plan is infeasible: {ev.reason}")
    return plan.with_predicted(ev.predicted())
