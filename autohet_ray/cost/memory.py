"""Peak memory of one stage under its schedule: weights and optimizer state, the activations of the
micro-batches between their forward and backward, and under a split-backward schedule the weight-gradient
inputs (each TP linear's input and output gradient, runtime/wgrad.py) of the micro-batches between their B and
their W. The backward frees a micro-batch's other activations, so those two counts peak at different times:
the peak is taken over the states after each action of the stage's order."""
from __future__ import annotations

from functools import lru_cache

from autohet_ray.cost.terms import GroupCost
from autohet_ray.plan.schedule import BACKWARD, FORWARD, SCHEDULES, SPLIT_BACKWARD, WGRAD


@lru_cache(maxsize=16384)
def live_counts(schedule: str, num_stages: int, stage: int, num_microbatches: int) -> tuple[tuple[int, int], ...]:
    """The distinct (activations kept, weight-gradient inputs held) micro-batch counts after each action
    that are not dominated by another (the only candidates for the peak)."""
    split = schedule in SPLIT_BACKWARD
    acts = held = 0
    states = set()
    for action in SCHEDULES[schedule](num_stages, stage, num_microbatches):
        if action.kind == FORWARD:
            acts += 1
        elif action.kind == BACKWARD:
            acts -= 1
            held += 1 if split else 0
        elif action.kind == WGRAD:
            held -= 1
        states.add((acts, held))
    return tuple(sorted(s for s in states
                        if not any(o != s and o[0] >= s[0] and o[1] >= s[1] for o in states)))


def stage_peak_memory(gc: GroupCost, schedule: str, num_stages: int, stage: int, num_microbatches: int,
                      num_layers: int) -> int:
    first, last = stage == 0, stage == num_stages - 1
    return max(gc.stage_memory(num_layers, first, last, acts, held)
               for acts, held in live_counts(schedule, num_stages, stage, num_microbatches))
