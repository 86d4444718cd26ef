"""Event simulation of one pipeline's schedule: when each stage runs which micro-batch.

Every stage runs its actions (plan/schedule.py) in order. A forward needs the previous stage's forward plus
the link; a backward needs the next stage's backward plus the link (on the last stage, its own forward); a
weight-gradient action (W, split-backward schedules) needs only its own stage's backward, which comes before
it in the order. Links are full duplex and carry one message at a time per direction; a gradient may take
longer than an activation across the same boundary (`back_link_s`: the funnel between different TP degrees
broadcasts inside the receiving stage, which differs by direction).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from autohet_ray.plan.schedule import BACKWARD, FORWARD, SCHEDULES, WGRAD


@dataclass(frozen=True)
class Slot:
    stage: int
    microbatch: int
    kind: str          # "F", "B" or "W"
    start_s: float
    end_s: float


def one_f_one_b_order(stage: int, num_stages: int, num_microbatches: int) -> list[tuple[str, int]]:
    """Stage's 1F1B actions as (kind, micro-batch): warm-up forwards, one forward / one backward, cool-down."""
    return schedule_order("1f1b", stage, num_stages, num_microbatches)


def schedule_order(schedule: str, stage: int, num_stages: int, num_microbatches: int) -> list[tuple[str, int]]:
    return list(_order(schedule, stage, num_stages, num_microbatches))


@lru_cache(maxsize=4096)
def _order(schedule: str, stage: int, num_stages: int, num_microbatches: int) -> tuple[tuple[str, int], ...]:
    return tuple((a.kind, a.microbatch) for a in SCHEDULES[schedule](num_stages, stage, num_microbatches))


def simulate(fwd_s: list[float], bwd_s: list[float], link_s: list[float], num_microbatches: int,
             schedule: str = "1f1b", wgrad_s: list[float] | None = None,
             back_link_s: list[float] | None = None) -> list[Slot]:
    """Start/end of every action. `bwd_s[j]` is stage j's backward; under a split-backward schedule it is the
    input-gradient part only and `wgrad_s[j]` the weight-gradient action. `link_s[l]`: an activation from
    stage l to l + 1; `back_link_s[l]`: a gradient from l + 1 to l (default: the same as `link_s`)."""
    p = len(fwd_s)
    back_link_s = link_s if back_link_s is None else back_link_s
    assert len(bwd_s) == p and len(link_s) == p - 1 and (wgrad_s is None or len(wgrad_s) == p)
    assert len(back_link_s) == p - 1
    duration = {FORWARD: fwd_s, BACKWARD: bwd_s, WGRAD: wgrad_s}
    orders = [_order(schedule, j, p, num_microbatches) for j in range(p)]
    assert wgrad_s is not None or not any(k == WGRAD for o in orders for k, _ in o), schedule
    pos, free = [0] * p, [0.0] * p
    link_free = {(FORWARD, l): 0.0 for l in range(p - 1)} | {(BACKWARD, l): 0.0 for l in range(p - 1)}
    arrive: dict[tuple[str, int, int], float] = {}
    slots: list[Slot] = []
    progress = True
    while progress:
        progress = False
        for j in range(p):
            while pos[j] < len(orders[j]):          # this stage's actions until one waits for a peer
                kind, i = orders[j][pos[j]]
                dep = _ready(kind, i, j, p, arrive)
                if dep is None:
                    break
                start = max(free[j], dep)
                end = start + duration[kind][j]
                slots.append(Slot(j, i, kind, start, end))
                free[j] = end
                pos[j] += 1
                progress = True
                _send(kind, i, j, p, end, link_s, back_link_s, link_free, arrive)
    assert all(pos[j] == len(orders[j]) for j in range(p)), f"{schedule} schedule deadlocked"
    return slots


@lru_cache(maxsize=8192)
def simulate_cached(fwd_s: tuple[float, ...], bwd_s: tuple[float, ...], link_s: tuple[float, ...],
                    num_microbatches: int, schedule: str,
                    wgrad_s: tuple[float, ...] | None,
                    back_link_s: tuple[float, ...] | None = None) -> tuple[Slot, ...]:
    """`simulate` for hashable arguments, memoized: a plan's identical pipelines (and the planner's many
    candidates sharing pipeline shapes) are simulated once."""
    return tuple(simulate(list(fwd_s), list(bwd_s), list(link_s), num_microbatches, schedule,
                          None if wgrad_s is None else list(wgrad_s),
                          None if back_link_s is None else list(back_link_s)))


def _ready(kind: str, i: int, j: int, p: int, arrive: dict) -> float | None:
    if kind == WGRAD:
        return 0.0                     # its backward ran earlier on this stage
    if kind == FORWARD:
        return 0.0 if j == 0 else arrive.get((FORWARD, i, j))
    if j == p - 1:
        return arrive.get(("Fdone", i, j), None)
    return arrive.get((BACKWARD, i, j))


def _send(kind, i, j, p, end, link_s, back_link_s, link_free, arrive) -> None:
    if kind == FORWARD and j == p - 1:
        arrive[("Fdone", i, j)] = end
    elif kind == FORWARD:
        start = max(end, link_free[(FORWARD, j)])
        link_free[(FORWARD, j)] = start + link_s[j]
        arrive[(FORWARD, i, j + 1)] = start + link_s[j]
    elif kind == BACKWARD and j > 0:
        start = max(end, link_free[(BACKWARD, j - 1)])
        link_free[(BACKWARD, j - 1)] = start + back_link_s[j - 1]
        arrive[(BACKWARD, i, j - 1)] = start + back_link_s[j - 1]
