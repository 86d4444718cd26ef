"""The learning rate as a pure function of the optimizer step: linear warm-up, then cosine, linear or no decay
down to `min_lr`.

`step` counts the updates already taken (0 for the first update), so a run resumed at step N takes exactly
the rates the uninterrupted run takes from N on. Warm-up: update s < warmup_steps uses lr * (s + 1) /
warmup_steps (the first update is not wasted at 0; the last warm-up update reaches lr). Decay: from
warmup_steps to decay_steps (counted from step 0, warm-up included) the rate falls from lr to min_lr; past
decay_steps it stays at min_lr.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Literal

from autohet_ray import ConfigError
from autohet_ray.config_io import dataclass_from_dict

DECAYS = ("cosine", "linear", "constant")
Decay = Literal[DECAYS]


def check_schedule(*, lr: float, min_lr: float, warmup_steps: int, decay: str, decay_steps: int | None) -> None:
    """ConfigError naming the first bad value."""
    if not (isinstance(lr, (int, float)) and lr > 0 and math.isfinite(lr)):
        raise ConfigError(f"lr={lr!r} must be a positive number")
    if not (isinstance(min_lr, (int, float)) and 0 <= min_lr <= lr):
        raise ConfigError(f"min_lr={min_lr!r} must lie in [0, lr={lr!r}]")
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
        raise ConfigError(f"warmup_steps={warmup_steps!r} must be an integer >= 0")
    if decay not in DECAYS:
        raise ConfigError(f"decay={decay!r}; valid: {', '.join(DECAYS)}")
    if decay_steps is not None and (isinstance(decay_steps, bool) or not isinstance(decay_steps, int)
                                    or decay_steps < 1):
        raise ConfigError(f"decay_steps={decay_steps!r} must be a positive integer (or unset)")
    if decay != "constant" and decay_steps is None:
        raise ConfigError(f"decay={decay!r} needs decay_steps (the step at which the rate reaches min_lr)")
    if decay != "constant" and decay_steps < warmup_steps:
        raise ConfigError(f"decay_steps={decay_steps} must be >= warmup_steps={warmup_steps}")


def lr_at(step: int, *, lr: float, min_lr: float, warmup_steps: int, decay: str, decay_steps: int | None) -> float:
    """The rate of update number `step` (0-based)."""
    assert step >= 0, step
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if decay == "constant":
        return lr
    span = decay_steps - warmup_steps
    progress = 1.0 if span <= 0 else min(1.0, (step - warmup_steps) / span)
    if decay == "linear":
        return lr - (lr - min_lr) * progress
    assert decay == "cosine", decay
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


@dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
    """AdamW, gradient clipping and the learning-rate schedule of a run: plain data, the same on every rank
    (TrainJob.optimizer). Each default is stated here once."""
    lr: float = 1e-3
    """Peak learning rate (reached at the end of warm-up)."""
    min_lr: float = 0.0
    """The rate at the end of the decay (and after it)."""
    warmup_steps: int = 0
    """Updates of linear warm-up from lr / warmup_steps to lr."""
    decay: Decay = "constant"
    """"cosine", "linear" or "constant" (no decay) from the end of warm-up to decay_steps."""
    decay_steps: int | None = None
    """The step at which the decay reaches min_lr, warm-up included (`autohet train`: its --steps)."""
    weight_decay: float = 0.0
    """AdamW's decoupled weight decay, on matrices only: never on norms, biases or embeddings."""
    clip_grad: float = 1.0
    """Clip the global gradient norm to this (0: no clipping)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW's moment decay rates."""

    def __post_init__(self):
        check_schedule(lr=self.lr, min_lr=self.min_lr, warmup_steps=self.warmup_steps, decay=self.decay,
                       decay_steps=self.decay_steps)
        if not (isinstance(self.weight_decay, (int, float)) and self.weight_decay >= 0):
            raise ConfigError(f"weight_decay={self.weight_decay!r} must be a number >= 0")
        if self.clip_grad is None or not (isinstance(self.clip_grad, (int, float)) and self.clip_grad >= 0):
            raise ConfigError(f"clip_grad={self.clip_grad!r} must be a number >= 0 (0: no clipping)")
        betas = tuple(self.betas) if isinstance(self.betas, (list, tuple)) else ()
        if len(betas) != 2 or not all(isinstance(b, (int, float)) and 0 <= b < 1 for b in betas):
            raise ConfigError(f"betas={self.betas!r} must be two numbers in [0, 1)")
        object.__setattr__(self, "betas", tuple(float(b) for b in betas))     # JSON gives a list

    def lr_at(self, step: int) -> float:
        return lr_at(step, lr=self.lr, min_lr=self.min_lr, warmup_steps=self.warmup_steps, decay=self.decay,
                     decay_steps=self.decay_steps)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict) -> "OptimizerConfig":
        if not isinstance(raw, dict):
            raise ConfigError(f"optimizer={raw!r} must be a mapping of OptimizerConfig fields")
        return dataclass_from_dict(cls, raw, "optimizer config")


def check_resumed_config(saved: dict | None, current: OptimizerConfig, where: str) -> None:
    """A checkpoint continues exactly only under the optimizer config it was trained with: ConfigError naming
    every field that differs. `saved` None (a checkpoint from before configs were recorded): nothing to check."""
    if saved is None:
        return
    recorded = OptimizerConfig.from_dict(saved)
    differ = [f"{name}: checkpoint {getattr(recorded, name)!r}, this run {getattr(current, name)!r}"
              for name in recorded.to_dict() if getattr(recorded, name) != getattr(current, name)]
    if differ:
        raise ConfigError(f"{where} was trained with another optimizer config ({'; '.join(differ)}); resume it "
                          "with the config it recorded")
