"""Activations forward and their gradients backward between adjacent stages of one pipeline.

Both are replicated across the TP ranks of a stage. When the two stages have the same TP degree, TP rank r
sends straight to TP rank r. Otherwise only the stage leaders (TP rank 0) talk and the receiving leader
broadcasts inside its stage (TP4 -> TP1 -> TP2 works either way).
Sends are non-blocking (kept until `flush`); receives block.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

ACTIVATION_TAG = 0
GRAD_TAG = 1


@dataclass(frozen=True, kw_only=True)
class Route:
    """Who this rank sends to / receives from across one stage boundary (global ranks)."""
    send_to: int | None
    recv_from: int | None
    broadcast_from: int | None   # the leader to broadcast from inside this stage after a receive, if any


def route(mine: tuple[int, ...], other: tuple[int, ...] | None, me: int) -> Route:
    """Route between this rank's stage `mine` and a neighbour stage `other` (both in global ranks)."""
    if other is None:
        return Route(send_to=None, recv_from=None, broadcast_from=None)
    r = mine.index(me)
    if len(mine) == len(other):
        return Route(send_to=other[r], recv_from=other[r], broadcast_from=None)
    leader = other[0] if r == 0 else None
    return Route(send_to=leader, recv_from=leader, broadcast_from=mine[0] if len(mine) > 1 else None)


class Bridge:
    def __init__(self, *, prev: Route, next: Route, tp_group, shape: tuple[int, ...], dtype: torch.dtype,
                 device: torch.device):
        self.prev, self.next = prev, next
        self.tp_group = tp_group
        self.shape, self.dtype, self.device = shape, dtype, device
        self._pending: list[tuple[dist.Work, torch.Tensor]] = []

    @property
    def message_bytes(self) -> int:
        return torch.Size(self.shape).numel() * torch.empty((), dtype=self.dtype).element_size()

    def _send(self, tensor: torch.Tensor, peer: int | None, tag: int) -> None:
        if peer is not None:
            tensor = tensor.detach().contiguous()
            self._pending.append((dist.isend(tensor, dst=peer, tag=tag), tensor))

    def _recv(self, r: Route, tag: int) -> torch.Tensor:
        buf = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        if r.recv_from is not None:
            dist.recv(buf, src=r.recv_from, tag=tag)
        if r.broadcast_from is not None:
            dist.broadcast(buf, src=r.broadcast_from, group=self.tp_group)
        return buf

    def send_activation(self, x: torch.Tensor) -> None:
        self._send(x, self.next.send_to, ACTIVATION_TAG)

    def recv_activation(self) -> torch.Tensor:
        return self._recv(self.prev, ACTIVATION_TAG)

    def send_grad(self, g: torch.Tensor) -> None:
        self._send(g, self.prev.send_to, GRAD_TAG)

    def recv_grad(self) -> torch.Tensor:
        return self._recv(self.next, GRAD_TAG)

    def flush(self) -> None:
        """Wait for every send posted so far."""
        for work, _ in self._pending:
            work.wait()
        self._pending.clear()
