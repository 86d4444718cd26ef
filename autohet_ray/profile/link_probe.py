"""Link figures between the two ranks of an initialized 2-rank torch.distributed group, as the runtime pays them.

Per-message costs are means of back-to-back messages, not the fastest one: the cost model adds up every
message of a step, so it needs a message's expected cost, including waking a receiver that blocked (on a loaded host or a small VM a
wake-up can take milliseconds, far above the best case of two ranks a barrier has just lined up). A collective
pays more than its ring steps: NCCL launches a kernel, gloo hands the work to its worker thread and back; and in
a run each collective follows each rank's own compute, so the ranks arrive apart by their compute's jitter and
the first to arrive blocks and must be woken. That fixed part is `collective_overhead_s`: the mean time of an
all-reduce issued right after a short compute burst (as TP's follows its matmul) minus its ring steps.
Back-to-back collectives, which the previous one has lined up, would measure only the best case. The ring
steps of an all-reduce run at their own rate, `allreduce_bandwidth_Bps`: gloo adds the halves on the host CPU,
so on CPU it is well below the p2p rate. That rate is timed on a gradient bucket synced as the runtime syncs
it (runtime/grad_sync.py): the gradients packed into a fresh buffer, all-reduced, and copied back. On a CPU
host the fresh buffer's first touch (page faults) and the copies cost about as much as the ring steps; on a
GPU the caching allocator and HBM make them noise.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

SMALL_BYTES = 4
GRADS_PER_BUCKET = 8          # gradient tensors packed into the probe's bucket


def _round_trip(rank: int, buf: torch.Tensor) -> None:
    if rank == 0:
        dist.send(buf, 1)
        dist.recv(buf, 1)
    else:
        dist.recv(buf, 0)
        dist.send(buf, 0)


def _seconds(op, reps: int, burst=None) -> list[float]:
    """Each of `reps` runs of `op` in seconds, after a warm-up: back to back, or each right after this rank's
    own `burst` of compute (timed without it)."""
    for _ in range(3):                                          # warm-up: connections, allocations
        if burst is not None:
            burst()
        op()
    dist.barrier()
    times = []
    for _ in range(reps):
        if burst is not None:
            burst()
        start = time.perf_counter()
        op()
        times.append(time.perf_counter() - start)
    return times


def probe_link(rank: int, num_bytes: int, reps: int = 20, device: str = "cpu",
               collective_bytes: int = 128 << 10, allreduce_bytes: int = 16 << 20, burst_dim: int = 256) -> dict:
    """{"bandwidth_Bps", "latency_s", "collective_overhead_s", "allreduce_bandwidth_Bps"} (LinkProfile
    fields) of this 2-rank group. The bandwidth is a per-byte rate: from the fastest 4-byte and `num_bytes`
    round trips. The latency is the per-message fixed cost as the runtime pays it: the mean 4-byte one-way
    time. The all-reduce figures come from the mean all-reduce of `collective_bytes` (about one micro-batch's
    hidden states: the TP collective) and of `allreduce_bytes` (a gradient bucket), each right after a
    `burst_dim`-cubed matmul (a fraction of a millisecond of one CPU thread): their difference gives the
    all-reduce's per-byte rate, and what the smaller one pays beyond its ring steps is the fixed overhead."""
    assert dist.get_world_size() == 2 and rank in (0, 1), (dist.get_world_size(), rank)
    small, large, hidden = (torch.zeros(max(1, n // 4), dtype=torch.float32, device=device)
                            for n in (SMALL_BYTES, num_bytes, collective_bytes))
    grads = [torch.zeros(allreduce_bytes // 4 // GRADS_PER_BUCKET, device=device) for _ in range(GRADS_PER_BUCKET)]
    small_s = [t / 2 for t in _seconds(lambda: _round_trip(rank, small), reps)]
    large_s = [t / 2 for t in _seconds(lambda: _round_trip(rank, large), reps)]
    bandwidth = (num_bytes - SMALL_BYTES) / max(min(large_s) - min(small_s), 1e-9)
    latency = sum(small_s) / reps
    a, b = (torch.rand(burst_dim, burst_dim, device=device) for _ in range(2))
    # a heavy tail (a woken rank can wait milliseconds on a VM) needs many samples for a steady mean
    hidden_s = _mean(_seconds(lambda: dist.all_reduce(hidden), 4 * reps, burst=lambda: a @ b))
    bucket_s = _mean(_seconds(lambda: _sync_bucket(grads), reps, burst=lambda: a @ b))
    # two members: two ring steps, each moving half the bytes
    reduce_bw = (allreduce_bytes - collective_bytes) / max(bucket_s - hidden_s, 1e-9)
    overhead = max(0.0, hidden_s - collective_bytes / reduce_bw - 2 * latency)
    figures = torch.tensor([bandwidth, latency, overhead, reduce_bw], dtype=torch.float64)
    dist.broadcast(figures, 0)                                     # both ranks report rank 0's figures
    return {"bandwidth_Bps": float(figures[0]), "latency_s": float(figures[1]),
            "collective_overhead_s": float(figures[2]), "allreduce_bandwidth_Bps": float(figures[3])}


def _sync_bucket(grads: list[torch.Tensor]) -> None:
    """As runtime/grad_sync.py syncs a bucket: pack into a fresh buffer, all-reduce, copy the sums back."""
    buf = torch.cat(grads)
    dist.all_reduce(buf)
    pos = 0
    for g in grads:
        g.copy_(buf[pos: pos + g.numel()])
        pos += g.numel()


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)
