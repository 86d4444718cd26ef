"""Cost of splitting the backward for zero-bubble H1, on one device: the same transformer layers trained with
a plain backward, and with the input-gradient backward (B) and the deferred weight gradients (W) run apart
(runtime/wgrad.py, as the zb-h1 executor does). Reports B + W over the plain backward (the cost model assumes
cost/terms.SPLIT_BACKWARD_OVERHEAD) and the measured W share of the backward beside the cost model's FLOP share (model/costs.py), which
the planner uses to price W.

    python -m benchmarks run wgrad-split-cost                       # CPU: hidden 512, fp32
    python -m benchmarks run wgrad-split-cost -- --model gpt3-1.3b --layers 4 --seq-len 2048 \
        --micro-batch 4 --dtype bfloat16                              # on a GPU machine

Ends with one JSON line. Modes alternate per repetition so that machine load hits both alike.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

import torch

from autohet_ray.cost.terms import SPLIT_BACKWARD_OVERHEAD
from autohet_ray.model.costs import weight_grad_share
from autohet_ray.model.spec import ModelSpec, load_model
from autohet_ray.runtime.parallelize import build_stage_model
from autohet_ray.runtime.tp import ColumnParallelLinear, RowParallelLinear, TPContext
from autohet_ray.runtime.wgrad import WeightGradStore

CPU_MODEL = ModelSpec(name="cpu-gpt", family="gpt", num_layers=4, hidden=512, num_heads=8, num_kv_heads=8,
                      ffn_hidden=2048, vocab_size=8192, max_seq_len=128)


def _timer(device: torch.device):
    def now() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter()
    return now


def _layers_only(spec: ModelSpec, layers: int, device, dtype):
    """A middle stage (no embedding, no head): only transformer layers, whose W share the planner prices."""
    model, _ = build_stage_model(spec, layers=(0, layers), first=False, last=False, tp=TPContext(), seed=0,
                                 device=device, dtype=dtype)
    return model


def _attach(model, store):
    for module in model.modules():
        if isinstance(module, (ColumnParallelLinear, RowParallelLinear)):
            module.wgrad_store = store


def _one(model, x, grad, now, store) -> dict:
    """Forward, backward (and W when `store`) of one micro-batch; seconds per part."""
    for p in model.parameters():
        p.grad = None
    t0 = now()
    out = model(x)
    t1 = now()
    if store is None:
        out.backward(grad)
        t2 = now()
        return {"forward": t1 - t0, "backward": t2 - t1, "wgrad": 0.0}
    with store.capture(0):
        out.backward(grad)
    t2 = now()
    store.flush(0)
    t3 = now()
    return {"forward": t1 - t0, "backward": t2 - t1, "wgrad": t3 - t2}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="preset name or YAML (default: a small GPT for CPU)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--repeats", type=int, default=12)
    args = ap.parse_args(argv)
    spec = load_model(args.model) if args.model else CPU_MODEL
    spec = dataclasses.replace(spec, num_layers=max(args.layers, 1), max_seq_len=max(args.seq_len, 1))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, args.dtype)
    now = _timer(device)
    plain = _layers_only(spec, args.layers, device, dtype)
    split = _layers_only(spec, args.layers, device, dtype)
    store = WeightGradStore()
    _attach(split, store)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(args.micro_batch, args.seq_len, spec.hidden, generator=gen).to(device, dtype).requires_grad_()
    grad = torch.randn(args.micro_batch, args.seq_len, spec.hidden, generator=gen).to(device, dtype)
    runs = {"plain": [], "split": []}
    for rep in range(args.repeats + 2):
        for mode in ("plain", "split") if rep % 2 else ("split", "plain"):
            t = _one(plain if mode == "plain" else split, x, grad, now, None if mode == "plain" else store)
            if rep >= 2:                               # two warm-up repetitions
                runs[mode].append(t)
    med = {mode: {k: statistics.median(r[k] for r in rs) for k in ("forward", "backward", "wgrad")}
           for mode, rs in runs.items()}
    plain_bwd, split_b, split_w = med["plain"]["backward"], med["split"]["backward"], med["split"]["wgrad"]
    out = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "dtype": args.dtype,
           "model": spec.name, "layers": args.layers, "micro_batch": args.micro_batch, "seq_len": args.seq_len,
           "median_s": med, "split_over_plain_backward": (split_b + split_w) / plain_bwd,
           "measured_wgrad_share": split_w / (split_b + split_w),
           "cost_model_wgrad_share": weight_grad_share(spec, "layer", args.seq_len)}
    print(f"{out['device']} {args.dtype}, {spec.name} x{args.layers} layers, micro-batch {args.micro_batch} x "
          f"{args.seq_len} tokens (median of {args.repeats}):")
    print(f"  plain backward {plain_bwd * 1e3:.2f} ms; split: B {split_b * 1e3:.2f} ms + W {split_w * 1e3:.2f} ms "
          f"= {out['split_over_plain_backward']:.3f}x the plain backward (cost model assumes "
          f"{SPLIT_BACKWARD_OVERHEAD:.3f}x)")
    print(f"  W share of the backward: measured {out['measured_wgrad_share']:.3f}, cost model "
          f"{out['cost_model_wgrad_share']:.3f}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
