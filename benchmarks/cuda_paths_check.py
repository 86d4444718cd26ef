"""The CUDA paths on one GPU: a one-rank NCCL group trains tiny-llama in bf16 (fp32 master weights, AdamW
moments and gradients) and is compared, step by step, with the same run in fp32 on the CPU (gloo), on the
same batches and seed. One GPU allows one NCCL rank, so no NCCL collective here crosses ranks.

    python -m benchmarks run cuda-paths-check -- [--steps 30]
Ends with one JSON line: the largest relative loss gap bf16-on-CUDA vs fp32-on-CPU, the dtypes seen, and the
mean step time on each device (after 3 warm-up steps).
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from autohet_ray.model.spec import PRESETS
from autohet_ray.runtime import Engine, run_world
from autohet_ray.runtime.lr_schedule import OptimizerConfig
from tests.dist._harness import make_batch, make_plan, pipeline      # the tests' hand-written plans

SPEC = PRESETS["tiny-llama"]
PLAN = make_plan(SPEC, pipeline(4, (0, SPEC.num_layers, 1)))
OPTIMIZER = OptimizerConfig(lr=1e-3, min_lr=1e-4, warmup_steps=2, decay="cosine", decay_steps=100,
                            weight_decay=0.1)


def _train(rank: int, world_size: int, steps: int, dtype_name: str) -> dict:
    engine = Engine(plan=PLAN, model_spec=SPEC, rank=rank, seed=5, optimizer=OPTIMIZER,
                    dtype=getattr(torch, dtype_name))
    losses, times = [], []
    for step in range(steps):
        start = time.perf_counter()
        losses.append(engine.train_step(make_batch(SPEC, PLAN, step))["loss"])
        if engine.device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return {"device": str(engine.device), "losses": losses, "step_s": sum(times[3:]) / max(1, len(times) - 3),
            "compute": sorted({str(p.dtype) for p in engine.params.values()}),
            "masters": sorted({str(p.dtype) for p in engine.masters.values()})}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--backend", choices=("nccl", "gloo"), default="nccl",
                        help="gloo runs the bf16 side on the CPU too (a dry run of this script without a GPU)")
    args = parser.parse_args(argv)
    assert args.backend == "gloo" or torch.cuda.is_available(), "no CUDA device (use --backend gloo for a dry run)"
    cuda = run_world(_train, 1, args.steps, "bfloat16", backend=args.backend)[0]
    cpu = run_world(_train, 1, args.steps, "float32", backend="gloo")[0]
    gaps = [abs(a - b) / abs(b) for a, b in zip(cuda["losses"], cpu["losses"])]
    for step, (a, b) in enumerate(zip(cuda["losses"], cpu["losses"])):
        print(f"step {step:3d}  bf16 cuda {a:.5f}  fp32 cpu {b:.5f}")
    print(json.dumps({"bench": "cuda_paths_check", "gpu": torch.cuda.get_device_name(0) if args.backend == "nccl" else None, "steps": args.steps,
                      "max_rel_loss_gap": max(gaps), "final_rel_loss_gap": gaps[-1],
                      "cuda_device": cuda["device"], "cuda_compute": cuda["compute"],
                      "cuda_masters": cuda["masters"], "cuda_step_s": cuda["step_s"], "cpu_step_s": cpu["step_s"],
                      "first_loss": cpu["losses"][0], "last_loss_cpu": cpu["losses"][-1]}))


if __name__ == "__main__":
    main()
