"""Refine: local search over a plan's layer splits and micro-batch counts with the full cost model.

The split (planner/candidates/split.py) and the micro-batch allocation (planner/candidates/batch.py) are exact for
the closed-form
pipeline time, which leaves out what only the evaluator sees: each stage's optimizer step after its last
gradient action (the stage that ends first has the most room for a long one), zero-bubble's deferred weight
gradients, and gradient-sync overlap. On small clusters those can move the best split by a layer or two, worth
several percent. From a plan in hand, refine tries every move of one layer from one stage to another (applied
to every copy of a pipeline, so identical pipelines stay identical) and every move of one micro-batch from one
pipeline to another, takes the best improving move, and repeats until none improves or the budget is spent.
`improve_best` is how the planner uses it on small clusters (polish.py reorders stages in between).
"""
from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Callable

from autohet_ray.cluster.spec import Cluster
from autohet_ray.cost.evaluate import Evaluation, best_schedule
from autohet_ray.cost.terms import GroupCostTable
from autohet_ray.plan.schedule import PLAN_SCHEDULES
from autohet_ray.plan.schema import Pipeline, Plan
from autohet_ray.planner.candidates.floor import iteration_floor_s
from autohet_ray.planner.passes.polish import polish, polished

MAX_EVALUATIONS = 300
REFINED_CANDIDATES = 4        # small clusters: the fastest plans of each micro-batch size refined
_IMPROVES = 1 - 1e-9          # relative: a move must beat the plan in hand by more than rounding


def refine(plan: Plan, evaluation: Evaluation, table: GroupCostTable, cluster: Cluster,
           schedules: tuple[str, ...] = PLAN_SCHEDULES, max_evaluations: int = MAX_EVALUATIONS,
           stop: Callable[[], bool] = lambda: False) -> tuple[Plan, Evaluation]:
    """The plan after best-improvement moves (see the module docstring); the plan unchanged if none helps.
    Stops early once `max_evaluations` plans are priced or `stop()` (e.g. the planner's time limit) says so."""
    budget = max_evaluations
    while budget > 0 and not stop():
        found = None
        for candidate in _neighbours(plan):
            if budget <= 0 or stop():
                break
            bar = (found[1] if found else evaluation).iteration_time_s * _IMPROVES
            if iteration_floor_s(candidate, cluster, table.model, table.profile, table, schedules) >= bar:
                continue
            budget -= 1
            priced = best_schedule(candidate, cluster, table.model, table.profile, table, schedules)
            if priced[1].feasible and priced[1].iteration_time_s < bar:
                found = priced
        if found is None:
            break
        plan, evaluation = found
    return plan, evaluation


def improve_best(top: list[tuple[Plan, Evaluation]], table: GroupCostTable, cluster: Cluster, small: bool,
                 schedules: tuple[str, ...], stop: Callable[[], bool],
                 key: Callable | None = None) -> tuple[Plan, Evaluation]:
    """One micro-batch size's best plan (`top`: its fastest plans, fastest first), with its stage order
    polished. Small clusters: each of `top` is refined first (the closed-form split and allocation leave out
    the optimizer step and zero-bubble's deferred work, which weigh more there), then the best is polished,
    keeping its few fastest stage orders, and each of those is refined. `key(plan, evaluation)` ranks plans
    that use different GPUs (default: the iteration time); refining and polishing keep each plan's GPUs."""
    key = key or (lambda plan, ev: ev.iteration_time_s)
    if not small:
        return polish(*top[0], table, cluster, exhaustive=False, schedules=schedules)
    refined = [refine(plan, ev, table, cluster, schedules, stop=stop) for plan, ev in top]
    plan, ev = min(refined, key=lambda entry: key(*entry))
    orders = polished(plan, ev, table, cluster, exhaustive=True, schedules=schedules, keep=REFINED_CANDIDATES)
    refined = [entry if entry[0] is plan else refine(*entry, table, cluster, schedules, stop=stop)
               for entry in orders]
    return min(refined, key=lambda entry: key(*entry))


def _neighbours(plan: Plan):
    """Plans one move away: a layer moved between two stages of every copy of one pipeline shape, or one
    micro-batch moved between two pipelines of the same micro-batch size (different shapes, or copies that
    then differ by one)."""
    shapes: dict[tuple, list[int]] = {}
    for k, p in enumerate(plan.pipelines):
        shapes.setdefault(_shape(p), []).append(k)
    for members in shapes.values():
        stages = plan.pipelines[members[0]].stages
        for a, b in itertools.permutations(range(len(stages)), 2):
            if stages[a].num_layers > 1:
                yield _with_pipelines(plan, {k: _moved_layer(plan.pipelines[k], a, b) for k in members})
    firsts = [members[0] for members in shapes.values()]
    for k, c in itertools.permutations(firsts, 2):
        if plan.pipelines[k].num_microbatches > 1 and plan.micro_batch_of(k) == plan.micro_batch_of(c):
            yield _with_pipelines(plan, {k: _with_count(plan.pipelines[k], -1),
                                         c: _with_count(plan.pipelines[c], +1)})


def _shape(p: Pipeline) -> tuple:
    return (tuple((s.device_type, s.tp, s.recompute, s.layers) for s in p.stages), p.num_microbatches,
            p.micro_batch)


def _moved_layer(p: Pipeline, a: int, b: int) -> Pipeline:
    """Pipeline p with one layer fewer on stage a and one more on stage b (ranges stay contiguous)."""
    counts = [s.num_layers for s in p.stages]
    counts[a] -= 1
    counts[b] += 1
    stages, start = [], 0
    for s, n in zip(p.stages, counts):
        stages.append(replace(s, layers=(start, start + n)))
        start += n
    return replace(p, stages=tuple(stages))


def _with_count(p: Pipeline, delta: int) -> Pipeline:
    return replace(p, num_microbatches=p.num_microbatches + delta)


def _with_pipelines(plan: Plan, changed: dict[int, Pipeline]) -> Plan:
    pipelines = tuple(changed.get(k, p) for k, p in enumerate(plan.pipelines))
    return replace(plan, pipelines=pipelines, predicted=None)
