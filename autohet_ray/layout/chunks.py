"""Rectangular chunks of a global tensor, their overlaps and coverage."""
from __future__ import annotations

from dataclasses import dataclass
from math import prod


@dataclass(frozen=True)
class Chunk:
    offsets: tuple[int, ...]     # global start index per dimension
    sizes: tuple[int, ...]       # extent per dimension

    def __post_init__(self):
        assert len(self.offsets) == len(self.sizes), (self.offsets, self.sizes)
        assert all(o >= 0 for o in self.offsets) and all(s >= 0 for s in self.sizes), self

    @property
    def numel(self) -> int:
        return prod(self.sizes)

    @property
    def ends(self) -> tuple[int, ...]:
        return tuple(o + s for o, s in zip(self.offsets, self.sizes))

    def slices(self) -> tuple[slice, ...]:
        """Index of this chunk inside the global tensor."""
        return tuple(slice(o, o + s) for o, s in zip(self.offsets, self.sizes))

    def to_dict(self) -> dict:
        return {"offsets": list(self.offsets), "sizes": list(self.sizes)}

    @staticmethod
    def from_dict(raw: dict) -> "Chunk":
        return Chunk(tuple(raw["offsets"]), tuple(raw["sizes"]))

    @staticmethod
    def whole(shape: tuple[int, ...]) -> "Chunk":
        return Chunk(tuple(0 for _ in shape), tuple(shape))


def split_sizes(n: int, parts: int) -> list[int]:
    """Near-even split of n into `parts` sizes (the first n % parts get one more)."""
    assert parts >= 1
    base, extra = divmod(n, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def even_split(n: int, parts: int) -> list[tuple[int, int]]:
    """(offset, size) of each part of a near-even split."""
    out, start = [], 0
    for size in split_sizes(n, parts):
        out.append((start, size))
        start += size
    return out


def shard_chunk(shape: tuple[int, ...], dim: int | None, parts: int, index: int) -> Chunk:
    """Chunk `index` of `parts` when `shape` is split along `dim` (None: replicated, the whole tensor)."""
    if dim is None or parts == 1:
        return Chunk.whole(tuple(shape))
    offset, size = even_split(shape[dim], parts)[index]
    offsets = tuple(offset if d == dim else 0 for d in range(len(shape)))
    sizes = tuple(size if d == dim else n for d, n in enumerate(shape))
    return Chunk(offsets, sizes)


def overlap(a: Chunk, b: Chunk) -> Chunk | None:
    """The intersection of two chunks in global coordinates, or None if they do not meet."""
    assert len(a.offsets) == len(b.offsets)
    offsets, sizes = [], []
    for ao, ae, bo, be in zip(a.offsets, a.ends, b.offsets, b.ends):
        lo, hi = max(ao, bo), min(ae, be)
        if hi <= lo:
            return None
        offsets.append(lo)
        sizes.append(hi - lo)
    return Chunk(tuple(offsets), tuple(sizes))


def to_local(region: Chunk, holder: Chunk) -> tuple[slice, ...]:
    """Index of the global `region` inside the local tensor of the chunk `holder` (region within holder)."""
    assert all(r >= h and re <= he for r, re, h, he in zip(region.offsets, region.ends, holder.offsets, holder.ends))
    return tuple(slice(r - h, r - h + s) for r, h, s in zip(region.offsets, holder.offsets, region.sizes))


def covers_exactly(chunks: list[Chunk], shape: tuple[int, ...]) -> bool:
    """True when the chunks tile `shape`: inside it, pairwise disjoint, and their volumes add up."""
    whole = Chunk.whole(tuple(shape))
    for c in chunks:
        if len(c.offsets) != len(shape) or overlap(c, whole) != c and c.numel:
            return False
    nonempty = [c for c in chunks if c.numel]
    for i, a in enumerate(nonempty):
        for b in nonempty[i + 1:]:
            if overlap(a, b) is not None:
                return False
    return sum(c.numel for c in nonempty) == whole.numel
