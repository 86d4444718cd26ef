"""Profiling accuracy on one real device: the per-layer profile (autohet_ray.profile.measure, the same code
`autohet profile` runs on each GPU type) predicts a one-stage pipeline's forward+backward time; the runtime
Engine then trains that stage for real and the two are compared (goal on an H200: within 10%).

Predicted stage time per step = num_microbatches x (embedding + L x layer + head), forward + backward, from
the measured profile. Measured = the Engine's forward and backward op times per step (a zero-target pacer
makes the clock wait for the device after every op, so CUDA times are real), median over the timed steps.

    python -m benchmarks run gpu-profile-check -- --device-type H200 --model gpt3-1.3b --layers 8 \
        --micro-batch 4 --num-microbatches 4 --seq-len 2048          # on a GPU machine (bf16)
    python -m benchmarks run gpu-profile-check                        # CPU dry run (tiny model, fp32)

Ends with one JSON line (predicted and measured seconds, their ratio, device name, dtype).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import socket
import statistics

import torch
import torch.distributed as dist

from autohet_ray.model.spec import load_model
from autohet_ray.data.synthetic import synthetic_batch
from autohet_ray.emulate.pacer import PACED_OPS, EmulationPacer
from autohet_ray.plan.schema import plan_from_dict
from autohet_ray.profile.measure import measure_profile
from autohet_ray.runtime.engine import Engine


def one_stage_plan(spec, device_type: str, micro_batch: int, num_microbatches: int, seq_len: int) -> dict:
    stage = {"layers": [0, spec.num_layers], "tp": 1, "device_type": device_type, "node": "local", "devices": [0]}
    return {"schema_version": 1, "model": spec.name, "global_batch": micro_batch * num_microbatches,
            "micro_batch": micro_batch, "seq_len": seq_len,
            "pipelines": [{"num_microbatches": num_microbatches, "stages": [stage]}]}


def predicted_stage_s(db, device_type: str, spec, micro_batch: int, num_microbatches: int) -> float:
    entry = db.entries[(device_type, 1, micro_batch)]
    per_mb = sum((entry[k].fwd_s + entry[k].bwd_s) * (spec.num_layers if k == "layer" else 1)
                 for k in ("embedding", "layer", "head"))
    return num_microbatches * per_mb


def measured_stage_s(engine: Engine, spec, global_batch: int, seq_len: int, warmup: int, steps: int) -> float:
    times = []
    for step in range(warmup + steps):
        batch = synthetic_batch(vocab_size=spec.vocab_size, global_batch=global_batch, seq_len=seq_len, seed=0,
                                step=step)
        timings = engine.train_step(batch)["timings"]
        if step >= warmup:
            times.append(timings.get("forward", 0.0) + timings.get("backward", 0.0))
    return statistics.median(times)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def add_stage_arguments(ap: argparse.ArgumentParser) -> None:
    """The one-stage shape the device checks share: model, layers, micro-batch size and count, sequence."""
    ap.add_argument("--model", default="tiny-gpt")
    ap.add_argument("--layers", type=int, help="use this many layers of the model (fits one GPU)")
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--num-microbatches", type=int, default=4)
    ap.add_argument("--seq-len", type=int)


@dataclasses.dataclass(frozen=True)
class StageSetup:
    spec: object
    seq_len: int
    cuda: bool
    device: torch.device
    dtype: torch.dtype


def stage_setup(args) -> StageSetup:
    """The model (cut to --layers), sequence length, and device: the GPU in bf16, else the CPU in fp32."""
    spec = load_model(args.model)
    if args.layers:
        spec = dataclasses.replace(spec, num_layers=args.layers)
    cuda = torch.cuda.is_available()
    device, dtype = (torch.device("cuda", 0), torch.bfloat16) if cuda else (torch.device("cpu"), torch.float32)
    return StageSetup(spec, args.seq_len or spec.max_seq_len, cuda, device, dtype)


@contextlib.contextmanager
def one_rank_world(cuda: bool):
    """A world of one process (the Engine needs a process group)."""
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0,
                            world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_stage_arguments(ap)
    ap.add_argument("--device-type", default="H200", help="catalog name the profile is filed under")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args(argv)

    setup = stage_setup(args)
    spec, seq_len, device, dtype = setup.spec, setup.seq_len, setup.device, setup.dtype
    db = measure_profile(spec, args.device_type, (1,), (args.micro_batch,), seq_len, device=device, dtype=dtype)
    predicted = predicted_stage_s(db, args.device_type, spec, args.micro_batch, args.num_microbatches)

    with one_rank_world(setup.cuda):
        plan = plan_from_dict(one_stage_plan(spec, args.device_type, args.micro_batch, args.num_microbatches,
                                             seq_len))
        pacer = EmulationPacer(targets={op: 0.0 for op in PACED_OPS}, time_scale=1.0)   # only to sync the clock
        engine = Engine(plan=plan, model_spec=spec, rank=0, device=device, dtype=dtype, pacer=pacer)
        measured = measured_stage_s(engine, spec, plan.global_batch, seq_len, args.warmup, args.steps)
    out = {"device": db.meta["device_name"], "device_type": args.device_type, "dtype": str(dtype),
           "model": spec.name, "layers": spec.num_layers, "micro_batch": args.micro_batch,
           "num_microbatches": args.num_microbatches, "seq_len": seq_len, "predicted_stage_s": predicted,
           "measured_stage_s": measured, "measured_over_predicted": measured / predicted,
           "within_10pct": abs(measured / predicted - 1) <= 0.10}
    print(f"{out['device']} ({dtype}): predicted {predicted * 1e3:.2f} ms, measured {measured * 1e3:.2f} ms "
          f"per step (x{out['measured_over_predicted']:.3f})")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
