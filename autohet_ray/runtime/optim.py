"""AdamW with decay only on matrices, global gradient-norm clipping, and AdamW state in the engine's
state-dict format."""
from __future__ import annotations

import dataclasses

import torch

from autohet_ray import ConfigError
from autohet_ray.layout import Chunk
from autohet_ray.runtime.adamw import AdamW
from autohet_ray.runtime.lr_schedule import OptimizerConfig

StateDict = dict[str, tuple[torch.Tensor, tuple[int, ...], Chunk]]
ADAM_KEYS = ("exp_avg", "exp_avg_sq")
STEP_KEY = "optim.step"


def needs_of_layout(layout: dict) -> dict:
    """What a rank must load: its parameters, their AdamW moments and the optimizer step counter."""
    needs = {}
    for name, (shape, chunk) in layout.items():
        needs[name] = (tuple(shape), chunk)
        for moment in ADAM_KEYS:
            needs[f"optim.{name}.{moment}"] = (tuple(shape), chunk)
    needs[STEP_KEY] = ((), Chunk.whole(()))
    return needs



def holdings_of_layout(layout: dict, master_dtype: torch.dtype) -> list[tuple[str, Chunk, int]]:
    """(name, chunk, bytes) a rank stores for `layout` without sharded optimizer state: the master weights
    (`master_dtype`: fp32 under bf16 compute), their AdamW moments and the step counter (8 bytes)."""
    item = torch.empty((), dtype=master_dtype).element_size()
    return [(name, chunk, max(1, chunk.numel) * (8 if name == STEP_KEY else item))
            for name, (_, chunk) in needs_of_layout(layout).items()]

def resolve_config(optimizer: OptimizerConfig | None, **overrides) -> OptimizerConfig:
    """`optimizer` (default: OptimizerConfig()) with the fields given in `overrides` (None: not given)."""
    given = {k: v for k, v in overrides.items() if v is not None}
    return dataclasses.replace(optimizer or OptimizerConfig(), **given)


def decays(name: str, *, tied_embeddings: bool) -> bool:
    """Whether weight decay applies to a parameter: not to norms, biases or embeddings (a head tied to the
    embedding is the embedding: its copies must stay equal)."""
    module, _, kind = name.rpartition(".")
    if kind == "bias" or "norm" in module.rpartition(".")[2] or name.startswith("embedding."):
        return False
    return not (tied_embeddings and module == "head.out")


def build_adamw(named: dict[str, torch.nn.Parameter], config: OptimizerConfig, *, tied_embeddings: bool,
                optimizer_class=AdamW):
    """AdamW over `named` (master weights), in two groups: with and without weight decay. `optimizer_class`:
    runtime/adamw.AdamW, or torch.optim.AdamW (the one-process reference)."""
    with_decay = [p for n, p in named.items() if decays(n, tied_embeddings=tied_embeddings)]
    without = [p for n, p in named.items() if not decays(n, tied_embeddings=tied_embeddings)]
    groups = [{"params": with_decay, "weight_decay": config.weight_decay}, {"params": without, "weight_decay": 0.0}]
    return optimizer_class([g for g in groups if g["params"]], lr=config.lr_at(0), betas=config.betas)


def set_lr(opt, lr: float) -> None:
    for group in opt.param_groups:
        group["lr"] = lr


def squared_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """Sum of squares, accumulated in fp64 (a scalar). Each tensor's norm is taken in fp64 without an fp64 copy
    of the gradient (a third of the time of squaring a copy; the same sum to ~1e-13)."""
    norms = [torch.linalg.vector_norm(g.detach(), dtype=torch.float64) for g in grads]
    return torch.stack(norms).square().sum() if norms else torch.zeros((), dtype=torch.float64)


def clip_(grads: list[torch.Tensor], norm: float, max_norm: float | None) -> None:
    """Scale like torch.nn.utils.clip_grad_norm_ does, given the global norm."""
    if max_norm is None or max_norm <= 0:
        return
    coef = min(max_norm / (norm + 1e-6), 1.0)
    for g in grads:
        g.mul_(coef)


def optimizer_state(opt, params: dict[str, torch.nn.Parameter],
                    layout: dict[str, tuple[tuple[int, ...], Chunk]]) -> StateDict:
    out: StateDict = {}
    step = 0.0
    for name, p in params.items():
        state = opt.state.get(p)
        if not state:
            continue
        shape, chunk = layout[name]
        for key in ADAM_KEYS:
            out[f"optim.{name}.{key}"] = (state[key].detach().cpu().clone(), shape, chunk)
        step = float(state["step"])
    out[STEP_KEY] = (torch.tensor(step, dtype=torch.float64), (), Chunk.whole(()))
    return out


def load_optimizer_state(opt, params: dict[str, torch.nn.Parameter],
                         state: StateDict) -> None:
    step = float(state[STEP_KEY][0]) if STEP_KEY in state else 0.0
    opt.state.clear()
    if step == 0:
        return
    for name, p in params.items():
        entry = {"step": torch.tensor(step, dtype=torch.float32)}
        for key in ADAM_KEYS:
            full = f"optim.{name}.{key}"
            if full not in state:
                raise ConfigError(f"state dict has optim.step={step:g} but lacks {full!r}")
            tensor = state[full][0]
            if tuple(tensor.shape) != tuple(p.shape):
                raise ConfigError(f"state dict {full!r} has shape {tuple(tensor.shape)}, this rank holds "
                                  f"{tuple(p.shape)}")
            entry[key] = tensor.to(device=p.device, dtype=p.dtype).clone()
        opt.state[p] = entry


def live_views(opt, params: dict[str, torch.nn.Parameter],
               layout: dict[str, tuple[tuple[int, ...], Chunk]]) -> StateDict:
    """Parameters and AdamW state as views, no copy (for a snapshotter that copies what it writes itself);
    the step counter as a fresh scalar. The same keys as the state dict."""
    out: StateDict = {}
    step = 0.0
    for name, p in params.items():
        shape, chunk = layout[name]
        out[name] = (p.detach(), shape, chunk)
        state = opt.state.get(p)
        if state:
            for key in ADAM_KEYS:
                out[f"optim.{name}.{key}"] = (state[key].detach(), shape, chunk)
            step = float(state["step"])
    out[STEP_KEY] = (torch.tensor(step, dtype=torch.float64), (), Chunk.whole(()))
    return out
