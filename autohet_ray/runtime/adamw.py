"""AdamW with torch's own update (the functional `torch.optim.adamw.adamw`, one tensor at a time on CPU, foreach
where torch's class would pick it), held as plain state: `.param_groups` and `.state[param]` with the keys torch's
class uses. Why not torch.optim.AdamW itself: building or stepping it imports torch._dynamo, about 1.1 CPU-s in
every fresh process on torch 2.13, and every rank of every launch builds one. The one-process reference
(runtime/reference.py) keeps torch's class, so every numerics test checks this one against it."""
from __future__ import annotations

import torch
from torch.optim.adamw import adamw as adamw_update

ADAMW_DEFAULTS = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 1e-2}   # torch.optim.AdamW's


class AdamW:
    """AdamW over parameter groups (dicts with "params" and optionally lr, betas, eps, weight_decay)."""

    def __init__(self, param_groups: list[dict], **defaults) -> None:
        unknown = set(defaults) - set(ADAMW_DEFAULTS)
        assert not unknown, f"unsupported AdamW options {sorted(unknown)}"
        base = {**ADAMW_DEFAULTS, **defaults}
        self.param_groups = [{**base, **group, "params": list(group["params"])} for group in param_groups]
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if set_to_none:
                    p.grad = None
                elif p.grad is not None:
                    p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            with_grad = [p for p in group["params"] if p.grad is not None]
            states = [self._state_of(p) for p in with_grad]
            beta1, beta2 = group["betas"]
            adamw_update(with_grad, [p.grad for p in with_grad], [s["exp_avg"] for s in states],
                         [s["exp_avg_sq"] for s in states], [], [s["step"] for s in states],
                         amsgrad=False, beta1=beta1, beta2=beta2, lr=group["lr"],
                         weight_decay=group["weight_decay"], eps=group["eps"], maximize=False)

    def _state_of(self, p: torch.Tensor) -> dict[str, torch.Tensor]:
        """A parameter's state, made on its first step as torch's class makes it (a CPU scalar step counter)."""
        state = self.state.get(p)
        if not state:
            step_dtype = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
            state = self.state[p] = {"step": torch.tensor(0.0, dtype=step_dtype),
                                     "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                                     "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
        return state
