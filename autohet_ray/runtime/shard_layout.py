"""Which slice of a sharded gradient bucket each of its ranks owns.

A bucket (grad_sync.SyncOp) is its segments' regions flattened one after the other. Its ranks split it into
contiguous ranges, rank k (its position in `op.ranks`) owning [bounds[k], bounds[k + 1]). Cuts fall on row
boundaries of the segments (a whole index of a region's first dimension), so each owned part of a segment is
itself a box of the global tensor (a Chunk), which keeps optimizer state in the checkpoint's chunk format.
Slices are sized by the ranks' weights (equal by default; a plan may size them by memory headroom), to the
nearest row.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

from autohet_ray.layout import Chunk
from autohet_ray.runtime.grad_sync import SyncOp


@dataclass(frozen=True)
class Piece:
    segment: int            # index into op.segments
    start: int              # element offset inside the bucket
    region: Chunk           # global coordinates: whole rows of the segment's region

    @property
    def numel(self) -> int:
        return self.region.numel


def _row_starts(op: SyncOp) -> list[int]:
    """Every bucket offset at which a row of some segment starts, and the bucket's end."""
    starts, base = [], 0
    for seg in op.segments:
        sizes = seg.region.sizes
        rows = sizes[0] if sizes else 1
        row = seg.region.numel // rows if rows else 0
        starts.extend(base + i * row for i in range(rows))
        base += seg.region.numel
    starts.append(base)
    return starts


def slice_bounds(op: SyncOp, weights: tuple[float, ...] | None = None) -> tuple[int, ...]:
    """len(op.ranks) + 1 bucket offsets; rank k owns [bounds[k], bounds[k + 1])."""
    parts = len(op.ranks)
    weights = weights or (1.0,) * parts
    assert len(weights) == parts and all(w >= 0 for w in weights) and sum(weights) > 0, weights
    starts = _row_starts(op)
    total = starts[-1]
    bounds, acc = [0], 0.0
    for w in weights[:-1]:
        acc += w
        target = total * acc / sum(weights)
        i = bisect.bisect_left(starts, target)
        near = min((j for j in (i - 1, i) if 0 <= j < len(starts)), key=lambda j: abs(starts[j] - target))
        bounds.append(max(starts[near], bounds[-1]))
    bounds.append(total)
    return tuple(bounds)


def owned_pieces(op: SyncOp, lo: int, hi: int) -> tuple[Piece, ...]:
    """The parts of the bucket range [lo, hi) per segment, each whole rows of that segment's region."""
    out, base = [], 0
    for index, seg in enumerate(op.segments):
        n = seg.region.numel
        a, b = max(lo, base), min(hi, base + n)
        if b > a:
            sizes = seg.region.sizes
            row = n // sizes[0] if sizes else 1
            assert (a - base) % row == 0 and (b - base) % row == 0, (seg, a, b)
            if sizes:
                offsets = (seg.region.offsets[0] + (a - base) // row, *seg.region.offsets[1:])
                region = Chunk(offsets, ((b - a) // row, *sizes[1:]))
            else:
                region = seg.region
            out.append(Piece(segment=index, start=a, region=region))
        base += n
    return tuple(out)


def stored_copies(ops) -> dict[tuple[str, Chunk], tuple[int, ...]]:
    """(segment name, region) -> the ranks of the sharded op whose slices of it a checkpoint stores. A
    TP-replicated tensor held at one TP degree by every pipeline is reduced in one op per TP position, each
    slicing the same whole tensor its own way; the op with the lowest ranks is its stored copy, so every
    rank's stored slices together tile each tensor exactly once. `ops`: the plan's ops (every rank's)."""
    out: dict[tuple[str, Chunk], tuple[int, ...]] = {}
    for op in ops:
        if op.sharded:
            for seg in op.segments:
                key = (seg.name, seg.region)
                if key not in out or op.ranks < out[key]:
                    out[key] = op.ranks
    return out
