"""The measured cost of the engine's update, for profiles: seconds per parameter of the squared gradient norm,
the clip and AdamW (fp32 master weights and moments), as `Engine` runs them after the gradient sync."""
from __future__ import annotations

import statistics
import time

import torch

from autohet_ray.model.spec import ModelSpec
from autohet_ray.nn import materialize
from autohet_ray.nn.layers import Block
from autohet_ray.profile.measure import cpu_quota_period_s, reps_per_block, sync_device
from autohet_ray.runtime.lr_schedule import OptimizerConfig
from autohet_ray.runtime.optim import build_adamw, clip_, squared_norm

WARMUP_REPS, TIMED_REPS = 2, 25        # a rep is milliseconds: enough to outlast a burst of other load
STAGE_LAYERS = 4                       # timed on a stage's worth of layers, as the in-situ profile chains them
MAX_TIMED_PARAMS = 100_000_000         # but at most this many weights (1.6 GB of fp32 weights, grads, moments)


class UpdateTimer:
    """The engine's update (norm, clip, AdamW) of a stage's worth of transformer layers' weights (see
    update_s_per_param); `rep()` times one update."""

    def __init__(self, spec: ModelSpec, device: torch.device | str | None = None):
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        named = {}
        for i in range(timed_layers(spec)):
            with torch.device("meta"):
                block = Block(spec)
            materialize(block, seed=0, num_layers=spec.num_layers, device=self.device, dtype=torch.float32)
            named |= {f"layers.{i}.{n}": p for n, p in block.named_parameters()}
        self.grads = [torch.randn_like(p) for p in named.values()]
        self.fresh = [g.clone() for g in self.grads]
        for p, g in zip(named.values(), self.grads):
            p.grad = g
        self.config = OptimizerConfig(weight_decay=0.1, clip_grad=1.0)
        self.optimizer = build_adamw(named, self.config, tied_embeddings=False)
        self.params = sum(p.numel() for p in named.values())

    def rep(self) -> float:
        """Seconds of one update."""
        for g, f in zip(self.grads, self.fresh):      # clipped again and again, they would shrink into denormals
            g.copy_(f)
        sync_device(self.device)
        start = time.perf_counter()
        norm = float(squared_norm(self.grads).sqrt())
        clip_(self.grads, norm, self.config.clip_grad)
        self.optimizer.step()
        sync_device(self.device)
        return time.perf_counter() - start


def update_s_per_param(spec: ModelSpec, device: torch.device | str | None = None) -> float:
    """Timed on the weights of a stage's worth of transformer layers (the median rep: a step pays the typical
    update), on `device` (default: this process's GPU where it has one, else the CPU, as measure_profile).
    A stage's worth, not one layer: on a CPU the update's working set decides its speed (one layer's weights,
    grads and moments partly stay in cache, a stage's do not), and a step updates a whole stage."""
    timer = UpdateTimer(spec, device)
    times = [timer.rep() for _ in range(WARMUP_REPS + TIMED_REPS)][WARMUP_REPS:]
    block = reps_per_block(statistics.median(times), cpu_quota_period_s())
    if block > 1:            # under a CFS quota (a testbed device): the mean over many periods, waits included
        times = [sum(timer.rep() for _ in range(block)) / block for _ in range(3)]
    return statistics.median(times) / timer.params


def timed_layers(spec: ModelSpec) -> int:
    """Layers whose update is timed: STAGE_LAYERS (at most the model's), fewer where they exceed
    MAX_TIMED_PARAMS, at least one."""
    with torch.device("meta"):
        per_layer = sum(p.numel() for p in Block(spec).parameters())
    return max(1, min(STAGE_LAYERS, spec.num_layers, MAX_TIMED_PARAMS // per_layer))
