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
from autohet_ray.cost.evaluate import best_schedule, plan_tables
from autohet_ray.cost.memory import stage_peak_memory
from autohet_ray.cost.sharding import shard_ways
from autohet_ray.plan.schema import RECOMPUTE_MODES, check_recompute  # noqa: F401  (re-exported)
from autohet_ray.planner.result import PlanResult


def plan_auto_recompute(plan_once: Callable, time_limit_s: float, cluster, model, profile, schedules,
                        improve: Callable | None = None, key: Callable | None = None):
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
    best = min(results, key=key or (lambda r: r.evaluation.iteration_time_s))   # key: the planner's goal
    plan, ev = drop_unneeded_recompute(best.plan, best.evaluation, cluster, model, profile, schedules)
    if improve is not None:
        plan, ev = improve(plan, ev)
    return PlanResult(plan=plan.with_predicted(ev.predicted()), evaluation=ev,
                      solve_time_s=time.perf_counter() - start,
                      num_templates=sum(r.num_templates for r in results),
                      hit_time_limit=any(r.hit_time_limit for r in results))


def drop_unneeded_recompute(plan, evaluation, cluster, model, profile, schedules):
    """Turn recomputation off stage by stage wherever the plan still fits and is no slower without it.
    First at once on every stage whose memory fits without it under the plan's schedule (a stage that does not
    recompute only runs less, and the timeline is monotone in the durations, so the plan is no slower): one
    pricing instead of one per stage, which at 32 stages of llama2-70b took most of `autohet plan`'s time. Then
    stage by stage where another schedule might let it fit."""
    fits = _fits_without(plan, cluster, model, profile, (plan.schedule,))
    flags = [[on and not fit for on, fit in zip(p, f)] for p, f in zip(plan.recompute_flags(), fits)]
    if flags != [list(p) for p in plan.recompute_flags()]:
        candidate, ev = best_schedule(plan.with_recompute(flags), cluster, model, profile, schedules=schedules)
        if ev.feasible and ev.iteration_time_s <= evaluation.iteration_time_s * (1 + 1e-12):
            plan, evaluation = candidate, ev
    maybe = _fits_without(plan, cluster, model, profile, schedules)
    flags = [list(p) for p in plan.recompute_flags()]
    for k, stage_flags in enumerate(flags):
        for j, on in enumerate(stage_flags):
            if not on or not maybe[k][j]:
                continue
            stage_flags[j] = False
            candidate, ev = best_schedule(plan.with_recompute(flags), cluster, model, profile, schedules=schedules)
            if ev.feasible and ev.iteration_time_s <= evaluation.iteration_time_s * (1 + 1e-12):
                plan, evaluation = candidate, ev
            else:
                stage_flags[j] = True
    return plan, evaluation


def _fits_without(plan, cluster, model, profile, schedules) -> list[list[bool]]:
    """Per stage: whether it fits in memory without recomputation under one of `schedules`."""
    tables = plan_tables(plan, cluster, model, profile)
    out = []
    for k, pipeline in enumerate(plan.pipelines):
        row = []
        for j, stage in enumerate(pipeline.stages):
            gc = tables[k].get(stage.device_type, stage.tp, False, shard_ways(plan, k, j, model))
            row.append(any(stage_peak_memory(gc, s, len(pipeline.stages), j, pipeline.num_microbatches,
                                             stage.num_layers) <= gc.capacity_bytes for s in schedules))
        out.append(row)
    return out
