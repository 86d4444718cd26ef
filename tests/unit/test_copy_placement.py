"""place_copies: every chunk lands on `copies` distinct nodes (another GPU type first), data-parallel copies
are written where they already are, pushes only make up what holders cannot, and each chunk is uploaded once.
Checked against a brute-force rule check on random holdings."""
from __future__ import annotations

import random

import pytest

from autohet_ray import ConfigError
from autohet_ray.checkpoint import place_copies
from autohet_ray.layout import Chunk

NODE_GPU = {"a": "H800", "b": "H800", "c": "H20", "d": "A100"}


def _chunk(i: int) -> Chunk:
    return Chunk(offsets=(i,), sizes=(1,))


def _nodes_of(plan, rank_nodes, item) -> list[str]:
    out = [rank_nodes[r] for r, items in plan.local.items() if item in items]
    out += [node for pushes in plan.push.values() for node, items in pushes.items() if item in items]
    return out


def test_bench_layout_writes_data_parallel_copies_locally_and_pushes_nothing():
    # pipeline 0: a holds layers 0-1, b layers 2-3 (H800); pipeline 1: c holds all (H20), same chunks
    rank_nodes = {0: "a", 1: "b", 2: "c"}
    items = [(f"w{i}", _chunk(0), 100) for i in range(4)]
    holdings = {0: items[:2], 1: items[2:], 2: items}
    plan = place_copies(holdings, rank_nodes, {n: NODE_GPU[n] for n in "abc"}, copies=2)
    assert all(not pushes for pushes in plan.push.values())
    for name, chunk, _ in items:
        nodes = _nodes_of(plan, rank_nodes, (name, chunk))
        assert sorted(nodes) in (["a", "c"], ["b", "c"])         # an H800 copy and the H20 copy
    assert sorted(i for items_ in plan.upload.values() for i in items_) == sorted((n, c) for n, c, _ in items)


def test_single_holder_is_pushed_to_another_gpu_type():
    plan = place_copies({0: [("w", _chunk(0), 10)]}, {0: "a"}, NODE_GPU, copies=2)
    assert plan.local[0] == {("w", _chunk(0))}
    assert list(plan.push[0]) in (["c"], ["d"]) and plan.upload[0] == {("w", _chunk(0))}


@pytest.mark.parametrize("seed", range(20))
def test_random_holdings_obey_the_rules(seed):
    rng = random.Random(seed)
    rank_nodes = {r: rng.choice("abcd") for r in range(rng.randint(1, 8))}
    holdings = {r: [] for r in rank_nodes}
    for i in range(rng.randint(1, 12)):
        for r in rng.sample(sorted(rank_nodes), rng.randint(1, len(rank_nodes))):
            holdings[r].append((f"t{i}", _chunk(0), rng.randint(1, 50)))
    copies = rng.randint(1, 3)
    plan = place_copies(holdings, rank_nodes, NODE_GPU, copies=copies)
    for item in {(n, c) for items in holdings.values() for n, c, _ in items}:
        holders = {rank_nodes[r] for r, items in holdings.items() if any((n, c) == item for n, c, _ in items)}
        writers = [r for r, items in plan.local.items() if item in items]
        nodes = _nodes_of(plan, rank_nodes, item)
        assert len(nodes) == copies == len(set(nodes))                              # distinct nodes
        assert all(any((n, c) == item for n, c, _ in holdings[r]) for r in writers)  # only holders write
        assert sum(item in u for u in plan.upload.values()) == 1                    # uploaded once
        types = {NODE_GPU[n] for n in nodes}
        assert len(types) == min(copies, len(set(NODE_GPU.values())))               # GPU types spread first
        pushed = [n for n in nodes if n not in holders]
        same_type_holders = [n for n in holders - set(nodes) if NODE_GPU[n] not in {NODE_GPU[p] for p in pushed}]
        assert not (pushed and same_type_holders), "pushed although a holder of a fitting type was free"


def test_bad_copy_count_is_named():
    with pytest.raises(ConfigError, match="copies=5"):
        place_copies({0: [("w", _chunk(0), 1)]}, {0: "a"}, NODE_GPU, copies=5)
