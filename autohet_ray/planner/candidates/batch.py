"""Integer micro-batch allocation across pipelines: minimize the slowest pipeline's time.

Giving the next micro-batch to the pipeline whose time after taking it is smallest is optimal for
minimizing the maximum of nondecreasing per-pipeline times (exchange argument); a heap makes it O(M log P).
"""
from __future__ import annotations

import heapq
from typing import Callable


def allocate_microbatches(time_fns: list[Callable[[int], float]], total: int) -> list[int] | None:
    """Counts m_k >= 1 summing to `total`; time_fns[k](m) is pipeline k's time with m micro-batches
    (float('inf') when infeasible). None when there are more pipelines than micro-batches."""
    n = len(time_fns)
    if n > total:
        return None
    counts = [1] * n
    heap = [(fn(2), k) for k, fn in enumerate(time_fns)]
    heapq.heapify(heap)
    for _ in range(total - n):
        _, k = heapq.heappop(heap)
        counts[k] += 1
        heapq.heappush(heap, (time_fns[k](counts[k] + 1), k))
    return counts
