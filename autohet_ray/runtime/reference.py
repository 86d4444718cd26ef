"""The whole model in one process on the whole batch, with the same init, loss, clipping, AdamW (parameter
groups) and LR schedule as the Engine: the yardstick for the distributed runtime's numerics (in one dtype, no
master weights)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from autohet_ray.model.spec import ModelSpec
from autohet_ray.nn import build_model, materialize
from autohet_ray.runtime.checks import IGNORE_INDEX
from autohet_ray.runtime.lr_schedule import OptimizerConfig
from autohet_ray.runtime.optim import build_adamw, resolve_config, set_lr


class Reference:
    def __init__(self, *, model_spec: ModelSpec, seed: int = 0, optimizer: OptimizerConfig | None = None,
                 lr: float | None = None, weight_decay: float | None = None, max_grad_norm: float | None = None,
                 dtype: torch.dtype = torch.float32, device="cpu"):
        with torch.device("meta"):
            self.model = build_model(model_spec)
        materialize(self.model, seed=seed, num_layers=model_spec.num_layers, device=device, dtype=dtype)
        self.config = resolve_config(optimizer, lr=lr, weight_decay=weight_decay, clip_grad=max_grad_norm)
        self.params = dict(self.model.named_parameters())
        self.optimizer = build_adamw(self.params, self.config, tied_embeddings=model_spec.tie_embeddings,
                                     optimizer_class=torch.optim.AdamW)   # torch's class: checks runtime/adamw
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
        if self.config.clip_grad > 0:
            norm = torch.nn.utils.clip_grad_norm_(list(self.params.values()), self.config.clip_grad)
        else:
            norm = torch.sqrt(sum(g.double().pow(2).sum() for g in grads))
        lr = self.config.lr_at(self.step)
        set_lr(self.optimizer, lr)
        self.optimizer.step()
        self.step += 1
        return {"loss": float(loss.detach()), "grad_norm": float(norm), "lr": lr, "step": self.step}

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
