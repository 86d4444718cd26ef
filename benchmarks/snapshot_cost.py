"""CPU cost of one node-store snapshot, by phase, in one process (no Ray, no compute competing).

Encodes a rank's state (default 10 fp32 tensors of 1024x3072: 120 MiB) into reused buffers, hashes every chunk,
writes the chunks into a LocalDirTier under /dev/shm (as the node stores do) and deletes the previous step's
chunks. Ends with one JSON line: seconds per phase (median over the steps after the first) and CPU seconds per MiB.

    python -m benchmarks run snapshot-cost -- [--tensors N] [--steps S]
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time

import torch

from autohet_ray.checkpoint.codec import digest
from autohet_ray.checkpoint.snapshot import encode_shards
from autohet_ray.checkpoint.tiers.localdir import LocalDirTier
from autohet_ray.layout import Chunk

SHAPE = (1024, 3072)


def one_step(tier, state, spare, step):
    marks = [time.perf_counter()]
    items = encode_shards(state, None, spare)
    marks.append(time.perf_counter())
    for item in items:
        item.digest = digest(item.blob)
    marks.append(time.perf_counter())
    for item in items:
        tier.put_chunk(f"s{step}/{item.name}", item.blob)
    marks.append(time.perf_counter())
    for key in tier.list(f"s{step - 1}/"):
        tier.delete(key)
    marks.append(time.perf_counter())
    phases = dict(zip(("encode_s", "hash_s", "write_s", "delete_s"), (b - a for a, b in zip(marks, marks[1:]))))
    return phases, {(i.name, i.chunk): i.blob for i in items}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tensors", type=int, default=10)
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    state = {f"t{i}": (torch.randn(*SHAPE), SHAPE, Chunk.whole(SHAPE)) for i in range(args.tensors)}
    mib = args.tensors * SHAPE[0] * SHAPE[1] * 4 / 2**20
    root = tempfile.mkdtemp(prefix="snapshot-cost-", dir="/dev/shm")
    try:
        tier, spare, rows, cpu = LocalDirTier(root, fsync=False), {}, [], []
        for step in range(args.steps):
            c0 = time.process_time()
            phases, spare = one_step(tier, state, spare, step)
            cpu.append(time.process_time() - c0)
            rows.append(phases)
            print(f"step {step}: " + " ".join(f"{k} {v:.3f}" for k, v in phases.items()) + f" cpu {cpu[-1]:.3f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    steady = rows[1:] or rows
    out = {k: statistics.median(r[k] for r in steady) for k in steady[0]}
    out |= {"state_mib": mib, "cpu_s": statistics.median(cpu[1:] or cpu)}
    out["cpu_s_per_100_mib"] = out["cpu_s"] / mib * 100
    print(json.dumps(out))


if __name__ == "__main__":
    main()
