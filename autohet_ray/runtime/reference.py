"""The whole model in one process on the whole batch, with the same init, loss, clipping and AdamW as the
Engine: the yardstick for the distributed runtime's numerics."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from autohet_ray.model.spec import ModelSpec
from autohet_ray.nn import build_model, materialize
from autohet_ray.runtime.checks import IGNORE_INDEX


class Reference:
    def __init__(self, *, model_spec: ModelSpec, seed: int = 0, lr: float = 1e-3, weight_decay: float = 0.0,
                 max_grad_norm: float | None = 1.0, dtype: torch.dtype = torch.float32, device="cpu"):
        with torch.device("meta"):
            self.model = build_model(model_spec)
        materialize(self.model, seed=seed, num_layers=model_spec.num_layers, device=device, dtype=dtype)
        self.max_grad_norm = max_grad_norm
        self.params = dict(self.model.named_parameters())
        self.optimizer = torch.optim.AdamW(list(self.params.values()), lr=lr, weight_decay=weight_decay)
        self.step = 0

    def loss(self, batch) -> torch.Tensor:
        """Mean cross-entropy over the labelled tokens of the whole batch."""
        device = next(self.model.parameters()).device
        ids, labels = batch["input_ids"].to(device), batch["labels"].to(device)
        logits = self.model(ids)
        total = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum")
        return total / (labels != IGNORE_INDEX).sum()

    def train_step(self, batch) -> dict:
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss(batch)
        loss.backward()
        grads = [p.grad for p in self.params.values()]
        if self.max_grad_norm is not None and self.max_grad_norm > 0:
            norm = torch.nn.utils.clip_grad_norm_(list(self.params.values()), self.max_grad_norm)
        else:
            norm = torch.sqrt(sum(g.double().pow(2).sum() for g in grads))
        self.optimizer.step()
        self.step += 1
        return {"loss": float(loss.detach()), "grad_norm": float(norm), "step": self.step}

    def state_dict(self) -> dict[str, torch.Tensor]:
        out = {n: p.detach().cpu().clone() for n, p in self.params.items()}
        for n, p in self.params.items():
            state = self.optimizer.state.get(p)
            if state:
                out[f"optim.{n}.exp_avg"] = state["exp_avg"].detach().cpu().clone()
                out[f"optim.{n}.exp_avg_sq"] = state["exp_avg_sq"].detach().cpu().clone()
        return out

    def grads(self) -> dict[str, torch.Tensor]:
        return {n: p.grad.detach().cpu().clone() for n, p in self.params.items() if p.grad is not None}
