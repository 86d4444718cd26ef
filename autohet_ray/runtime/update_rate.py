"""The measured cost of the engine's update, for profiles: seconds per parameter of the squared gradient norm,
the clip and AdamW (fp32 master weights and moments), as `Engine` runs them after the gradient sync."""
from __future__ import annotations

import time

import torch

from autohet_ray.model.spec import ModelSpec
from autohet_ray.nn import materialize
from autohet_ray.nn.layers import Block
from autohet_ray.profile.measure import sync_device
from autohet_ray.runtime.lr_schedule import OptimizerConfig
from autohet_ray.runtime.optim import build_adamw, clip_, squared_norm

WARMUP_REPS, TIMED_REPS = 2, 25        # a rep is milliseconds: enough to outlast a burst of other load



def update_s_per_param(spec: ModelSpec, device: torch.device | str | None = None) -> float:
    """Timed on one transformer layer's weights (the fastest of the timed reps, as the layer profile), on
    `device` (default: this process's GPU where it has one, else the CPU, as measure_profile)."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    with torch.device("meta"):
        block = Block(spec)
    materialize(block, seed=0, num_layers=spec.num_layers, device=device, dtype=torch.float32)
    named = {f"layers.0.{n}": p for n, p in block.named_parameters()}
    grads = [torch.randn_like(p) for p in named.values()]
    fresh = [g.clone() for g in grads]
    for p, g in zip(named.values(), grads):
        p.grad = g
    config = OptimizerConfig(weight_decay=0.1, clip_grad=1.0)
    opt = build_adamw(named, config, tied_embeddings=False)
    times = []
    for rep in range(WARMUP_REPS + TIMED_REPS):
        for g, f in zip(grads, fresh):      # clipped again and again, they would shrink into denormals
            g.copy_(f)
        sync_device(device)
        start = time.perf_counter()
        norm = float(squared_norm(grads).sqrt())
        clip_(grads, norm, config.clip_grad)
        opt.step()
        sync_device(device)
        if rep >= WARMUP_REPS:
            times.append(time.perf_counter() - start)
    return min(times) / sum(p.numel() for p in named.values())
