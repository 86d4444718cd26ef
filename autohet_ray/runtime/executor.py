"""Runs one stage's schedule (a list of forward, backward and weight-gradient actions) for one step."""
from __future__ import annotations

import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from autohet_ray.runtime.bridge import Bridge
from autohet_ray.plan.schedule import BACKWARD, FORWARD, WGRAD, Action
from autohet_ray.runtime.tp import TPContext
from autohet_ray.runtime.vocab_ce import vocab_parallel_cross_entropy
from autohet_ray.runtime.wgrad import WeightGradStore


class Clock:
    """Times operations (seconds per op name, summed until `reset`) and reports each to the pacer, which may
    stretch it. On CUDA with a pacer it waits for the device so that the pacer sees real durations."""

    def __init__(self, pacer, device: torch.device):
        self.pacer = pacer
        self.sync = pacer is not None and device.type == "cuda"
        self.totals: dict[str, float] = {}

    def reset(self) -> dict[str, float]:
        """The step's (or evaluation's) totals; the pacer starts a new schedule."""
        if self.pacer is not None:
            self.pacer.end_step()
        totals, self.totals = self.totals, {}
        return totals

    def wait(self, op: str, fn) -> None:
        """Run `fn` timed under `op` but not paced (a wait outside the cost model's ops)."""
        start = time.perf_counter()
        fn()
        self.totals[op] = self.totals.get(op, 0.0) + time.perf_counter() - start

    def run(self, op: str, fn, **info):
        start = time.perf_counter()
        result = fn()
        if self.sync:
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        if self.pacer is not None:
            self.pacer.pace(op, elapsed, **info)
        self.totals[op] = self.totals.get(op, 0.0) + time.perf_counter() - start
        return result


@dataclass(frozen=True, kw_only=True)
class MicroBatches:
    input_ids: list[torch.Tensor]       # per micro-batch [micro_batch, seq] (used on a first stage)
    labels: list[torch.Tensor]          # per micro-batch (used on a last stage)
    num_tokens: int                     # labelled tokens in the whole global batch (the loss divisor)


class StepAborted(RuntimeError):
    """The step was stopped from another thread (the job is recovering from a lost node)."""


class StageExecutor:
    """`wgrad`: the store of the stage's deferred linears, for schedules with W actions: backwards capture
    their micro-batch's weight gradients, W actions flush them; the step's last W calls
    `on_final_weight_grad(weight)` for each weight whose gradient it completes."""

    def __init__(self, *, model: torch.nn.Module, bridge: Bridge, tp: TPContext, first: bool, last: bool,
                 clock: Clock, before_last_backward=None, wgrad: WeightGradStore | None = None,
                 on_final_weight_grad=None):
        self.model, self.bridge, self.tp, self.clock = model, bridge, tp, clock
        self.first, self.last = first, last
        self.before_last_backward = before_last_backward     # called once per step (e.g. arm grad sync)
        self.wgrad, self.on_final_weight_grad = wgrad, on_final_weight_grad
        self.stop = threading.Event()      # set from another thread: the step fails at the next action

    def run(self, actions: tuple[Action, ...], data: MicroBatches) -> torch.Tensor:
        """Run every action; returns this stage's summed loss contribution (0 unless last stage)."""
        saved: dict[int, tuple[torch.Tensor | None, torch.Tensor]] = {}
        total = torch.zeros((), dtype=torch.float64, device=next(self.model.parameters()).device)
        last_backward = max(n for n, a in enumerate(actions) if a.kind == BACKWARD)
        last_wgrad = max((n for n, a in enumerate(actions) if a.kind == WGRAD), default=None)
        assert last_wgrad is None or self.wgrad is not None, "W actions need a WeightGradStore"
        for n, action in enumerate(actions):
            if self.stop.is_set():
                raise StepAborted(f"step aborted before {action.kind} of micro-batch {action.microbatch}")
            i = action.microbatch
            if action.kind == FORWARD:
                saved[i] = self._forward(i, data)
                if self.last:
                    total += saved[i][1].detach().double()
            elif action.kind == BACKWARD:
                if n == last_backward and self.before_last_backward is not None:
                    self.before_last_backward()
                self._backward(i, *saved.pop(i), split=last_wgrad is not None)
            else:
                on_final = self.on_final_weight_grad if n == last_wgrad else None
                self.clock.run("wgrad", lambda: self.wgrad.flush(i, on_final), microbatch=i)
        assert not saved, f"micro-batches {sorted(saved)} never ran backward"
        assert self.wgrad is None or not self.wgrad.pending(), \
            f"micro-batches {self.wgrad.pending()} never ran W"
        return total

    def evaluate(self, data: MicroBatches, num_microbatches: int) -> torch.Tensor:
        """Forward only, every micro-batch in order, no gradients kept; this stage's summed loss (last stage)."""
        total = torch.zeros((), dtype=torch.float64, device=next(self.model.parameters()).device)
        with torch.no_grad():
            for i in range(num_microbatches):
                if self.stop.is_set():
                    raise StepAborted(f"evaluation aborted before forward of micro-batch {i}")
                _, out = self._forward(i, data)
                if self.last:
                    total += out.double()
        return total

    def _forward(self, i: int, data: MicroBatches):
        if self.first:
            x = data.input_ids[i]
        else:
            x = self.clock.run("recv_activation", self.bridge.recv_activation, microbatch=i,
                               num_bytes=self.bridge.message_bytes)
            x.requires_grad_(torch.is_grad_enabled())
        out = self.clock.run("forward", lambda: self._compute(x, data, i), microbatch=i)
        if not self.last:
            self.clock.run("send_activation", lambda: self.bridge.send_activation(out), microbatch=i,
                           num_bytes=out.numel() * out.element_size())
        return (None if self.first else x), out

    def _compute(self, x: torch.Tensor, data: MicroBatches, i: int) -> torch.Tensor:
        out = self.model(x)
        if not self.last:
            return out
        loss = vocab_parallel_cross_entropy(out, data.labels[i], tp=self.tp)
        return loss.sum() / data.num_tokens

    def _backward(self, i: int, x: torch.Tensor | None, out: torch.Tensor, split: bool) -> None:
        grad = None
        if not self.last:
            grad = self.clock.run("recv_grad", self.bridge.recv_grad, microbatch=i,
                                  num_bytes=self.bridge.message_bytes)
        self.clock.run("backward", lambda: self._autograd(i, out, grad, split), microbatch=i)
        if x is not None:
            g = x.grad
            self.clock.run("send_grad", lambda: self.bridge.send_grad(g), microbatch=i,
                           num_bytes=g.numel() * g.element_size())

    def _autograd(self, i: int, out: torch.Tensor, grad: torch.Tensor | None, split: bool) -> None:
        """Backpropagate a micro-batch; under a split schedule leave the deferred weight gradients to W."""
        with self.wgrad.capture(i) if split else nullcontext():
            torch.autograd.backward(out, grad)
