"""Checkpoint overhead on one real device: step time of a one-stage Engine with every step snapshotted into a
node store (/dev/shm, as the elastic job's node tier) vs without, with the copy in the background (what elastic
jobs do: beside the next step's forward and backward, from a GPU on a side CUDA stream) and, for comparison, with
the copy on the training thread. Blocks of steps alternate off / background / synchronous, so slow drift hits all.

On a GPU this is the issue's overhead bar measured where it matters (compute on the device, snapshot work on the
host); on a CPU-only machine it is a dry run: compute on one core (--cpu-threads), snapshot threads beside it.

    .venv/bin/python benchmarks/snapshot_overhead_device.py --model gpt3-1.3b --layers 8 --micro-batch 4 \
        --num-microbatches 4 --seq-len 2048                                  # on a GPU machine (bf16)
    .venv/bin/python benchmarks/snapshot_overhead_device.py                  # CPU dry run (tiny model, fp32)

Ends with one JSON line (median step seconds per mode, their ratios, the state bytes snapshotted per step).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import tempfile
import time

import torch
import torch.distributed as dist

from autohet_ray.checkpoint import AsyncSnapshotter, SnapshotPolicy
from autohet_ray.checkpoint.tiers.localdir import LocalDirTier
from autohet_ray.model.spec import load_model
from autohet_ray.orchestrate.data import synthetic_batch
from autohet_ray.plan.schema import plan_from_dict
from autohet_ray.runtime.engine import Engine
from gpu_profile_check import _free_port, one_stage_plan

MODES = ("off", "background", "sync")


class SnapshotDriver:
    """Snapshots the engine after each step in one mode; the background mode waits for its copy before the
    next optimizer step (the elastic worker's protocol)."""

    def __init__(self, engine: Engine, snapshotter: AsyncSnapshotter):
        self.engine, self.snapshotter = engine, snapshotter
        self.copying = self.last = None
        engine.before_update = self._await_copy

    def _await_copy(self) -> None:
        if self.copying is not None:
            self.copying.wait_copied()
            self.copying = None

    def step(self, batch: dict, mode: str) -> float:
        start = time.perf_counter()
        self.engine.train_step(batch)                    # returns floats: the device is synchronized
        if mode != "off":
            handle = self.snapshotter.snapshot(self.engine.step, self.engine.live_state(),
                                               background_copy=mode == "background")
            self.copying = handle if mode == "background" else None
            self.last = handle
        return time.perf_counter() - start

    def settle(self) -> None:
        """Let the lanes finish between blocks, so a block starts without the previous mode's work."""
        if self.last is not None:
            self.last.fast_result(timeout=600)
        self._await_copy()


def state_bytes(engine: Engine) -> int:
    return sum(t.numel() * t.element_size() for t, _, _ in engine.live_state().values())


def run(engine: Engine, spec, plan, seq_len: int, blocks: int, per_block: int, store: str) -> dict:
    root = tempfile.mkdtemp(prefix="snapshot-overhead-", dir=store)
    snapshotter = AsyncSnapshotter(local=LocalDirTier(root, name="node", fsync=False),
                                   policy=SnapshotPolicy(cloud_every=0))
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
                for key in LocalDirTier(root).list():     # keep the store small: one step's chunks at a time
                    LocalDirTier(root).delete(key)
    finally:
        snapshotter.close()
        shutil.rmtree(root, ignore_errors=True)
    med = {mode: statistics.median(v) for mode, v in walls.items()}
    return {"step_s": med, "samples_per_mode": len(walls["off"]),
            "overhead_background": med["background"] / med["off"], "overhead_sync": med["sync"] / med["off"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-gpt")
    ap.add_argument("--layers", type=int, help="use this many layers of the model (fits one GPU)")
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--num-microbatches", type=int, default=4)
    ap.add_argument("--seq-len", type=int)
    ap.add_argument("--blocks", type=int, default=3)
    ap.add_argument("--steps-per-block", type=int, default=4)
    ap.add_argument("--store", default=os.environ.get("AUTOHET_NODE_STORE") or "/dev/shm",
                    help="directory the node store is made in (default: $AUTOHET_NODE_STORE, else /dev/shm)")
    ap.add_argument("--cpu-threads", type=int, default=1,
                    help="torch threads when computing on the CPU (1, as elastic stage actors run)")
    args = ap.parse_args(argv)

    spec = load_model(args.model)
    if args.layers:
        spec = dataclasses.replace(spec, num_layers=args.layers)
    seq_len = args.seq_len or spec.max_seq_len
    cuda = torch.cuda.is_available()
    device, dtype = (torch.device("cuda", 0), torch.bfloat16) if cuda else (torch.device("cpu"), torch.float32)
    if not cuda:
        torch.set_num_threads(args.cpu_threads)
    store = args.store
    os.makedirs(store, exist_ok=True)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0,
                            world_size=1)
    try:
        plan = plan_from_dict(one_stage_plan(spec, "local", args.micro_batch, args.num_microbatches, seq_len))
        engine = Engine(plan=plan, model_spec=spec, rank=0, device=device, dtype=dtype)
        figures = run(engine, spec, plan, seq_len, args.blocks, args.steps_per_block, store)
        nbytes = state_bytes(engine)
    finally:
        dist.destroy_process_group()
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
