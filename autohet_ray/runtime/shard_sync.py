"""Gradient sync for sharded optimizer state: reduce-scatter the sharded buckets, all-gather the new weights.

A sharded bucket (SyncOp.sharded) is packed like an all-reduced one, then reduce-scattered among its ranks:
rank k keeps the sum of its slice [bounds[k], bounds[k + 1]) of the bucket (shard_layout.py), which it
updates (sharded_optim.py); an all-gather in the compute dtype then brings every slice's new values to every
rank holding the bucket. Slices may differ in size: both collectives run on buffers padded to the largest
slice (gloo and NCCL want equal parts), at the cost of the padding's bytes.
Unsharded buckets in the same plan are all-reduced as in grad_sync.GradSync, in the same posting order, so
reduce-scatters overlap the backward exactly as all-reduces do. The all-gathers are posted right after the
update, every bucket at once (`post_gathers`), and each lands in the weights only when a forward first needs
one of its parameters (`settle_gathers`, from a forward pre-hook of each unit): they overlap whatever comes
before that forward (the host's work between steps, a later stage's wait for activations, earlier units'
forward).
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from autohet_ray.layout import to_local
from autohet_ray.runtime.grad_sync import GradSync, SyncOp, unit_holders
from autohet_ray.runtime.shard_layout import Piece, owned_pieces, slice_bounds, stored_copies


def sharded_units(plan, rank_map, num_layers: int, *, tied: bool, mode: str | None = None) -> frozenset:
    """Units whose optimizer state is sharded: those held by any stage with `shard_optimizer` ("dp": every
    unit, "none": none). None in a one-pipeline plan: a unit has no data-parallel co-holders there."""
    if len(plan.pipelines) < 2 or mode == "none":
        return frozenset()
    units = ["embedding", *range(num_layers), "head"]

    def flagged(unit) -> bool:
        infos = [rank_map.ranks[h[0]] for h in unit_holders(rank_map, unit)]
        return any(plan.pipelines[i.pipeline].stages[i.stage].shard_optimizer for i in infos)
    chosen = set(units) if mode == "dp" else {u for u in units if flagged(u)}
    if tied and chosen & {"embedding", "head"}:
        chosen |= {"embedding", "head"}          # one tensor: both copies sharded or neither
    return frozenset(chosen)


def plan_slice_weights(plan, rank_map) -> dict[int, float] | None:
    """Plan rank -> its stage's slice_weight (the plan's uneven slices); None when every slice is equal."""
    weights = {r: plan.pipelines[i.pipeline].stages[i.stage].slice_weight for r, i in enumerate(rank_map.ranks)}
    return None if set(weights.values()) <= {1.0} else weights


class ShardSync(GradSync):
    """GradSync with reduce-scattered buckets. `weights`: the compute parameters, which the all-gather
    writes; `shard_weights`: plan rank -> relative slice size (default equal)."""

    def __init__(self, *, weights: dict[str, torch.nn.Parameter], shard_weights: dict[int, float] | None = None,
                 **kwargs):
        super().__init__(**kwargs)
        self.weights, self.tied = weights, kwargs.get("tied")
        stored = stored_copies(kwargs["ops"])
        self.layouts: dict[int, tuple[tuple[int, ...], int, tuple[Piece, ...]]] = {}
        for i, op in enumerate(self.ops):
            if op.sharded:
                rel = tuple(shard_weights.get(r, 1.0) for r in op.ranks) if shard_weights else None
                bounds = slice_bounds(op, rel)
                k = op.ranks.index(self.me)
                self.layouts[i] = (bounds, k, owned_pieces(op, bounds[k], bounds[k + 1]))
        self._index = {id(op): i for i, op in enumerate(self.ops)}
        # sharded op index -> whether its segments' slices are the checkpoint's copy (per segment)
        self.stores = {i: tuple(stored[(s.name, s.region)] == self.ops[i].ranks for s in self.ops[i].segments)
                       for i in self.layouts}
        self.reduced: dict[int, torch.Tensor] = {}      # sharded op index -> this rank's summed slice (flat)
        self.gathers: dict[int, tuple] = {}      # sharded op index -> (work or None, padded receive buffer)
        self.overlap_gathers = True              # False: settle every all-gather as soon as it is posted
        self.gather_wait_s = 0.0                 # seconds spent waiting for all-gathers (settle_gathers)

    def sharded_names(self) -> set[str]:
        return {n for op in self.ops if op.sharded for s in op.segments for n in self._local(s)}

    @staticmethod
    def _width(bounds: tuple[int, ...]) -> int:
        return max(b - a for a, b in zip(bounds, bounds[1:]))

    def _post_next(self) -> None:
        i = self._posted
        op = self.ops[i]
        if not op.sharded:
            super()._post_next()
            return
        buf = self._pack(op)
        bounds, _, _ = self.layouts[i]
        work = None
        if len(op.ranks) > 1:
            width = self._width(bounds)
            padded = buf.new_zeros(len(op.ranks) * width)
            for j, (a, b) in enumerate(zip(bounds, bounds[1:])):
                padded[j * width: j * width + b - a] = buf[a:b]
            buf = buf.new_empty(width)
            work = dist.reduce_scatter_tensor(buf, padded, group=self.groups[op.ranks], async_op=True)
        self._inflight.append((op, buf, work))
        self._posted += 1

    def _settle(self, op: SyncOp, buf: torch.Tensor) -> None:
        if not op.sharded:
            super()._settle(op, buf)
            return
        i = self._index[id(op)]
        bounds, k, _ = self.layouts[i]
        if len(op.ranks) == 1:
            self.reduced[i] = buf
        else:
            self.reduced[i] = buf[: bounds[k + 1] - bounds[k]]

    def _post_gather(self, i: int, mine: torch.Tensor) -> tuple:
        """Start gathering every rank's slice of sharded op i (this rank's is `mine`, flat): (work, buffer)."""
        op = self.ops[i]
        bounds, k, _ = self.layouts[i]
        assert mine.numel() == bounds[k + 1] - bounds[k], (mine.numel(), bounds, k)
        if len(op.ranks) == 1:
            return None, mine
        width = self._width(bounds)
        send = mine.new_zeros(width)
        send[: mine.numel()] = mine
        recv = mine.new_empty(len(op.ranks) * width)
        return dist.all_gather_into_tensor(recv, send, group=self.groups[op.ranks], async_op=True), recv

    def _unpad(self, i: int, recv: torch.Tensor) -> torch.Tensor:
        bounds = self.layouts[i][0]
        if len(self.ops[i].ranks) == 1:
            return recv
        width = self._width(bounds)
        return torch.cat([recv[j * width: j * width + b - a] for j, (a, b) in enumerate(zip(bounds, bounds[1:]))])

    def gather_bucket(self, i: int, mine: torch.Tensor) -> torch.Tensor:
        """Every rank's slice of sharded op i (this rank's is `mine`, flat), as the whole bucket (collective)."""
        work, recv = self._post_gather(i, mine)
        if work is not None:
            work.wait()
        return self._unpad(i, recv)

    def scatter_bucket(self, i: int, full: torch.Tensor, into: dict[str, torch.Tensor]) -> None:
        """Copy a whole bucket's values into local full-chunk tensors (name -> tensor, every alias)."""
        pos = 0
        for s in self.ops[i].segments:
            for name in self._local(s):
                view = into[name][to_local(s.region, self.chunks[name])]
                view.copy_(full[pos: pos + s.region.numel].view(view.shape))
            pos += s.region.numel

    def post_gathers(self, slices: dict[int, torch.Tensor], dtype: torch.dtype) -> None:
        """Start the all-gather of each sharded op's updated slice (this rank's: `slices[i]`) in `dtype`; each
        lands in the weights at `settle_gathers`. Every bucket is posted before any is waited for, on every
        rank, so no rank waits on a gather another has not posted."""
        self.settle_gathers()
        for i in reversed(list(self.layouts)):       # in forward order: the first units' weights land first
            self.gathers[i] = self._post_gather(i, slices[i].to(dtype))
        if not self.overlap_gathers:
            self.settle_gathers()

    def settle_finished_gathers(self) -> set[str]:
        """Write the all-gathers that have finished into the weights, waiting for none (after a loss a peer may
        never send); the names whose weights are still in flight."""
        self.settle_gathers(only_finished=True)
        return {n for i in self.gathers for n in self._needs[i]}

    def settle_gathers(self, names: frozenset[str] | None = None, *, only_finished: bool = False) -> None:
        """Wait for the posted all-gathers of the ops covering any of `names` (None: all) and write them into
        the weights (`only_finished`: those that need no wait)."""
        for i in [i for i in self.gathers if names is None or self._needs[i] & names]:
            if only_finished and self.gathers[i][0] is not None and not self.gathers[i][0].is_completed():
                continue
            work, recv = self.gathers.pop(i)
            if work is not None:
                start = time.perf_counter()
                work.wait()
                self.gather_wait_s += time.perf_counter() - start
            with torch.no_grad():
                self.scatter_bucket(i, self._unpad(i, recv), self.weights)
