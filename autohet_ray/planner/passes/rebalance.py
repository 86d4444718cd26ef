"""Per-pipeline micro-batch sizes: split the global batch across pipelines in steps finer than one micro-batch.

With one micro-batch size for the whole plan, a pipeline's share of the batch moves in steps of that size; on a
fast and a slow data-parallel replica of a large model, one step can be a tenth of the iteration. Here each
pipeline keeps its stages and layer split but may run smaller micro-batches (profiled sizes up to the plan's, so
its activation memory does not grow). For a deadline D a pipeline can take n samples if n = m * mb for a size mb
whose time with m micro-batches (closed form, under the plan's schedule) is within D; a bitset subset-sum tells
whether the chosen counts can add up to exactly the global batch, and bisection finds the smallest such D. The
full cost model then decides.
"""
from __future__ import annotations

import itertools
from dataclasses import replace

from autohet_ray.cluster.spec import Cluster
from autohet_ray.cost.evaluate import Evaluation, best_schedule, stage_link_time
from autohet_ray.cost.pipeline import steady_period, zero_bubble_bubble_saving
from autohet_ray.cost.terms import GroupCostTable
from autohet_ray.model.spec import ModelSpec
from autohet_ray.plan.schedule import PLAN_SCHEDULES, SPLIT_BACKWARD
from autohet_ray.plan.schema import Pipeline, Plan, Stage
from autohet_ray.planner.candidates.split import best_split
from autohet_ray.profile.db import ProfileDB

BISECTION_STEPS = 30


def _affine(plan: Plan, k: int, mb: int, table: GroupCostTable, cluster, model, profile,
            counts: tuple[int, ...] | None = None) -> tuple[float, float]:
    """(fixed, period): pipeline k's closed-form time with m micro-batches of size mb is
    fixed + (m - 1) * period (1F1B's, less the zero-bubble saving under a split-backward schedule), with its
    layers split as `counts` (default: as the plan splits them)."""
    stages = plan.pipelines[k].stages if counts is None else _split_as(plan.pipelines[k].stages, counts)
    p = len(stages)
    split = plan.schedule in SPLIT_BACKWARD
    parts = [table.get(s.device_type, s.tp, s.recompute).stage_split(s.num_layers, j == 0, j == p - 1, split)
             for j, s in enumerate(stages)]
    stage_s = [sum(part) for part in parts]
    link_s = [stage_link_time(plan, cluster, profile, model, a, b, mb) for a, b in zip(stages, stages[1:])]
    saving = zero_bubble_bubble_saving([w for _, _, w in parts]) if split else 0.0
    return sum(stage_s) + 2 * sum(link_s) - saving, steady_period(stage_s, link_s)


def _resplit(plan: Plan, k: int, mb: int, table: GroupCostTable, cluster, model, profile,
             schedules: tuple[str, ...]) -> tuple[int, ...] | None:
    """Pipeline k's best layer split at micro-batch size mb (planner/candidates/split.py; for as many micro-batches as
    its share of the batch makes), or None when none fits."""
    stages = plan.pipelines[k].stages
    groups = [table.get(s.device_type, s.tp, s.recompute) for s in stages]
    link_s = [stage_link_time(plan, cluster, profile, model, a, b, mb) for a, b in zip(stages, stages[1:])]
    samples = plan.pipelines[k].num_microbatches * plan.micro_batch_of(k)
    split = best_split(groups, model.num_layers, max(1, samples // mb), link_s, schedules)
    return None if split is None else split.counts


def _split_as(stages: tuple[Stage, ...], counts: tuple[int, ...]) -> tuple[Stage, ...]:
    starts = [sum(counts[:j]) for j in range(len(counts))]
    return tuple(replace(s, layers=(a, a + n)) for s, a, n in zip(stages, starts, counts))


def _options(shapes: dict[int, tuple[float, float]], deadline_s: float, limit: int) -> dict[int, int]:
    """Sample counts reachable by the deadline -> the micro-batch size that reaches them soonest."""
    best: dict[int, tuple[float, int]] = {}
    for mb, (fixed, period) in shapes.items():
        if deadline_s < fixed:
            continue
        most = min(limit // mb, int((deadline_s - fixed) / period + 1e-9) + 1 if period > 0 else limit // mb)
        for m in range(1, most + 1):
            t = fixed + (m - 1) * period
            if m * mb not in best or t < best[m * mb][0]:
                best[m * mb] = (t, mb)
    return {n: mb for n, (_, mb) in best.items()}


def _exact_split(options: list[dict[int, int]], total: int,
                 order: list[int] | None = None) -> list[tuple[int, int]] | None:
    """(samples, micro-batch size) per pipeline adding up to `total`, or None (bitset subset-sum). Where
    several splits exist, the pipelines last in `order` (default: the given order) get the most samples."""
    if order is not None:
        found = _exact_split([options[k] for k in order], total)
        return None if found is None else [found[order.index(k)] for k in range(len(options))]
    mask = (1 << (total + 1)) - 1
    reach = [1]
    for opts in options:
        acc = 0
        for n in opts:
            acc |= reach[-1] << n
        reach.append(acc & mask)
    if not (reach[-1] >> total) & 1:
        return None
    out, left = [], total
    for k in range(len(options) - 1, -1, -1):
        n = next(n for n in sorted(options[k], reverse=True) if n <= left and (reach[k] >> (left - n)) & 1)
        out.append((n, options[k][n]))
        left -= n
    assert left == 0
    return out[::-1]


def _with_shares(plan: Plan, shares: list[tuple[int, int]], splits: list[dict] | None = None) -> Plan:
    """The plan with pipeline k taking shares[k] = (samples, micro-batch size), its layers split as
    splits[k][size] where that is given."""
    splits = splits or [{} for _ in plan.pipelines]
    pipelines = tuple(Pipeline(num_microbatches=n // mb, micro_batch=None if mb == plan.micro_batch else mb,
                               stages=_split_as(p.stages, split[mb]) if mb in split else p.stages)
                      for (n, mb), p, split in zip(shares, plan.pipelines, splits))
    return Plan(model=plan.model, model_spec=plan.model_spec, cluster=plan.cluster, global_batch=plan.global_batch,
                micro_batch=plan.micro_batch, seq_len=plan.seq_len, pipelines=pipelines)


def _sizes(plan: Plan, k: int, profile: ProfileDB, largest: int) -> list[int]:
    """Profiled micro-batch sizes up to `largest` that every stage of pipeline k has an entry for."""
    have = sorted({key[2] for key in profile.entries if key[2] <= largest})
    return [mb for mb in have
            if all(profile.has(s.device_type, s.tp, mb) for s in plan.pipelines[k].stages)]


def rebalance_micro_batches(plan: Plan, evaluation: Evaluation, cluster: Cluster, model: ModelSpec,
                            profile: ProfileDB, largest: int | None = None,
                            schedules: tuple[str, ...] = PLAN_SCHEDULES) -> tuple[Plan, Evaluation]:
    """The plan with per-pipeline micro-batch sizes and counts when the cost model prices it faster (and it
    fits); otherwise the plan unchanged. Sizes up to each pipeline's own are tried first (activation memory
    cannot grow), then sizes up to `largest` (the planner's largest candidate; the cost model checks memory)."""
    if len(plan.pipelines) < 2:
        return plan, evaluation
    best = (plan, evaluation)
    for larger in (False, True) if largest else (False,):
        best = _rebalance(plan, best[1], cluster, model, profile, largest if larger else None, schedules) or best
    return best


def _shapes(plan: Plan, cluster: Cluster, model: ModelSpec, profile: ProfileDB, largest: int | None,
            schedules: tuple[str, ...]) -> tuple[list[dict], list[dict]]:
    """Per pipeline: size -> (fixed, period), and size -> the layer split it takes at that size. At its own
    size a pipeline keeps its split; at another it takes the best split for that size (split.py) when the
    closed form prices that one sooner for its share of the batch."""
    tables: dict[int, GroupCostTable] = {}
    shapes, splits = [], []
    for k in range(len(plan.pipelines)):
        shape, split = {}, {}
        own_samples = plan.pipelines[k].num_microbatches * plan.micro_batch_of(k)
        for mb in _sizes(plan, k, profile, largest or plan.micro_batch_of(k)):
            table = tables.setdefault(mb, GroupCostTable(model=model, cluster=cluster, profile=profile,
                                                         micro_batch=mb, seq_len=plan.seq_len))
            shape[mb] = _affine(plan, k, mb, table, cluster, model, profile)
            counts = None if mb == plan.micro_batch_of(k) else \
                _resplit(plan, k, mb, table, cluster, model, profile, schedules)
            if counts is not None:
                other = _affine(plan, k, mb, table, cluster, model, profile, counts)
                m = max(1, own_samples // mb)
                if other[0] + (m - 1) * other[1] < shape[mb][0] + (m - 1) * shape[mb][1]:
                    shape[mb], split[mb] = other, counts
        shapes.append(shape)
        splits.append(split)
    return shapes, splits


def _rebalance(plan: Plan, evaluation: Evaluation, cluster: Cluster, model: ModelSpec, profile: ProfileDB,
               largest: int | None, schedules: tuple[str, ...]) -> tuple[Plan, Evaluation] | None:
    shapes, splits = _shapes(plan, cluster, model, profile, largest, schedules)
    own = [shapes[k][plan.micro_batch_of(k)] for k in range(len(plan.pipelines))]
    hi = max(f + (p.num_microbatches - 1) * d for (f, d), p in zip(own, plan.pipelines))
    lo, found = 0.0, None
    for _ in range(BISECTION_STEPS):
        mid = (lo + hi) / 2
        split = _exact_split([_options(s, mid, plan.global_batch) for s in shapes], plan.global_batch)
        if split is None:
            lo = mid
        else:
            hi, found = mid, split
    if found is None:
        return None
    best = None
    resplit = (splits, None) if any(splits) else (None,)       # a re-split may not fit where the split did
    for split, layers in itertools.product(_tie_breaks(shapes, own, hi, plan.global_batch), resplit):
        candidate, ev = best_schedule(_with_shares(plan, split, layers), cluster, model, profile,
                                      schedules=schedules)
        if ev.feasible and (best is None or ev.iteration_time_s < best[1].iteration_time_s):
            best = (candidate, ev)
    if best is not None and best[1].iteration_time_s < evaluation.iteration_time_s * (1 - 1e-9):
        return best
    return None


def _tie_breaks(shapes, own, deadline_s: float, total: int) -> list[list[tuple[int, int]]]:
    """Splits that meet the smallest deadline, the spare samples going first to the last pipelines, to the
    slowest, or to the fastest. The cost model tells them apart: a pipeline that ends before the slowest one
    lets the gradient all-reduces of its layers start sooner."""
    options = [_options(s, deadline_s, total) for s in shapes]
    by_speed = sorted(range(len(shapes)), key=lambda k: own[k][1])       # longest period (slowest) last
    splits = []
    for order in (None, by_speed, by_speed[::-1]):
        split = _exact_split(options, total, order)
        if split is not None and split not in splits:
            splits.append(split)
    return splits
