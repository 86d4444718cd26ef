"""Pipeline schedules as data: per stage, the ordered list of forward/backward micro-batch actions.

Communication is implied by the action and the stage's position: a forward on a stage other than the first
receives its input activation first, and on a stage other than the last sends its output after; a backward
on a stage other than the last receives its output gradient first, and on a stage other than the first
sends its input gradient after. Sends do not block, receives do.

In "1f1b" and "gpipe" a backward computes every gradient. "zb-h1" (zero-bubble H1, Qi et al. 2023) splits it:
the backward (B) computes only the input gradient, which the previous stage waits for, and a separate
weight-gradient action (W) computes the linear layers' weight gradients later, filling the time a stage would
otherwise idle. Stage j runs W of micro-batch i right after B of micro-batch i + j (the rest after its last B),
so later stages, which idle longest in the cool-down, defer the most, and no stage holds more than
num_stages micro-batches' activations (the first stage's 1F1B bound).
"""
from __future__ import annotations

from dataclasses import dataclass

from autohet_ray import ConfigError

FORWARD = "F"
BACKWARD = "B"
WGRAD = "W"


@dataclass(frozen=True)
class Action:
    kind: str            # FORWARD, BACKWARD or WGRAD
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


def zero_bubble_h1(num_stages: int, stage: int, num_microbatches: int) -> tuple[Action, ...]:
    """1F1B's forwards and (input-gradient) backwards, with W of micro-batch i after B of i + stage."""
    _check(num_stages, stage, num_microbatches)
    actions: list[Action] = []
    deferred = 0                        # W actions placed so far (they run in micro-batch order)
    for a in one_f_one_b(num_stages, stage, num_microbatches):
        actions.append(a)
        if a.kind == BACKWARD and a.microbatch >= stage:
            actions.append(Action(WGRAD, a.microbatch - stage))
            deferred += 1
    actions += [Action(WGRAD, i) for i in range(deferred, num_microbatches)]
    return tuple(actions)


SCHEDULES = {"1f1b": one_f_one_b, "gpipe": gpipe, "zb-h1": zero_bubble_h1}
PLAN_SCHEDULES = ("1f1b", "zb-h1")       # the schedules the cost model prices (and the planner chooses from)
SPLIT_BACKWARD = ("zb-h1",)              # schedules whose backward leaves weight gradients to W actions


def schedule_choices(option: str) -> tuple[str, ...]:
    """The schedules the planner may pick for a user's option: "auto" (every priced one) or one of them."""
    if option == "auto":
        return PLAN_SCHEDULES
    if option not in PLAN_SCHEDULES:
        raise ConfigError(f"schedule={option!r}; valid: auto, {', '.join(PLAN_SCHEDULES)}")
    return (option,)


def max_in_flight(actions: tuple[Action, ...]) -> int:
    """The most micro-batches whose activations are kept at once: forward ran, and the last gradient action
    (the backward, or W where the schedule has W actions) did not yet."""
    release = WGRAD if any(a.kind == WGRAD for a in actions) else BACKWARD
    live = peak = 0
    for a in actions:
        live += 1 if a.kind == FORWARD else -1 if a.kind == release else 0
        peak = max(peak, live)
    return peak


def in_flight_bound(schedule: str, num_stages: int, stage: int, num_microbatches: int) -> int:
    """`max_in_flight` of a stage's actions in closed form (the cost model's activation count)."""
    assert schedule in SCHEDULES, schedule
    if schedule == "gpipe":
        return num_microbatches
    if schedule == "zb-h1":
        return min(num_stages, num_microbatches)
    return min(num_stages - stage, num_microbatches)
