"""Layer-wise gradient synchronization across pipelines, by shard overlap.

A "unit" is the embedding, one transformer layer, or the head; its holders are, per pipeline, the ranks of
the stage holding it. Every parameter of a unit is cut into atoms: the common refinement of the chunks its
holders keep. An atom is all-reduced (plain sum: each pipeline's gradient already carries its share of
1 / global batch) among the ranks holding it, one per pipeline. When all pipelines hold a unit at the same
TP degree this is the usual per-TP-rank all-reduce among co-holders (TP-replicated tensors too). When they
differ, a TP-replicated tensor is reduced among all holder ranks with only each stage's TP rank 0
contributing (the others add zeros and receive the sum).
Atoms with the same rank set form buckets (one all-reduce each) over consecutive units, a bucket closing at
the first unit boundary after it holds `bucket_elements` (plan/rankmap.SYNC_BUCKET_ELEMENTS): later units' buckets
are posted while earlier units still compute their gradients.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from autohet_ray.layout import Chunk, split_sizes, to_local
from autohet_ray.plan.rankmap import SYNC_BUCKET_ELEMENTS, RankMap

Holders = tuple[tuple[int, ...], ...]       # per pipeline, the TP group holding a unit


@dataclass(frozen=True, kw_only=True)
class Segment:
    name: str
    region: Chunk                           # global coordinates
    contributors: frozenset[int]            # ranks whose gradient enters the sum (others add zeros)


@dataclass(frozen=True, kw_only=True)
class SyncOp:
    ranks: tuple[int, ...]                  # sorted plan ranks of the all-reduce
    segments: tuple[Segment, ...]
    sharded: bool = False                   # reduce-scattered, each rank updating a slice (shard_sync.py)


def unit_of(param_name: str):
    """"embedding", "head", or the layer index of a parameter."""
    head, _, rest = param_name.partition(".")
    if head == "layers":
        return int(rest.partition(".")[0])
    assert head in ("embedding", "head"), param_name
    return head


def unit_holders(rank_map: RankMap, unit) -> Holders:
    if unit == "embedding":
        return rank_map.embedding_holders()
    if unit == "head":
        return rank_map.head_holders()
    return tuple(h.ranks for h in rank_map.layer_holders[unit])


def _boundaries(size: int, parts: int) -> list[int]:
    out, pos = [], 0
    for n in split_sizes(size, parts):
        pos += n
        out.append(pos)
    return out


def _shard_index(pos: int, size: int, parts: int) -> int:
    return next(i for i, end in enumerate(_boundaries(size, parts)) if end > pos)


def _param_segments(name: str, shape: tuple[int, ...], dim: int | None, holders: Holders):
    """(rank set, Segment) pairs covering one parameter."""
    if dim is None:
        whole = Chunk.whole(shape)
        if len({len(h) for h in holders}) == 1:
            for r in range(len(holders[0])):
                ranks = tuple(sorted(h[r] for h in holders))
                yield ranks, Segment(name=name, region=whole, contributors=frozenset(ranks))
        else:
            ranks = tuple(sorted(x for h in holders for x in h))
            yield ranks, Segment(name=name, region=whole, contributors=frozenset(h[0] for h in holders))
        return
    cuts = sorted({c for h in holders for c in _boundaries(shape[dim], len(h))})
    lo = 0
    for hi in cuts:
        ranks = tuple(sorted(h[_shard_index(lo, shape[dim], len(h))] for h in holders))
        region = Chunk(tuple(lo if d == dim else 0 for d in range(len(shape))),
                       tuple(hi - lo if d == dim else n for d, n in enumerate(shape)))
        yield ranks, Segment(name=name, region=region, contributors=frozenset(ranks))
        lo = hi


def plan_grad_sync(rank_map: RankMap, params: list[tuple[str, tuple[int, ...], int | None]],
                   bucket_elements: int = SYNC_BUCKET_ELEMENTS, *, tied: tuple[str, str] | None = None,
                   sharded_units: frozenset = frozenset()) -> tuple[SyncOp, ...]:
    """Every all-reduce of a step, identical on every rank. `params`: (name, global shape, TP shard dim) of
    the whole model, in model order (embedding, layers, head), which every rank agrees on; later layers come
    first in the result. `tied`: (embedding, head) parameter names holding one shared tensor: its segments,
    named after the embedding, sum the gradients of both over every first and last stage. `sharded_units`:
    units whose optimizer state is sharded; their segments go into buckets of their own (SyncOp.sharded)."""
    buckets: dict[tuple[tuple[int, ...], bool, int], list[Segment]] = {}
    open_bucket: dict[tuple[tuple[int, ...], bool], tuple[int, int, object]] = {}   # -> (index, elements, unit)
    for name, shape, dim in params:
        unit = unit_of(name)
        holders = unit_holders(rank_map, unit)
        if tied is not None and name == tied[1]:
            continue                              # synced with the embedding
        if tied is not None and name == tied[0]:
            holders = holders + unit_holders(rank_map, "head")
        for ranks, segment in _param_segments(name, shape, dim, holders):
            ranks = tuple(sorted(set(ranks)))         # a single-stage pipeline holds both tied tensors
            if len(ranks) <= 1 and not (tied is not None and name == tied[0]):
                continue
            key = (ranks, unit in sharded_units)
            index, filled, last_unit = open_bucket.get(key, (0, 0, unit))
            if filled >= bucket_elements and unit != last_unit:
                index, filled = index + 1, 0
            open_bucket[key] = (index, filled + segment.region.numel, unit)
            buckets.setdefault((*key, index), []).append(segment)
    return tuple(reversed([SyncOp(ranks=key[0], segments=tuple(s), sharded=key[1]) for key, s in buckets.items()]))


class GradSync:
    """Runs this rank's share of a sync plan on the gradients of its parameters.

    `params` are the tensors the optimizer updates, whose `.grad` is reduced in its own dtype: under bf16
    compute the fp32 master weights (so gradients are all-reduced in fp32; Engine says why).
    Overlap with backward: `arm()` before the step's last backward on this stage; then `on_grad(name)` (a
    post-accumulate-grad hook) marks parameters final, and each bucket is posted once all its parameters
    are final and every bucket before it in the plan's order has been posted (the same order on every rank,
    which NCCL needs). `start()` posts whatever is left, `finish()` waits and writes the sums back.
    """

    def __init__(self, *, ops: tuple[SyncOp, ...], me: int, params: dict[str, torch.nn.Parameter],
                 chunks: dict[str, Chunk], groups: dict[tuple[int, ...], object],
                 tied: tuple[str, str] | None = None):
        self.ops = [op for op in ops if me in op.ranks]
        self.me, self.params, self.chunks, self.groups = me, params, chunks, groups
        # a tied segment (named after the embedding) stands for whichever of the two tensors this rank holds
        self._aliases = {tied[0]: tuple(n for n in tied if n in params)} if tied else {}
        self._needs = [frozenset(n for s in op.segments for n in self._local(s)) for op in self.ops]
        self._armed = False
        self._final: set[str] = set()
        self._posted = 0                      # ops[:_posted] are in flight
        self._inflight: list[tuple[SyncOp, torch.Tensor, dist.Work]] = []

    @property
    def num_bytes(self) -> int:
        """Bytes this rank all-reduces per step."""
        return sum(s.region.numel * self.params[self._local(s)[0]].element_size()
                   for op in self.ops if len(op.ranks) > 1 for s in op.segments)

    def _local(self, seg: Segment) -> tuple[str, ...]:
        """The parameters of this rank a segment covers (two for a tied one on a single-stage pipeline)."""
        return self._aliases.get(seg.name, (seg.name,))

    def _views(self, seg: Segment) -> list[torch.Tensor]:
        return [self.params[n].grad[to_local(seg.region, self.chunks[n])] for n in self._local(seg)]

    def _pack(self, op: SyncOp) -> torch.Tensor:
        parts = []
        for s in op.segments:
            views = self._views(s)
            if self.me not in s.contributors:
                parts.append(views[0].new_zeros(s.region.numel))
                continue
            total = views[0].reshape(-1)
            for v in views[1:]:
                total = total + v.reshape(-1)
            parts.append(total)
        return torch.cat(parts)

    def _post_next(self) -> None:
        op = self.ops[self._posted]
        buf = self._pack(op)
        # a one-rank op: a tied tensor whose only holder also holds its twin (the local sum is the result)
        work = dist.all_reduce(buf, group=self.groups[op.ranks], async_op=True) if len(op.ranks) > 1 else None
        self._inflight.append((op, buf, work))
        self._posted += 1

    def arm(self) -> None:
        """The next backward is this step's last on this stage: post buckets as their gradients become final."""
        self._armed = True

    def on_grad(self, name: str) -> None:
        if not self._armed:
            return
        self._final.add(name)
        while self._posted < len(self.ops) and self._needs[self._posted] <= self._final:
            self._post_next()

    def start(self) -> None:
        """Post every bucket not yet posted."""
        while self._posted < len(self.ops):
            self._post_next()

    def finish(self) -> None:
        for op, buf, work in self._inflight:
            if work is not None:
                work.wait()
            self._settle(op, buf)
        self._inflight.clear()
        self._armed, self._final, self._posted = False, set(), 0

    def _settle(self, op: SyncOp, buf: torch.Tensor) -> None:
        """Write a finished all-reduce's sums back into the gradients."""
        pos = 0
        for s in op.segments:
            for view in self._views(s):
                view.copy_(buf[pos: pos + s.region.numel].view(view.shape))
            pos += s.region.numel
