"""Uneven slices of sharded optimizer state, sized by each holder's memory headroom (a post-pass on a chosen plan).

A sharded unit's master and moments are cut among its holders (one stage per pipeline) in proportion to their
stages' `slice_weight` (runtime/shard_layout.slice_bounds). After the plan is chosen, this pass gives each
sharding stage the weight headroom / n: its usable memory left once everything but its slices is counted
(`headroom`), over the sharded parameters it holds per rank (n). Two holders of the same units then fill the
same fraction of their headroom, so a GPU with little memory to spare keeps a small slice and one with much
keeps a large one; a plan that does not fit with equal slices on its smallest GPU may fit this way.

Uneven slices are not free: the runtime pads every slice to the largest for its reduce-scatter and all-gather
(cost/sharding.widest_slice_factor). So the pass keeps them only where the cost model says they pay: the plan
fits with them and not with equal slices, or it is faster with them.
"""
from __future__ import annotations

from autohet_ray.cost.evaluate import Evaluation, best_schedule
from autohet_ray.cost.sharding import sharded_units, slice_share, stage_units
from autohet_ray.model.costs import layer_params
from autohet_ray.plan.schema import Plan
from autohet_ray.profile.precision import profile_precision

WEIGHT_DIGITS = 4           # significant digits of the slice weights written (relative to the largest, 1)
SMALLEST_WEIGHT = 1e-6      # a stage with no headroom left still keeps a sliver (weights must be > 0)


def _kind(unit) -> str:
    return unit if isinstance(unit, str) else "layer"


def sharded_params(plan: Plan, k: int, j: int, model) -> float:
    """Parameters per rank of stage j of pipeline k in the sharded units it holds."""
    units, stage = sharded_units(plan, model), plan.pipelines[k].stages[j]
    held = stage_units(stage, j, len(plan.pipelines[k].stages))
    return sum(layer_params(model, _kind(u)) for u in held if u in units) / stage.tp


def slice_bytes(plan: Plan, k: int, j: int, model, profile) -> float:
    """Bytes per rank of stage j of pipeline k in its slices (master and moments) at the plan's weights."""
    units, stage = sharded_units(plan, model), plan.pipelines[k].stages[j]
    held = stage_units(stage, j, len(plan.pipelines[k].stages))
    per_param = profile_precision(profile).sharded_state_bytes
    return per_param * sum(layer_params(model, _kind(u)) / stage.tp * slice_share(plan, k, j, u)
                           for u in held if u in units)


def headroom(plan: Plan, evaluation: Evaluation, model, profile) -> dict[tuple[int, int], float]:
    """(pipeline, stage) -> bytes per device left for its slices: usable memory minus its predicted peak
    without them (negative where even that does not fit)."""
    out = {}
    for k, pipeline in enumerate(plan.pipelines):
        for j, stage in enumerate(pipeline.stages):
            device = f"{stage.node}:{stage.devices[0]}"
            without = evaluation.memory_bytes[device] - slice_bytes(plan, k, j, model, profile)
            out[(k, j)] = evaluation.capacity_bytes[device] - without
    return out


def headroom_weights(plan: Plan, evaluation: Evaluation, model, profile) -> tuple[tuple[float, ...], ...]:
    """Per pipeline, per stage: headroom / sharded parameters per rank, relative to the largest (1.0 for a
    stage that holds no sharded unit: its weight cuts nothing)."""
    room = headroom(plan, evaluation, model, profile)
    raw = {key: max(room[key], 0.0) / n for key in room
           if (n := sharded_params(plan, *key, model)) > 0}
    top = max(raw.values(), default=0.0)
    if top <= 0:
        return plan.slice_weights()
    return tuple(tuple(max(SMALLEST_WEIGHT, float(f"{raw[(k, j)] / top:.{WEIGHT_DIGITS}g}")) if (k, j) in raw else 1.0
                       for j in range(len(p.stages))) for k, p in enumerate(plan.pipelines))


def _better(candidate: Evaluation, current: Evaluation) -> bool:
    if not candidate.feasible:
        return False
    return not current.feasible or candidate.iteration_time_s < current.iteration_time_s * (1 - 1e-12)


def size_slices(plan: Plan, evaluation: Evaluation, cluster, model, profile,
                schedules: tuple[str, ...] | None = None) -> tuple[Plan, Evaluation]:
    """The plan with its slices sized by headroom where that makes it fit or faster (under the fastest of
    `schedules` that fits; default the plan's), else the plan as given. `evaluation`: the plan's."""
    if len(plan.pipelines) < 2 or not sharded_units(plan, model):
        return plan, evaluation
    weights = headroom_weights(plan, evaluation, model, profile)
    if weights == plan.slice_weights():
        return plan, evaluation
    candidate, ev = best_schedule(plan.with_slice_weights(weights), cluster, model, profile,
                                  schedules=schedules or (plan.schedule,))
    return (candidate, ev) if _better(ev, evaluation) else (plan, evaluation)
