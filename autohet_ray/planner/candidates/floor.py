"""A cheap floor under the cost model's iteration time of one plan, to skip event simulations.

Why it holds (for every schedule the cost model prices): a stage runs its actions one at a time in its
schedule order, all its forwards before the backward of the last micro-batch m - 1, and the weight-gradient
actions (W, split-backward schedules) in micro-batch order. A forward needs the previous stage's forward, a
backward the next stage's backward. So stage j's backward of micro-batch m - 1 ends no sooner than
    max(fwd before j + all of j's work up to it,
        fwd of every stage + bwd of the stages after j (when its first backward can start) + j's work from
        its first backward to its last),
stage s <= j runs that backward after the stages between have (b_i each), and the iteration ends no sooner
than a stage's last gradient action plus its optimizer step. Links, gradient sync and waits only add to
these, so they are left out. The search ranks candidates by this floor, simulates
them in that order and stops once the floor reaches the best simulated time: the result is the same as
simulating every candidate.
"""
from __future__ import annotations

from functools import lru_cache

from autohet_ray.cluster.spec import Cluster
from autohet_ray.cost.evaluate import plan_tables
from autohet_ray.cost.memory import stage_peak_memory
from autohet_ray.cost.timeline import schedule_order
from autohet_ray.cost.terms import GroupCost, GroupCostTable
from autohet_ray.model.spec import ModelSpec
from autohet_ray.plan.schedule import BACKWARD, FORWARD, PLAN_SCHEDULES, SPLIT_BACKWARD, WGRAD
from autohet_ray.plan.schema import Plan
from autohet_ray.profile.db import ProfileDB

INFEASIBLE = float("inf")


def iteration_floor_s(plan: Plan, cluster: Cluster, model: ModelSpec, profile: ProfileDB,
                      table: GroupCostTable | None = None, schedules: tuple[str, ...] = PLAN_SCHEDULES) -> float:
    """A lower bound on `best_schedule(plan, ...)`'s iteration time over the schedules whose activation
    memory fits (INFEASIBLE when none fits, so the plan cannot be a feasible result)."""
    tables = plan_tables(plan, cluster, model, profile, table)
    shapes = {(tuple((s.device_type, s.tp, s.recompute) for s in p.stages), tuple(s.num_layers for s in p.stages),
               p.num_microbatches, k_table.micro_batch): k_table for p, k_table in zip(plan.pipelines, tables)}
    return min((max(pipeline_floor_s([t.get(*kind) for kind in kinds], counts, m, schedule)
                    for (kinds, counts, m, _), t in shapes.items()) for schedule in schedules),
               default=INFEASIBLE)


def pipeline_floor_s(groups: list[GroupCost], counts, num_microbatches: int, schedule: str) -> float:
    """The floor of one pipeline (stage groups in order, layers per stage) under one schedule; INFEASIBLE
    when a stage's activations under that schedule do not fit."""
    stages = stage_floors(groups, counts, num_microbatches, schedule)
    return INFEASIBLE if stages is None else max(end + o for end, _, o in stages)


def stage_floors(groups: list[GroupCost], counts, num_microbatches: int,
                 schedule: str) -> list[tuple[float, float, float]] | None:
    """Per stage: (floor of its last gradient action's end, that action's seconds, optimizer seconds); None
    when the activations do not fit."""
    split = schedule in SPLIT_BACKWARD
    p = len(groups)
    f, b, w, opt = [], [], [], []
    for j, (gc, n) in enumerate(zip(groups, counts)):
        first, last = j == 0, j == p - 1
        if peak_memory(gc, schedule, p, j, num_microbatches, n) > gc.capacity_bytes:
            return None
        fwd, bwd, wgrad = gc.stage_split(n, first, last, split)
        f.append(fwd)
        b.append(bwd if split else bwd + wgrad)
        w.append(wgrad if split else 0.0)
        opt.append(gc.optimizer_s(n, first, last))        # as the evaluator prices it (dtype, measured rate)
    return _stage_floors(f, b, w, opt, schedule, num_microbatches)


def with_sync_floor(stages: list[tuple[float, float, float]], bucket_s: list[float]) -> float:
    """The floor of one pipeline given each stage's all-reduce seconds (the sum of its buckets' durations,
    `cost.sync.sync_buckets`): a stage's buckets run one after another, none starting before its last
    gradient action does."""
    return max(max(end + o, end - action + sync + o) for (end, action, o), sync in zip(stages, bucket_s))


def _stage_floors(f, b, w, opt, schedule: str, m: int) -> list[tuple[float, float, float]]:
    p = len(f)
    ends = _pipeline_floor(f, b, w, [_order_counts(schedule, j, p, m) for j in range(p)], m)
    split = schedule in SPLIT_BACKWARD
    return [(end, w[j] if split else b[j], opt[j]) for j, end in enumerate(ends)]


STEADY_FROM = 4               # x num_stages: from here on the schedules repeat one pattern per micro-batch


def steady_microbatches(num_stages: int, num_microbatches: int) -> int:
    """A micro-batch count whose schedule holds the same live activation counts as `num_microbatches`
    (the repeating pattern adds none; tests/unit/test_planner_parts.py checks it): memory is priced on a
    short schedule instead of a long one."""
    return min(num_microbatches, STEADY_FROM * num_stages)


def peak_memory(gc: GroupCost, schedule: str, num_stages: int, stage: int, num_microbatches: int,
                num_layers: int) -> int:
    """`cost.memory.stage_peak_memory`, on the short schedule of `steady_microbatches`."""
    return stage_peak_memory(gc, schedule, num_stages, stage, steady_microbatches(num_stages, num_microbatches),
                             num_layers)


def _order_counts(schedule: str, stage: int, num_stages: int, num_microbatches: int) -> tuple[int, ...]:
    """From the stage's action order: forwards from its first backward on, weight-gradient actions before its
    last backward, after it, and between its first and last backward. Past a few micro-batches per stage the
    counts grow by a fixed step per micro-batch: they are extrapolated from two orders of that length (the
    floor test checks the result against the simulation)."""
    steady = STEADY_FROM * num_stages
    if num_microbatches <= steady + 1:
        return _counted(schedule, stage, num_stages, num_microbatches)
    a, b = _counted(schedule, stage, num_stages, steady), _counted(schedule, stage, num_stages, steady + 1)
    return tuple(x + (num_microbatches - steady) * (y - x) for x, y in zip(a, b))


@lru_cache(maxsize=8192)
def _counted(schedule: str, stage: int, num_stages: int, num_microbatches: int) -> tuple[int, int, int, int]:
    order = [kind for kind, _ in schedule_order(schedule, stage, num_stages, num_microbatches)]
    first_b = order.index(BACKWARD)
    last_b = len(order) - 1 - order[::-1].index(BACKWARD)
    return (order[first_b:].count(FORWARD), order[:last_b].count(WGRAD), order[last_b:].count(WGRAD),
            order[first_b:last_b].count(WGRAD))


def _pipeline_floor(f, b, w, orders, m: int) -> list[float]:
    """Per stage, when its last gradient action ends at the soonest. Stage j's backward of micro-batch 0
    waits for micro-batch 0's forward through every stage and its backward through the stages after j; its
    backward of the last micro-batch ends after all the stage's work up to it. Each stage's last gradient
    action ends after its last backward plus the weight-gradient actions left."""
    p, before = len(f), 0.0
    last_backward_end, ends = [], []
    total_f = sum(f)
    for j in range(p):
        forwards_after, w_before_last, w_after_last, w_between = orders[j]
        first_backward_start = total_f + sum(b[j + 1:])
        last_backward_end.append(max(before + m * (f[j] + b[j]) + w_before_last * w[j],
                                     first_backward_start + forwards_after * f[j] + m * b[j] + w_between * w[j]))
        ends.append(before + m * (f[j] + b[j] + w[j]))
        before += f[j]
    for s in range(p):
        passed = 0.0                 # backwards of stages s..j-1 after stage j's last one
        for j in range(s, p):
            ends[s] = max(ends[s], last_backward_end[j] + passed + orders[s][2] * w[s])
            passed += b[j]
    return ends
