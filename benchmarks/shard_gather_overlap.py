"""What the sharded path's all-gather costs a step on CPU (gloo, loopback), overlapped or not.

Sharded optimizer state ends each update with an all-gather of the new weights (runtime/shard_sync.py).
With overlap (the default) every bucket is posted right after the update and each is waited for only by the
forward pre-hook of the first unit that reads it; without, the step waits for all of them before it returns.
For one asymmetric two-pipeline plan (4 ranks, every unit held by both pipelines) this runs `--steps` steps
(after one warm-up step) unsharded, sharded without overlap and sharded with overlap, in one spawned world,
and reports per mode the slowest rank's mean step seconds and, per rank, the mean seconds a step waited for
all-gathers (exposed gather time). Prints one JSON line last.
Run: python -m benchmarks run shard-gather-overlap -- [--steps 5] [--microbatches 4]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from autohet_ray.model.spec import ModelSpec
from autohet_ray.plan.schema import Pipeline, Plan, Stage
from autohet_ray.runtime import Engine, run_world

SPEC = ModelSpec(name="bench-gpt", family="gpt", num_layers=8, hidden=256, num_heads=8, num_kv_heads=8,
                 ffn_hidden=1024, vocab_size=2048, max_seq_len=64)
MICRO_BATCH, SEQ_LEN = 2, 64
MODES = ("none", "sharded-blocking", "sharded-overlapped")


def make_plan(num_microbatches: int) -> Plan:
    """Pipeline 0: layers [0,4) -> [4,8); pipeline 1: [0,2) -> [2,8); every stage shards its optimizer state."""
    pipelines = []
    for p, cut in enumerate((4, 2)):
        stages = tuple(Stage(layers=layers, tp=1, device_type="cpu", node=f"n{p}", devices=(i,), shard_optimizer=True)
                       for i, layers in enumerate(((0, cut), (cut, SPEC.num_layers))))
        pipelines.append(Pipeline(num_microbatches=num_microbatches, stages=stages))
    return Plan(model=SPEC.name, global_batch=2 * MICRO_BATCH * num_microbatches, micro_batch=MICRO_BATCH,
                seq_len=SEQ_LEN, pipelines=tuple(pipelines))


def _run(rank: int, plan: Plan, mode: str, steps: int, batch: dict) -> dict:
    engine = Engine(plan=plan, model_spec=SPEC, rank=rank, lr=1e-4, dtype=torch.float32,
                    optimizer_sharding="none" if mode == "none" else "dp")
    if mode == "sharded-blocking":
        engine.grad_sync.overlap_gathers = False
    engine.train_step(batch)                                   # warm-up
    waited = getattr(engine.grad_sync, "gather_wait_s", 0.0)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        engine.train_step(batch)
        times.append(time.perf_counter() - start)
    if engine.sharded is not None:
        engine.grad_sync.settle_gathers()                      # the last step's, inside no step: not counted
    wait = (getattr(engine.grad_sync, "gather_wait_s", 0.0) - waited) / steps
    return {"step_s": statistics.mean(times), "gather_wait_s": wait}


def _bench_rank(rank: int, world_size: int, plan: Plan, steps: int) -> dict:
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, SPEC.vocab_size, (plan.global_batch, plan.seq_len), generator=g)
    batch = {"input_ids": ids, "labels": ids.roll(-1, dims=1)}
    return {mode: _run(rank, plan, mode, steps, batch) for mode in MODES}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--microbatches", type=int, default=4)
    args = ap.parse_args(argv)
    ranks = run_world(_bench_rank, 4, make_plan(args.microbatches), args.steps)
    out = {"steps": args.steps, "microbatches": args.microbatches}
    for mode in MODES:
        out[mode] = {"step_s": max(r[mode]["step_s"] for r in ranks),
                     "gather_wait_s_per_rank": [round(r[mode]["gather_wait_s"], 5) for r in ranks]}
        print(f"{mode:20s} step {out[mode]['step_s']:.4f} s (slowest rank); gather wait per rank "
              f"{out[mode]['gather_wait_s_per_rank']}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
