"""Event simulation of one pipeline's 1F1B schedule: when each stage runs which micro-batch.

Used to draw plans and to check the closed-form 1F1B time of `pipeline.one_f_one_b_time`.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Slot:
    stage: int
    microbatch: int
    kind: str          # "F" or "B"
    start_s: float
    end_s: float


def one_f_one_b_order(stage: int, num_stages: int, num_microbatches: int) -> list[tuple[str, int]]:
    """Stage's actions: warm-up forwards, then alternate one forward / one backward, then cool-down backwards."""
    warmup = min(num_stages - stage - 1, num_microbatches)
    order = [("F", i) for i in range(warmup)]
    f, b = warmup, 0
    while f < num_microbatches:
        order += [("F", f), ("B", b)]
        f, b = f + 1, b + 1
    order += [("B", i) for i in range(b, num_microbatches)]
    return order


def simulate(fwd_s: list[float], bwd_s: list[float], link_s: list[float], num_microbatches: int) -> list[Slot]:
    """Start/end of every action; a forward needs the previous stage's forward plus the link, a backward the
    next stage's backward plus the link; each stage runs its actions in 1F1B order; links are full duplex and
    carry one message at a time per direction."""
    p = len(fwd_s)
    orders = [one_f_one_b_order(j, p, num_microbatches) for j in range(p)]
    done: dict[tuple[str, int, int], float] = {}
    pos, free = [0] * p, [0.0] * p
    link_free = {("F", l): 0.0 for l in range(p - 1)} | {("B", l): 0.0 for l in range(p - 1)}
    arrive: dict[tuple[str, int, int], float] = {}
    slots: list[Slot] = []
    progress = True
    while progress:
        progress = False
        for j in range(p):
            if pos[j] == len(orders[j]):
                continue
            kind, i = orders[j][pos[j]]
            dep = _ready(kind, i, j, p, arrive)
            if dep is None:
                continue
            start = max(free[j], dep)
            end = start + (fwd_s[j] if kind == "F" else bwd_s[j])
            slots.append(Slot(j, i, kind, start, end))
            done[(kind, i, j)] = free[j] = end
            pos[j] += 1
            progress = True
            _send(kind, i, j, p, end, link_s, link_free, arrive)
    assert all(pos[j] == len(orders[j]) for j in range(p)), "1F1B schedule deadlocked"
    return slots


def _ready(kind: str, i: int, j: int, p: int, arrive: dict) -> float | None:
    if kind == "F":
        return 0.0 if j == 0 else arrive.get(("F", i, j))
    if j == p - 1:
        return arrive.get(("Fdone", i, j), None)
    return arrive.get(("B", i, j))


def _send(kind, i, j, p, end, link_s, link_free, arrive) -> None:
    if kind == "F" and j == p - 1:
        arrive[("Fdone", i, j)] = end
    elif kind == "F":
        start = max(end, link_free[("F", j)])
        link_free[("F", j)] = start + link_s[j]
        arrive[("F", i, j + 1)] = start + link_s[j]
    elif j > 0:
        start = max(end, link_free[("B", j - 1)])
        link_free[("B", j - 1)] = start + link_s[j - 1]
        arrive[("B", i, j - 1)] = start + link_s[j - 1]
