"""Sharded optimizer state chosen by the planner (`optimizer_sharding`: "none", "dp" or "auto").

The search prices sharded state while it searches (a post-search pass cannot make a plan fit that the search
already dropped as too big): every group's (master + moments) per parameter are divided by the holders the
search assumes (`ways`) while templates are enumerated and layers split, the realized plans shard on every
stage, and the evaluator prices each with its real holders (one per pipeline), so a plan with fewer pipelines
than `ways` that only fit that way is dropped as infeasible. A plan with K pipelines keeps (master + moments)
/ K, so one assumed number of holders cannot see every plan sharding makes fit: "dp" and "auto" run the
sharded search at 2, 4, 8, ... holders (WAY_LADDER_GROWTH), up to the most pipelines the batch and the
cluster allow, and go on to the next only while the last found nothing or a plan with at least that many
pipelines (past that, more holders only ask for more pipelines than the search found worth having).

"auto" first runs exactly the search "none" runs (same arguments, same time limit), then the sharded ones,
keeps the best by the planner's goal (the unsharded result on a tie), then turns sharding off on each stage
where the plan still fits and is no slower without it. So auto is never slower than none whenever the
unsharded search ends within its time limit (the search is deterministic then; `hit_time_limit` says when it
was not). Each search gets the whole time limit: auto may take up to (1 + ladder steps) times as long.
"""
from __future__ import annotations

import time
from typing import Callable

from autohet_ray import ConfigError
from autohet_ray.cost.evaluate import best_schedule
from autohet_ray.cost.sharding import sharded_units, stage_units
from autohet_ray.planner.result import PlanResult
from autohet_ray.planner.passes.slice_sizes import size_slices
from autohet_ray.plan.schema import SHARDING_MODES, check_sharding  # noqa: F401  (re-exported)

WAY_LADDER_GROWTH = 2      # holders assumed by successive sharded searches: 2, 4, 8, ...


def way_ladder(num_gpus: int, global_batch: int) -> list[int]:
    """Holders the sharded searches assume: 2, 4, ... up to the most pipelines there can be (one GPU and one
    sample each)."""
    most, ways, out = min(num_gpus, global_batch), 2, []
    while ways <= most:
        out.append(ways)
        ways *= WAY_LADDER_GROWTH
    return out


def plan_sharded(plan_once: Callable, mode: str, time_limit_s: float, cluster, global_batch: int, model, profile,
                 schedules, key: Callable | None = None) -> PlanResult:
    """`plan_once(ways: int, time_limit_s, incumbents) -> PlanResult` (ways 1: unsharded) for "auto" at 1 then
    up the ladder, for "dp" up the ladder only; the best by `key` (the planner's goal; the earliest on a tie),
    under "auto" with sharding kept only on the stages where it fits the plan or makes it faster."""
    assert mode in ("dp", "auto"), mode
    start = time.perf_counter()
    key = key or (lambda r: r.evaluation.iteration_time_s)
    results, errors = [], []
    for ways in ([1] if mode == "auto" else []) + way_ladder(cluster.num_gpus, global_batch):
        try:
            result = plan_once(ways, time_limit_s, tuple(r.plan for r in results[:1]))
        except ConfigError as err:          # nothing fits this way: more holders may make it fit
            errors.append(err)
            continue
        results.append(result)
        if ways > 1 and len(result.plan.pipelines) < ways:
            break
    if not results:
        raise errors[0]
    best = min(results, key=key)
    plan, ev = best.plan, best.evaluation
    if mode == "auto":
        plan, ev = drop_unneeded_sharding(plan, ev, cluster, model, profile, schedules)
    plan, ev = size_slices(plan, ev, cluster, model, profile, schedules)     # uneven where that pays
    return PlanResult(plan=plan.with_predicted(ev.predicted()), evaluation=ev,
                      solve_time_s=time.perf_counter() - start,
                      num_templates=sum(r.num_templates for r in results),
                      hit_time_limit=any(r.hit_time_limit for r in results))


def sharding_flags(plan) -> list[list[bool]]:
    return [[s.shard_optimizer for s in p.stages] for p in plan.pipelines]


def drop_unneeded_sharding(plan, evaluation, cluster, model, profile, schedules):
    """Turn sharding off stage by stage wherever the plan still fits and is no slower without it; then every
    stage asks to shard exactly when all the units it holds are sharded (a unit is sharded when any of its
    holders asks, cost/sharding.py), which changes nothing the runtime does but names the stages that shard."""
    flags = sharding_flags(plan)
    for stage_flags in flags:
        for j, on in enumerate(stage_flags):
            if not on:
                continue
            stage_flags[j] = False
            candidate, ev = best_schedule(plan.with_optimizer_sharding(flags), cluster, model, profile,
                                          schedules=schedules)
            if ev.feasible and ev.iteration_time_s <= evaluation.iteration_time_s * (1 + 1e-12):
                plan, evaluation = candidate, ev
            else:
                stage_flags[j] = True
    return _named(plan, model), evaluation


def _named(plan, model):
    units = sharded_units(plan, model)
    flags = [[bool(units) and all(u in units for u in stage_units(s, j, len(p.stages)))
              for j, s in enumerate(p.stages)] for p in plan.pipelines]
    named = plan.with_optimizer_sharding(flags)
    assert sharded_units(named, model) == units
    return named
