"""Deferred weight gradients for split-backward schedules (zb-h1).

A linear layer with a `WeightGradStore` attached runs `linear`, whose backward computes the input and bias
gradients at once; the weight gradient too, unless the store is capturing a micro-batch: then it keeps the
layer's input and output gradient, and a later `flush` of that micro-batch computes grad_W = grad^T x and
accumulates it into `weight.grad`. The backward then returns no weight gradient, but autograd still calls the
weight's post-accumulate-grad hooks, so a hook must not take that as the gradient being complete.
"""
from __future__ import annotations

from collections import Counter
from contextlib import contextmanager

import torch
import torch.nn.functional as F


def weight_grad(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """dL/dW of y = x W^T (+ b), summed over every leading dimension."""
    return grad.reshape(-1, grad.shape[-1]).t() @ x.reshape(-1, x.shape[-1])


class WeightGradStore:
    def __init__(self):
        self._microbatch: int | None = None        # the micro-batch being captured, if any
        self._pending: dict[int, list[tuple[torch.nn.Parameter, torch.Tensor, torch.Tensor]]] = {}

    @property
    def capturing(self) -> bool:
        return self._microbatch is not None

    @contextmanager
    def capture(self, microbatch: int):
        """While active, deferred linears leave their weight gradients to `flush(microbatch)`.

        A plain attribute, not thread-local: autograd runs CUDA backward on its own device threads."""
        assert self._microbatch is None, f"already capturing micro-batch {self._microbatch}"
        self._microbatch = microbatch
        try:
            yield
        finally:
            self._microbatch = None

    def defer(self, weight: torch.nn.Parameter, x: torch.Tensor, grad: torch.Tensor) -> None:
        self._pending.setdefault(self._microbatch, []).append((weight, x, grad))

    def pending(self) -> list[int]:
        """Micro-batches captured and not flushed yet."""
        return sorted(self._pending)

    def flush(self, microbatch: int, on_final=None) -> None:
        """Accumulate the micro-batch's weight gradients in capture order, which is the backward's: later
        layers first. Then `on_final(weight)` once per weight, after its last accumulation here."""
        todo = self._pending.pop(microbatch, [])
        left = Counter(id(w) for w, _, _ in todo)
        with torch.no_grad():
            for weight, x, grad in todo:
                g = weight_grad(grad, x)
                if weight.grad is None:
                    weight.grad = g
                else:
                    weight.grad += g
                left[id(weight)] -= 1
                if on_final is not None and left[id(weight)] == 0:
                    on_final(weight)


class _DeferredLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, store):
        ctx.save_for_backward(x, weight)
        ctx.weight, ctx.store, ctx.has_bias = weight, store, bias is not None
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        need_x, need_w, need_b, _ = ctx.needs_input_grad
        grad_x = grad @ weight if need_x else None
        grad_b = grad.reshape(-1, grad.shape[-1]).sum(0) if ctx.has_bias and need_b else None
        grad_w = None
        if need_w:
            if ctx.store.capturing:
                ctx.store.defer(ctx.weight, x, grad)
            else:
                grad_w = weight_grad(grad, x)
        return grad_x, grad_w, grad_b, None


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
           store: WeightGradStore | None) -> torch.Tensor:
    """F.linear; with a store, its weight gradient can be deferred (see module docstring)."""
    if store is None:
        return F.linear(x, weight, bias)
    return _DeferredLinear.apply(x, weight, bias, store)
