"""Activations forward and their gradients backward between adjacent stages of one pipeline.

Both are replicated across the TP ranks of a stage. When the two stages have the same TP degree t > 1, TP rank
r sends only slice r of t (of the flattened tensor) to TP rank r, and the receivers all-gather the slices inside
their stage (Megatron's scatter-gather): each rank puts 1/t of the message on the wire instead of all of it.
Otherwise only the stage leaders (TP rank 0) talk and the receiving leader broadcasts inside its stage
(TP4 -> TP1 -> TP2 works either way). cost/terms.py `boundary_seconds` prices exactly this.
Sends are non-blocking (kept until `flush`); receives block.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

ACTIVATION_TAG = 0
GRAD_TAG = 1
# torch >= 2.13 renamed all_gather_into_tensor (same semantics; the old name warns)
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


@dataclass(frozen=True, kw_only=True)
class Route:
    """Who this rank sends to / receives from across one stage boundary (global ranks)."""
    send_to: int | None
    recv_from: int | None
    broadcast_from: int | None   # the leader to broadcast from inside this stage after a receive, if any
    parts: int = 1               # > 1: the message travels as `parts` slices, this rank's is slice `index`,
    index: int = 0               # and the receiving stage all-gathers them


def route(mine: tuple[int, ...], other: tuple[int, ...] | None, me: int) -> Route:
    """Route between this rank's stage `mine` and a neighbour stage `other` (both in global ranks)."""
    if other is None:
        return Route(send_to=None, recv_from=None, broadcast_from=None)
    r = mine.index(me)
    if len(mine) == len(other):
        return Route(send_to=other[r], recv_from=other[r], broadcast_from=None, parts=len(mine), index=r)
    leader = other[0] if r == 0 else None
    return Route(send_to=leader, recv_from=leader, broadcast_from=mine[0] if len(mine) > 1 else None)


class Bridge:
    def __init__(self, *, prev: Route, next: Route, tp_group, shape: tuple[int, ...], dtype: torch.dtype,
                 device: torch.device):
        self.prev, self.next = prev, next
        self.tp_group = tp_group
        self.shape, self.dtype, self.device = shape, dtype, device
        self._pending: list[tuple[dist.Work, torch.Tensor]] = []
        numel = torch.Size(shape).numel()
        for r in (prev, next):
            assert numel % r.parts == 0, f"message of {numel} elements does not split into {r.parts} slices"
            # slice i must land at position i of the all-gather: group rank order = stage order
            assert r.parts == 1 or dist.get_rank(tp_group) == r.index, (r, dist.get_rank(tp_group))

    @property
    def message_bytes(self) -> int:
        return torch.Size(self.shape).numel() * torch.empty((), dtype=self.dtype).element_size()

    def _send(self, tensor: torch.Tensor, r: Route, tag: int) -> None:
        if r.send_to is None:
            return
        tensor = tensor.detach().contiguous()
        if r.parts > 1:
            tensor = tensor.reshape(-1).chunk(r.parts)[r.index]
        self._pending.append((dist.isend(tensor, dst=r.send_to, tag=tag), tensor))

    def _recv(self, r: Route, tag: int) -> torch.Tensor:
        buf = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        if r.parts > 1:
            piece = torch.empty(buf.numel() // r.parts, dtype=self.dtype, device=self.device)
            dist.recv(piece, src=r.recv_from, tag=tag)
            _all_gather(buf.view(-1), piece, group=self.tp_group)
            return buf
        if r.recv_from is not None:
            dist.recv(buf, src=r.recv_from, tag=tag)
        if r.broadcast_from is not None:
            dist.broadcast(buf, src=r.broadcast_from, group=self.tp_group)
        return buf

    def send_activation(self, x: torch.Tensor) -> None:
        self._send(x, self.next, ACTIVATION_TAG)

    def recv_activation(self) -> torch.Tensor:
        return self._recv(self.prev, ACTIVATION_TAG)

    def send_grad(self, g: torch.Tensor) -> None:
        self._send(g, self.prev, GRAD_TAG)

    def recv_grad(self) -> torch.Tensor:
        return self._recv(self.next, GRAD_TAG)

    def flush(self) -> None:
        """Wait for every send posted so far."""
        for work, _ in self._pending:
            work.wait()
        self._pending.clear()
