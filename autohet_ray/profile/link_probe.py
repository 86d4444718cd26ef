"""Link figures between the two ranks of an initialized 2-rank torch.distributed group, as the runtime pays them.

Per-message costs are means of back-to-back messages, not the fastest one: the cost model adds up every
message of a step, so it needs a message's expected cost, including waking a receiver that blocked (on a loaded host or a small VM a
wake-up can take milliseconds, far above the best case of two ranks a barrier has just lined up). A collective
pays more than its ring steps: NCCL launches a kernel, gloo hands the work to its worker thread and back. That
fixed part is `collective_overhead_s`: the mean all-reduce time minus the ring formula's.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

SMALL_BYTES = 4


def _round_trip(rank: int, buf: torch.Tensor) -> None:
    if rank == 0:
        dist.send(buf, 1)
        dist.recv(buf, 1)
    else:
        dist.recv(buf, 0)
        dist.send(buf, 0)


def _seconds(op, reps: int) -> list[float]:
    """Each of `reps` back-to-back runs of `op`, in seconds (after a warm-up)."""
    for _ in range(3):                                          # warm-up: connections, allocations
        op()
    dist.barrier()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        op()
        times.append(time.perf_counter() - start)
    return times


def probe_link(rank: int, num_bytes: int, reps: int = 20, device: str = "cpu",
               collective_bytes: int = 128 << 10) -> dict:
    """{"bandwidth_Bps", "latency_s", "collective_overhead_s"} (LinkProfile fields) of this 2-rank group.
    The bandwidth is a per-byte rate: from the fastest 4-byte and `num_bytes` round trips. The latency is
    the per-message fixed cost as the runtime pays it: the mean 4-byte one-way time. The collective overhead:
    the mean all-reduce of `collective_bytes` (about one micro-batch's hidden states: the TP collective) minus
    the ring formula's seconds."""
    assert dist.get_world_size() == 2 and rank in (0, 1), (dist.get_world_size(), rank)
    small, large, hidden = (torch.zeros(max(1, n // 4), dtype=torch.float32, device=device)
                            for n in (SMALL_BYTES, num_bytes, collective_bytes))
    small_s = [t / 2 for t in _seconds(lambda: _round_trip(rank, small), reps)]
    large_s = [t / 2 for t in _seconds(lambda: _round_trip(rank, large), reps)]
    bandwidth = (num_bytes - SMALL_BYTES) / max(min(large_s) - min(small_s), 1e-9)
    latency = sum(small_s) / reps
    all_reduce = sum(_seconds(lambda: dist.all_reduce(hidden), reps)) / reps
    ring = collective_bytes / bandwidth + 2 * latency             # two members: two steps, each half the bytes
    figures = torch.tensor([bandwidth, latency, max(0.0, all_reduce - ring)], dtype=torch.float64)
    dist.broadcast(figures, 0)                                     # both ranks report rank 0's figures
    return {"bandwidth_Bps": float(figures[0]), "latency_s": float(figures[1]),
            "collective_overhead_s": float(figures[2])}
