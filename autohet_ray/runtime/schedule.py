"""Pipeline schedules as data: per stage, the ordered list of forward/backward micro-batch actions.

Communication is implied by the action and the stage's position: a forward on a stage other than the first
receives its input activation first, and on a stage other than the last sends its output after; a backward
on a stage other than the last receives its output gradient first, and on a stage other than the first
sends its input gradient after. Sends do not block, receives do.
"""
from __future__ import annotations

from dataclasses import dataclass

FORWARD = "F"
BACKWARD = "B"


@dataclass(frozen=True)
class Action:
    kind: str            # FORWARD or BACKWARD
    microbatch: int

    def __str__(self) -> str:
        return f"{self.kind}{self.microbatch}"


def _check(num_stages: int, stage: int, num_microbatches: int) -> None:
    assert num_stages >= 1 and 0 <= stage < num_stages and num_microbatches >= 1, \
        (num_stages, stage, num_microbatches)


def one_f_one_b(num_stages: int, stage: int, num_microbatches: int) -> tuple[Action, ...]:
    """1F1B: warm-up forwards, steady one-forward-one-backward, cool-down backwards.

    Stage j keeps at most num_stages - j micro-batches in flight.
    """
    _check(num_stages, stage, num_microbatches)
    warmup = min(num_stages - stage - 1, num_microbatches)
    actions = [Action(FORWARD, i) for i in range(warmup)]
    for i in range(num_microbatches - warmup):
        actions.append(Action(FORWARD, warmup + i))
        actions.append(Action(BACKWARD, i))
    actions += [Action(BACKWARD, i) for i in range(num_microbatches - warmup, num_microbatches)]
    return tuple(actions)


def gpipe(num_stages: int, stage: int, num_microbatches: int) -> tuple[Action, ...]:
    """GPipe: all forwards, then all backwards (in the same micro-batch order)."""
    _check(num_stages, stage, num_microbatches)
    return tuple([Action(FORWARD, i) for i in range(num_microbatches)] +
                 [Action(BACKWARD, i) for i in range(num_microbatches)])


SCHEDULES = {"1f1b": one_f_one_b, "gpipe": gpipe}


def max_in_flight(actions: tuple[Action, ...]) -> int:
    """The most micro-batches whose forward ran and backward did not yet (activations kept)."""
    live = peak = 0
    for a in actions:
        live += 1 if a.kind == FORWARD else -1
        peak = max(peak, live)
    return peak
