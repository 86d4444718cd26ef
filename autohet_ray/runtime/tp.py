"""Tensor parallelism inside one stage (Megatron-style, on the stage's own process group).

`f` (copy_to_tp: identity forward, all-reduce backward) enters a column-parallel region; `g`
(reduce_from_tp: all-reduce forward, identity backward) leaves a row-parallel one. Activations between
layers are replicated across the TP ranks of a stage.
With a `wgrad_store` set (split-backward schedules) the TP linears can leave their weight gradients to later W
actions (wgrad.py); those need no TP communication (each rank's gradient comes from its own input shard and
output gradient).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from autohet_ray.runtime.wgrad import WeightGradStore, linear


@dataclass(frozen=True, kw_only=True)
class TPContext:
    size: int = 1                     # TP degree of the stage
    rank: int = 0                     # this rank's index inside the stage
    group: object | None = None       # the stage's process group; None when size == 1

    def __post_init__(self):
        assert 0 <= self.rank < self.size and (self.size == 1 or self.group is not None), self


def all_reduce(x: torch.Tensor, tp: TPContext, op=dist.ReduceOp.SUM) -> torch.Tensor:
    if tp.size > 1:
        dist.all_reduce(x, op=op, group=tp.group)
    return x


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, tp):
        ctx.tp = tp
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return all_reduce(grad.contiguous().clone(), ctx.tp), None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, tp):
        return all_reduce(x.contiguous().clone(), tp)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def copy_to_tp(x: torch.Tensor, tp: TPContext) -> torch.Tensor:
    return _CopyToTP.apply(x, tp) if tp.size > 1 else x


def reduce_from_tp(x: torch.Tensor, tp: TPContext) -> torch.Tensor:
    return _ReduceFromTP.apply(x, tp) if tp.size > 1 else x


def _local(n: int, tp: TPContext, what: str) -> int:
    assert n % tp.size == 0, f"{what}={n} is not divisible by TP degree {tp.size}"
    return n // tp.size


class ColumnParallelLinear(nn.Module):
    """y[..., local out] = x W_r^T + b_r with W split by rows (output features); output stays sharded."""

    def __init__(self, in_features: int, out_features: int, *, bias: bool, tp: TPContext, device=None, dtype=None):
        super().__init__()
        self.tp = tp
        local = _local(out_features, tp, "out_features")
        self.weight = nn.Parameter(torch.empty(local, in_features, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.empty(local, device=device, dtype=dtype)) if bias else None
        self.wgrad_store: WeightGradStore | None = None     # set for split-backward schedules (wgrad.py)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(copy_to_tp(x, self.tp), self.weight, self.bias, self.wgrad_store)


class RowParallelLinear(nn.Module):
    """y = sum_r x[..., local in] W_r^T + b with W split by columns (input features); output replicated."""

    def __init__(self, in_features: int, out_features: int, *, bias: bool, tp: TPContext, device=None, dtype=None):
        super().__init__()
        self.tp = tp
        local = _local(in_features, tp, "in_features")
        self.weight = nn.Parameter(torch.empty(out_features, local, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.empty(out_features, device=device, dtype=dtype)) if bias else None
        self.wgrad_store: WeightGradStore | None = None     # set for split-backward schedules (wgrad.py)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = reduce_from_tp(linear(x, self.weight, None, self.wgrad_store), self.tp)
        return y + self.bias if self.bias is not None else y


class VocabParallelEmbedding(nn.Module):
    """Embedding table split by rows (vocabulary); each rank looks up its ids, the rest are summed in."""

    def __init__(self, num_embeddings: int, dim: int, *, tp: TPContext, device=None, dtype=None):
        super().__init__()
        self.tp = tp
        local = _local(num_embeddings, tp, "vocab_size")
        self.vocab_start = tp.rank * local
        self.weight = nn.Parameter(torch.empty(local, dim, device=device, dtype=dtype))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.vocab_start
        outside = (local < 0) | (local >= self.weight.shape[0])
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        out = out.masked_fill(outside.unsqueeze(-1), 0.0)
        return reduce_from_tp(out, self.tp)
