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
    orders, runs, _ = _run(fwd_s, bwd_s, link_s, num_microbatches, schedule, wgrad_s, back_link_s, every=True)
    return [Slot(j, orders[j][n][1], orders[j][n][0], start, end) for j, n, start, end in runs]


@dataclass(frozen=True)
class Summary:
    """What the cost model needs of a timeline: when the pipeline ends, and each stage's last gradient action
    (the last backward, or the last W under a split-backward schedule)."""
    end_s: float
    last_gradient: tuple[Slot, ...]


@lru_cache(maxsize=8192)
def simulate_summary(fwd_s: tuple[float, ...], bwd_s: tuple[float, ...], link_s: tuple[float, ...],
                     num_microbatches: int, schedule: str, wgrad_s: tuple[float, ...] | None,
                     back_link_s: tuple[float, ...] | None = None) -> Summary:
    """`simulate`'s end and last gradient actions for hashable arguments, memoized: a plan's identical
    pipelines (and the planner's many candidates sharing pipeline shapes) are simulated once."""
    orders, runs, end_s = _run(fwd_s, bwd_s, link_s, num_microbatches, schedule, wgrad_s, back_link_s, every=False)
    kind, last = (WGRAD if wgrad_s is not None else BACKWARD), num_microbatches - 1
    final = {j: Slot(j, last, kind, start, end) for j, n, start, end in runs if orders[j][n] == (kind, last)}
    return Summary(end_s=end_s, last_gradient=tuple(final[j] for j in range(len(fwd_s))))


def _run(fwd_s, bwd_s, link_s, num_microbatches: int, schedule: str, wgrad_s, back_link_s, every: bool):
    """(orders, [(stage, index in its order, start, end)] in the order the actions are settled, the end of the
    last action): every action, or (`every` False) only those of the last micro-batch. Every stage runs its
    actions in order until one waits for a peer; sweeps repeat until all have run."""
    p = len(fwd_s)
    back_link_s = link_s if back_link_s is None else back_link_s
    orders = _orders(fwd_s, bwd_s, link_s, num_microbatches, schedule, wgrad_s, back_link_s)
    duration = {FORWARD: fwd_s, BACKWARD: bwd_s, WGRAD: wgrad_s}
    # arrivals per stage and micro-batch (None: not yet): forward inputs, gradient inputs, last stage's forwards
    f_in = [[None] * num_microbatches for _ in range(p)]
    b_in = [[None] * num_microbatches for _ in range(p)]
    f_done = [None] * num_microbatches
    pos, free = [0] * p, [0.0] * p
    f_link, b_link = [0.0] * max(p - 1, 0), [0.0] * max(p - 1, 0)
    runs, last = [], num_microbatches - 1
    progress = True
    while progress:
        progress = False
        for j in range(p):
            order, n, t = orders[j], pos[j], free[j]
            last_stage = j == p - 1
            while n < len(order):
                kind, i = order[n]
                if kind == FORWARD:
                    dep = 0.0 if j == 0 else f_in[j][i]
                elif kind == BACKWARD:
                    dep = f_done[i] if last_stage else b_in[j][i]
                else:
                    dep = 0.0                       # W: its backward ran earlier on this stage
                if dep is None:
                    break
                start = max(t, dep)
                t = start + duration[kind][j]
                if every or i == last:
                    runs.append((j, n, start, t))
                n += 1
                if kind == FORWARD:
                    if last_stage:
                        f_done[i] = t
                    else:
                        f_link[j] = max(t, f_link[j]) + link_s[j]
                        f_in[j + 1][i] = f_link[j]
                elif kind == BACKWARD and j > 0:
                    b_link[j - 1] = max(t, b_link[j - 1]) + back_link_s[j - 1]
                    b_in[j - 1][i] = b_link[j - 1]
            progress = progress or n > pos[j]
            pos[j], free[j] = n, t
    assert all(pos[j] == len(orders[j]) for j in range(p)), f"{schedule} schedule deadlocked"
    return orders, runs, max(free)


def _orders(fwd_s, bwd_s, link_s, num_microbatches: int, schedule: str, wgrad_s, back_link_s) -> list[tuple]:
    """Every stage's actions in order, once the durations are checked against them."""
    p = len(fwd_s)
    assert len(bwd_s) == p and len(link_s) == p - 1 and (wgrad_s is None or len(wgrad_s) == p)
    assert len(back_link_s) == p - 1
    orders = [_order(schedule, j, p, num_microbatches) for j in range(p)]
    assert wgrad_s is not None or not any(k == WGRAD for o in orders for k, _ in o), schedule
    return orders
