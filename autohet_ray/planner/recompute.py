"""Activation recomputation chosen by the planner (`recompute="auto"`).

A recomputing stage keeps only each layer's input per in-flight micro-batch and runs every layer's forward a
second time in its backward (cost/terms.py). It never makes a given plan faster; it lets a plan fit, and a
plan that fits only with it (fewer stages, a larger micro-batch) can beat every plan that fits without it.
So auto plans both ways, keeps the faster plan, then turns recomputation off on each stage that still fits
without it (each such stage gets faster, and no other stage's memory changes).
"""
from __future__ import annotations

import time
from typing import Callable

from autohet_ray import ConfigError
from autohet_ray.cost.evaluate import best_schedule
from autohet_ray.planner.result import PlanResult
from autohet_ray.plan.schema import RECOMPUTE_MODES, check_recompute  # noqa: F401  (re-exported)


def plan_auto_recompute(plan_once: Callable, time_limit_s: float, cluster, model, profile, schedules,
                        improve: Callable | None = None):
    """`plan_once(recompute: bool, time_limit_s) -> PlanResult` without and with recomputation (half the time
    limit each), the faster result, with recomputation kept only on the stages that need it to fit, then
    `improve(plan, evaluation) -> (plan, evaluation)` if given."""
    start = time.perf_counter()
    results, errors = [], []
    for flag in (False, True):
        left = time_limit_s - (time.perf_counter() - start)
        try:
            results.append(plan_once(flag, left / 2 if not flag else left))
        except ConfigError as err:        # nothing fits this way
            errors.append(err)
    if not results:
        raise errors[-1]
    best = min(results, key=lambda r: r.evaluation.iteration_time_s)
    plan, ev = drop_unneeded_recompute(best.plan, best.evaluation, cluster, model, profile, schedules)
    if improve is not None:
        plan, ev = improve(plan, ev)
    return PlanResult(plan=plan.with_predicted(ev.predicted()), evaluation=ev,
                      solve_time_s=time.perf_counter() - start,
                      num_templates=sum(r.num_templates for r in results),
                      hit_time_limit=any(r.hit_time_limit for r in results))


def drop_unneeded_recompute(plan, evaluation, cluster, model, profile, schedules):
    """Turn recomputation off stage by stage wherever the plan still fits and is no slower without it."""
    flags = [list(p) for p in plan.recompute_flags()]
    for k, stage_flags in enumerate(flags):
        for j, on in enumerate(stage_flags):
            if not on:
                continue
            stage_flags[j] = False
            candidate, ev = best_schedule(plan.with_recompute(flags), cluster, model, profile, schedules=schedules)
            if ev.feasible and ev.iteration_time_s <= evaluation.iteration_time_s * (1 + 1e-12):
                plan, evaluation = candidate, ev
            else:
                stage_flags[j] = True
    return plan, evaluation
