"""Closed-form 1F1B time of one pipeline from its stage times and inter-stage link times, and what zero-bubble
H1 saves on it (the planner's fast estimates; the evaluator simulates the schedule exactly, see timeline.py)."""
from __future__ import annotations


def steady_period(stage_s: list[float], link_s: list[float]) -> float:
    """Time per micro-batch in steady state: the slowest stage or link direction, or the round trip from a
    stage through the rest of the pipeline and back divided by the micro-batches it has in flight (p - j)."""
    p = len(stage_s)
    period = max(max(stage_s), max(link_s, default=0.0))
    tail = 0.0
    for j in range(p - 1, -1, -1):
        tail += stage_s[j] + (2 * link_s[j] if j < p - 1 else 0.0)
        period = max(period, tail / (p - j))
    return period


def one_f_one_b_time(stage_s: list[float], link_s: list[float], num_microbatches: int) -> float:
    """(m - 1) * steady period + one micro-batch's forward and backward through every stage and link.

    `stage_s[j]` is stage j's fwd+bwd per micro-batch; `link_s[l]` is one activation (or gradient) transfer
    between stage l and l+1, each direction."""
    assert num_microbatches >= 1 and len(link_s) == len(stage_s) - 1
    return (num_microbatches - 1) * steady_period(stage_s, link_s) + sum(stage_s) + 2 * sum(link_s)


def in_flight(stage: int, num_stages: int, num_microbatches: int) -> int:
    """Micro-batches whose activations stage `stage` holds at once under 1F1B."""
    return min(num_stages - stage, num_microbatches)


def zero_bubble_bubble_saving(wgrad_s: list[float]) -> float:
    """How much sooner zero-bubble H1 ends than 1F1B on the same stage times: 2 (sum of W - largest W), the
    paper's uniform-stage bubble difference 2 (p - 1) W generalized (never above the simulated saving on random
    pipelines). `wgrad_s[j]`: stage j's weight-gradient seconds per micro-batch."""
    return 2 * (sum(wgrad_s) - max(wgrad_s))
