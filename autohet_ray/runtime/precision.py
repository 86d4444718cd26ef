"""Mixed precision: bf16 compute parameters backed by fp32 master weights.

The model computes in bf16. Each compute parameter's gradient is moved into its fp32 master's gradient as soon
as autograd (or a deferred weight-gradient flush) produces it, once per micro-batch, so micro-batches
accumulate in fp32. The layer-wise sync then all-reduces those fp32 gradients, AdamW (fp32 moments) updates
the masters, and `publish` rounds the masters into the compute parameters. Checkpoints hold the masters, so a
restore is exact and a resumed run continues bit for bit.
"""
from __future__ import annotations

import torch

from autohet_ray.runtime.wgrad import WeightGradStore

MASTER_DTYPE = torch.float32


class GradCarrier:
    """Stands in for a master weight whose optimizer state is sharded: it carries only the full-chunk fp32
    gradient (MasterWeights.accumulate writes it), no master copy."""

    def __init__(self, like: torch.Tensor, dtype: torch.dtype):
        self.shape, self.dtype, self.device = like.shape, dtype, like.device
        self.grad: torch.Tensor | None = None

    def element_size(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()


class MasterWeights:
    """`carriers`: names whose optimizer state is sharded (sharded_optim.py): their "master" only carries the
    fp32 gradient; the fp32 master of their slice lives with the sharded optimizer."""

    def __init__(self, params: dict[str, torch.nn.Parameter], carriers: set[str] = frozenset()):
        self.params = params
        self.masters = {n: GradCarrier(p, MASTER_DTYPE) if n in carriers
                        else torch.nn.Parameter(p.detach().to(MASTER_DTYPE).clone()) for n, p in params.items()}
        self._published = [n for n in params if n not in carriers]
        self._name_of = {p: n for n, p in params.items()}

    def accumulate(self, name: str) -> None:
        """Add the compute parameter's gradient into its master's (fp32) and drop the bf16 one."""
        param, master = self.params[name], self.masters[name]
        if param.grad is None:          # a deferred weight's hook during capture: nothing accumulated
            return
        grad = param.grad.to(MASTER_DTYPE)
        if master.grad is None:
            master.grad = grad
        else:
            master.grad.add_(grad)
        param.grad = None

    def accumulate_param(self, param: torch.nn.Parameter) -> None:
        self.accumulate(self._name_of[param])

    def publish(self) -> None:
        """Round the masters into the compute parameters (after every update or load)."""
        with torch.no_grad():
            for name in self._published:
                self.params[name].copy_(self.masters[name])


class MasterGradStore(WeightGradStore):
    """A WeightGradStore whose every flush moves each weight's new gradient into its fp32 master before the
    caller's `on_final` sees it."""

    def __init__(self, masters: MasterWeights):
        super().__init__()
        self._masters = masters

    def flush(self, microbatch: int, on_final=None) -> None:
        def moved(weight):
            self._masters.accumulate_param(weight)
            if on_final is not None:
                on_final(weight)
        super().flush(microbatch, moved)
