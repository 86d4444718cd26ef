"""Sharded optimizer state chosen by the planner (`optimizer_sharding`: "none", "dp" or "auto").

The search prices sharded state while it searches (a post-search pass cannot make a plan fit that the search
already dropped as too big): with sharding, every group's (master + moments) per parameter are divided by
SEARCH_SHARD_WAYS holders while templates are enumerated and layers split, the realized plans shard on every
stage, and the evaluator prices each with its real holders (one per pipeline; a one-pipeline plan cannot
shard, so one that only fit that way is dropped as infeasible). "auto" searches both ways, keeps the faster,
then turns sharding off on each stage where the plan still fits and is no slower without it.
"""
from __future__ import annotations

import time
from typing import Callable

from autohet_ray import ConfigError
from autohet_ray.cost.evaluate import best_schedule
from autohet_ray.planner.result import PlanResult
from autohet_ray.plan.schema import SHARDING_MODES, check_sharding  # noqa: F401  (re-exported)

# Holders the search assumes: every plan that shards has at least two pipelines, so its stages keep at most
# half the state (a lower bound on the saving, hence never a plan priced to fit that does not).
SEARCH_SHARD_WAYS = 2


def search_ways(shard: bool) -> int:
    return SEARCH_SHARD_WAYS if shard else 1


def plan_auto_sharding(plan_once: Callable, time_limit_s: float, cluster, model, profile, schedules):
    """`plan_once(shard: bool, time_limit_s, incumbents) -> PlanResult` without, then with sharding (half the
    time each; the unsharded plan seeds the sharded search, so that one is never worse), the faster result,
    sharding kept only on the stages where it fits the plan or makes it faster."""
    start = time.perf_counter()
    results, errors = [], []
    for flag in (False, True):
        left = time_limit_s - (time.perf_counter() - start)
        try:
            results.append(plan_once(flag, left / 2 if not flag else left, tuple(r.plan for r in results)))
        except ConfigError as err:          # nothing fits this way
            errors.append(err)
    if not results:
        raise errors[-1]
    best = min(results, key=lambda r: r.evaluation.iteration_time_s)
    plan, ev = drop_unneeded_sharding(best.plan, best.evaluation, cluster, model, profile, schedules)
    return PlanResult(plan=plan.with_predicted(ev.predicted()), evaluation=ev,
                      solve_time_s=time.perf_counter() - start,
                      num_templates=sum(r.num_templates for r in results),
                      hit_time_limit=any(r.hit_time_limit for r in results))


def sharding_flags(plan) -> list[list[bool]]:
    return [[s.shard_optimizer for s in p.stages] for p in plan.pipelines]


def drop_unneeded_sharding(plan, evaluation, cluster, model, profile, schedules):
    """Turn sharding off stage by stage wherever the plan still fits and is no slower without it."""
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
    return plan, evaluation
