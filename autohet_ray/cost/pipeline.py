"""1F1B time of one pipeline from its stage times and inter-stage link times."""
from __future__ import annotations


def one_f_one_b_time(stage_s: list[float], link_s: list[float], num_microbatches: int) -> float:
    """(m - 1) * bottleneck + one micro-batch's forward and backward through every stage and link.

    `stage_s[j]` is stage j's fwd+bwd per micro-batch; `link_s[l]` is one activation (or gradient) transfer
    between stage l and l+1, each direction. In steady state every stage, and every link direction, is busy
    once per micro-batch, so the slowest of them sets the pace; the first micro-batch's forward and the last
    one's backward cross every stage and link once (warm-up and cool-down).
    """
    assert num_microbatches >= 1 and len(link_s) == len(stage_s) - 1
    bottleneck = max(max(stage_s), max(link_s, default=0.0))
    return (num_microbatches - 1) * bottleneck + sum(stage_s) + 2 * sum(link_s)


def in_flight(stage: int, num_stages: int, num_microbatches: int) -> int:
    """Micro-batches whose activations stage `stage` holds at once under 1F1B."""
    return min(num_stages - stage, num_microbatches)
