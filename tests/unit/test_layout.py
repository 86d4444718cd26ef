"""Property tests of the layout algebra (autohet_ray/layout/chunks.py).

Random global shapes, random old and new layouts (grids with uneven splits along different dimensions,
and non-grid guillotine partitions), bit-exact reconstruction of every new chunk from the overlaps of the
old chunks, and exact-coverage checks that catch gaps, overlaps and chunks outside the tensor.
"""
from itertools import product

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from autohet_ray.layout import Chunk, covers_exactly, even_split, overlap, shard_chunk, split_sizes, to_local

SETTINGS = settings(max_examples=60, deadline=None)

shapes = st.lists(st.integers(1, 7), min_size=1, max_size=3).map(tuple)


@st.composite
def cuts(draw, n: int) -> list[tuple[int, int]]:
    """An uneven split of range(n) into contiguous (offset, size) parts, empty parts allowed."""
    points = sorted(draw(st.lists(st.integers(0, n), max_size=4)))
    bounds = [0, *points, n]
    return [(lo, hi - lo) for lo, hi in zip(bounds, bounds[1:])]


@st.composite
def grid_layouts(draw, shape: tuple[int, ...]) -> list[Chunk]:
    """A grid: every dimension cut independently (the general TP x TP case)."""
    per_dim = [draw(cuts(n)) for n in shape]
    return [Chunk(tuple(o for o, _ in parts), tuple(s for _, s in parts)) for parts in product(*per_dim)]


@st.composite
def guillotine_layouts(draw, shape: tuple[int, ...]) -> list[Chunk]:
    """A non-grid partition: recursively split a box along a random dimension at a random point."""
    boxes, done = [Chunk.whole(shape)], []
    while boxes:
        box = boxes.pop()
        splittable = [d for d, s in enumerate(box.sizes) if s >= 2]
        if not splittable or len(done) + len(boxes) >= 6 or not draw(st.booleans()):
            done.append(box)
            continue
        dim = draw(st.sampled_from(splittable))
        cut = draw(st.integers(1, box.sizes[dim] - 1))
        for off, size in ((0, cut), (cut, box.sizes[dim] - cut)):
            offsets = tuple(o + off if d == dim else o for d, o in enumerate(box.offsets))
            sizes = tuple(size if d == dim else s for d, s in enumerate(box.sizes))
            boxes.append(Chunk(offsets, sizes))
    return done


@st.composite
def layouts(draw, shape):
    return draw(st.one_of(grid_layouts(shape), guillotine_layouts(shape)))


@st.composite
def shape_and_two_layouts(draw):
    shape = draw(shapes)
    return shape, draw(layouts(shape)), draw(layouts(shape))


def random_bits(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Random float32 bit patterns (NaNs and infinities included): equality must be bitwise."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(-2**31, 2**31 - 1, shape, generator=gen, dtype=torch.int32).view(torch.float32)


def reshard(old: dict[Chunk, torch.Tensor], new: Chunk) -> tuple[torch.Tensor, torch.Tensor]:
    """Assemble `new` from the overlaps of the old chunks; also count how often each element was written."""
    out = torch.zeros(new.sizes, dtype=torch.float32)
    writes = torch.zeros(new.sizes, dtype=torch.int64)
    for held, tensor in old.items():
        region = overlap(held, new)
        if region is None:
            continue
        out[to_local(region, new)] = tensor[to_local(region, held)]
        writes[to_local(region, new)] += 1
    return out, writes


@SETTINGS
@given(shape_and_two_layouts(), st.integers(0, 2**31))
def test_every_new_chunk_is_rebuilt_bit_exactly_from_old_overlaps(case, seed):
    shape, old_layout, new_layout = case
    full = random_bits(shape, seed)
    old = {c: full[c.slices()].clone() for c in old_layout}
    for new in new_layout:
        got, writes = reshard(old, new)
        assert torch.equal(got.view(torch.int32), full[new.slices()].view(torch.int32))
        assert bool((writes == 1).all()), f"elements of {new} written {writes.unique().tolist()} times"


@SETTINGS
@given(shapes, st.data())
def test_tp_split_along_one_dim_to_another_dim_is_exact(shape, data):
    old_dim = data.draw(st.integers(0, len(shape) - 1))
    new_dim = data.draw(st.integers(0, len(shape) - 1))
    old_parts, new_parts = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 4))
    full = random_bits(shape, data.draw(st.integers(0, 2**31)))
    old = {c: full[c.slices()].clone() for c in (shard_chunk(shape, old_dim, old_parts, i) for i in range(old_parts))}
    assert covers_exactly(list(old), shape)
    for index in range(new_parts):
        new = shard_chunk(shape, new_dim, new_parts, index)
        got, writes = reshard(old, new)
        assert torch.equal(got.view(torch.int32), full[new.slices()].view(torch.int32))
        assert bool((writes == 1).all())


@SETTINGS
@given(shapes.flatmap(lambda s: st.tuples(st.just(s), layouts(s))))
def test_partitions_cover_exactly(case):
    shape, layout = case
    assert covers_exactly(layout, shape)
    assert covers_exactly(list(reversed(layout)), shape)


@SETTINGS
@given(shapes.flatmap(lambda s: st.tuples(st.just(s), layouts(s))), st.data())
def test_gaps_are_detected(case, data):
    shape, layout = case
    nonempty = [c for c in layout if c.numel]
    victim = data.draw(st.sampled_from(nonempty))
    assert not covers_exactly([c for c in layout if c != victim], shape)


@SETTINGS
@given(shapes.flatmap(lambda s: st.tuples(st.just(s), layouts(s))), st.data())
def test_duplicates_and_overlaps_are_detected(case, data):
    shape, layout = case
    nonempty = [c for c in layout if c.numel]
    twice = data.draw(st.sampled_from(nonempty))
    assert not covers_exactly([*layout, twice], shape)
    # Grow one chunk by one along a dimension: it now overlaps a neighbour or leaves the tensor.
    dim = data.draw(st.integers(0, len(shape) - 1))
    grown = Chunk(twice.offsets, tuple(s + 1 if d == dim else s for d, s in enumerate(twice.sizes)))
    assert not covers_exactly([grown if c == twice else c for c in layout], shape)


@SETTINGS
@given(shapes.flatmap(lambda s: st.tuples(st.just(s), layouts(s))), st.data())
def test_chunks_outside_the_tensor_are_detected(case, data):
    shape, layout = case
    nonempty = [c for c in layout if c.numel]
    victim = data.draw(st.sampled_from(nonempty))
    dim = data.draw(st.integers(0, len(shape) - 1))
    shifted = Chunk(tuple(o + shape[dim] if d == dim else o for d, o in enumerate(victim.offsets)), victim.sizes)
    assert not covers_exactly([shifted if c == victim else c for c in layout], shape)
    assert not covers_exactly(layout, tuple(n + 1 for n in shape))
    assert not covers_exactly(layout, (*shape, 1))


def indices(chunk: Chunk) -> set[tuple[int, ...]]:
    return set(product(*(range(o, o + s) for o, s in zip(chunk.offsets, chunk.sizes))))


@SETTINGS
@given(shapes.flatmap(lambda s: st.tuples(layouts(s), layouts(s))), st.data())
def test_overlap_is_the_set_intersection(layout_pair, data):
    a = data.draw(st.sampled_from(layout_pair[0]))
    b = data.draw(st.sampled_from(layout_pair[1]))
    region = overlap(a, b)
    expected = indices(a) & indices(b)
    assert (set() if region is None else indices(region)) == expected
    assert overlap(b, a) == region


@SETTINGS
@given(st.integers(0, 50), st.integers(1, 9))
def test_even_split_is_contiguous_and_near_even(n, parts):
    sizes = split_sizes(n, parts)
    assert sum(sizes) == n and len(sizes) == parts and max(sizes) - min(sizes) <= 1
    spans = even_split(n, parts)
    assert [s for _, s in spans] == sizes
    assert all(o1 + s1 == o2 for (o1, s1), (o2, _) in zip(spans, spans[1:]))


def test_scalar_tensor_is_one_whole_chunk():
    whole = Chunk.whole(())
    assert whole.numel == 1 and covers_exactly([whole], ())
    assert not covers_exactly([whole, whole], ()) and not covers_exactly([], ())
    assert overlap(whole, whole) == whole and to_local(whole, whole) == ()
