"""Checkpoint overhead on one real device: step time of a one-stage Engine with every step snapshotted into a
node store (/dev/shm, as the elastic job's node tier) vs without, with the copy in the background (what elastic
jobs do: beside the next step's forward and backward, from a GPU on a side CUDA stream) and, for comparison, with
the copy on the training thread. Blocks of steps alternate off / background / synchronous, so slow drift hits all.

On a GPU this is the issue's overhead bar measured where it matters (compute on the device, snapshot work on the
host); on a CPU-only machine it is a dry run: compute on one core (--cpu-threads), snapshot threads beside it.

    python -m benchmarks run snapshot-overhead-device -- --model gpt3-1.3b --layers 8 --micro-batch 4 \
        --num-microbatches 4 --seq-len 2048                                  # on a GPU machine (bf16)
    python -m benchmarks run snapshot-overhead-device                     # CPU dry run (tiny model, fp32)

Ends with one JSON line (median step seconds per mode, their ratios, the state bytes snapshotted per step).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

import torch

from autohet_ray.checkpoint import AsyncSnapshotter, SnapshotPolicy
from autohet_ray.checkpoint.tiers.localdir import LocalDirTier
from autohet_ray.data.synthetic import synthetic_batch
from autohet_ray.plan.schema import plan_from_dict
from autohet_ray.runtime.engine import Engine
from benchmarks.gpu_profile_check import add_stage_arguments, one_rank_world, one_stage_plan, stage_setup

MODES = ("off", "background", "sync")


class SnapshotDriver:
    """Snapshots the engine after each step in one mode; the next optimizer step waits for a background copy
    (the elastic worker's protocol)."""

    def __init__(self, engine: Engine, snapshotter: AsyncSnapshotter):
        self.engine, self.snapshotter = engine, snapshotter
        self.last = None
        engine.before_update = snapshotter.wait_copied

    def step(self, batch: dict, mode: str) -> float:
        start = time.perf_counter()
        self.engine.train_step(batch)                    # returns floats: the device is synchronized
        if mode != "off":
            self.last = self.snapshotter.snapshot(self.engine.step, self.engine.live_state(),
                                                  background_copy=mode == "background")
        return time.perf_counter() - start

    def settle(self) -> None:
        """Let the lanes finish between blocks, so a block starts without the previous mode's work."""
        if self.last is not None:
            self.last.fast_result(timeout=600)


def state_bytes(engine: Engine) -> int:
    return sum(t.numel() * t.element_size() for t, _, _ in engine.live_state().values())


def run(engine: Engine, spec, plan, seq_len: int, blocks: int, per_block: int, store: str) -> dict:
    root = tempfile.mkdtemp(prefix="snapshot-overhead-", dir=store)
    node = LocalDirTier(root, name="node", fsync=False)
    snapshotter = AsyncSnapshotter(local=node, policy=SnapshotPolicy(storage_every=0))
    driver = SnapshotDriver(engine, snapshotter)
    walls = {mode: [] for mode in MODES}
    try:
        step = 0
        for _ in range(blocks):
            for mode in MODES:
                for i in range(per_block + 1):           # the first step of a block pays the switch: not counted
                    batch = synthetic_batch(vocab_size=spec.vocab_size, global_batch=plan.global_batch,
                                            seq_len=seq_len, seed=0, step=step)
                    wall = driver.step(batch, mode)
                    step += 1
                    if i:
                        walls[mode].append(wall)
                driver.settle()
                node.delete_many(node.list())              # keep the store small: emptied between blocks
    finally:
        snapshotter.close()
        shutil.rmtree(root, ignore_errors=True)
    med = {mode: statistics.median(v) for mode, v in walls.items()}
    return {"step_s": med, "samples_per_mode": len(walls["off"]),
            "overhead_background": med["background"] / med["off"], "overhead_sync": med["sync"] / med["off"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_stage_arguments(ap)
    ap.add_argument("--blocks", type=int, default=3)
    ap.add_argument("--steps-per-block", type=int, default=4)
    ap.add_argument("--store", default=os.environ.get("AUTOHET_NODE_STORE") or "/dev/shm",
                    help="directory the node store is made in (default: $AUTOHET_NODE_STORE, else /dev/shm)")
    ap.add_argument("--cpu-threads", type=int, default=1,
                    help="torch threads when computing on the CPU (1, as elastic stage actors run)")
    args = ap.parse_args(argv)

    setup = stage_setup(args)
    spec, seq_len, cuda, dtype = setup.spec, setup.seq_len, setup.cuda, setup.dtype
    if not cuda:
        torch.set_num_threads(args.cpu_threads)
    os.makedirs(args.store, exist_ok=True)
    with one_rank_world(cuda):
        plan = plan_from_dict(one_stage_plan(spec, "local", args.micro_batch, args.num_microbatches, seq_len))
        engine = Engine(plan=plan, model_spec=spec, rank=0, device=setup.device, dtype=dtype)
        figures = run(engine, spec, plan, seq_len, args.blocks, args.steps_per_block, args.store)
        nbytes = state_bytes(engine)
    out = {"device": torch.cuda.get_device_name(0) if cuda else "cpu", "dtype": str(dtype), "model": spec.name,
           "layers": spec.num_layers, "micro_batch": args.micro_batch, "num_microbatches": args.num_microbatches,
           "seq_len": seq_len, "state_bytes_per_step": nbytes, **figures, "goal_overhead": 1.05}
    s = figures["step_s"]
    print(f"{out['device']} ({dtype}), {nbytes / 2**20:.0f} MiB of state per step: step {s['off']:.3f} s off, "
          f"{s['background']:.3f} s background copy (x{figures['overhead_background']:.3f}), "
          f"{s['sync']:.3f} s copy on the training thread (x{figures['overhead_sync']:.3f})")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
