"""Sharded optimizer state stored as slices: each holder snapshots only its own slice of every sharded
tensor (masters and AdamW moments, a Chunk of the global tensor), with no collective.

One spawned world (fp64, the layer-wise asymmetric plan, every unit held by two pipelines) trains 5 steps
and snapshots steps 1-3 with the real snapshotter into per-node directory stores, each chunk on two nodes
(checkpoint.peers.place_copies), and the storage. Checked: the slices of all ranks tile every tensor exactly
once and equal the gathered state; a rank's snapshot writes half the bytes the unsharded run's rank writes;
and after node b (all of pipeline 1) is lost mid step 4, a plan on the survivors restores step 3 from the node
stores alone (0 storage bytes, 0 lost steps) and trains on with the uninterrupted run's losses.
"""
from __future__ import annotations

import shutil

import pytest
import torch

from _harness import FAMILY_SPECS, pipeline, reference_run
from _sharded_worker import ShardCase
from _slice_worker import node_tier, restore_from_stores, storage_tier, train_with_snapshots
from autohet_ray.checkpoint import commit_step
from autohet_ray.layout import covers_exactly, overlap, to_local
from autohet_ray.runtime import run_world

SPEC = FAMILY_SPECS["llama"]
LAYERWISE = ShardCase(name="layerwise", spec=SPEC, pipelines=(pipeline(2, (0, 1, 1), (1, 4, 1)),
                                                            pipeline(3, (0, 3, 1), (3, 4, 1))))
# the survivors' plan: two whole-model pipelines (nodes a and c), the same global batch, sharded
SURVIVORS = ShardCase(name="survivors", spec=SPEC, pipelines=(pipeline(2, (0, 4, 1)), pipeline(3, (0, 4, 1))))
RANK_NODES = {0: "a", 1: "a", 2: "b", 3: "b"}
SNAPSHOTS, LOST_IN_STEP = (1, 2, 3), 4
TOL = 1e-6


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("stores")
    ranks = run_world(train_with_snapshots, 4, LAYERWISE, str(root), RANK_NODES, SNAPSHOTS)
    return root, ranks


def test_slices_tile_every_tensor_once_and_equal_the_gathered_state(run):
    _, ranks = run
    by_name: dict[str, list] = {}
    for r in ranks:
        assert {(n if isinstance(n, str) else n[0], c) for n, (_, _, c) in r["slices"].items()} == \
            {(n, c) for n, c, _ in r["holdings"]}                     # holdings say what a snapshot stores
        for key, (tensor, shape, chunk) in r["slices"].items():
            by_name.setdefault(key if isinstance(key, str) else key[0], []).append((tensor, shape, chunk))
    gathered = {}
    for r in ranks:
        for name, (tensor, shape, chunk) in r["state"].items():
            gathered.setdefault(name, []).append((tensor, chunk))
    assert set(by_name) == set(gathered)
    for name, pieces in by_name.items():
        if name == "optim.step":             # every rank's: the step counter
            continue
        assert covers_exactly([c for _, _, c in pieces], pieces[0][1]), name
        for tensor, _, chunk in pieces:
            full, held = next((t, c) for t, c in gathered[name] if overlap(chunk, c) == chunk)
            assert torch.equal(tensor, full[to_local(chunk, held)]), (name, chunk)
    assert all(any(not isinstance(key, str) for key in r["slices"]) for r in ranks)    # every rank stores slices


def test_a_ranks_snapshot_bytes_fall_with_its_holders(run):
    """Every unit has two holders: a rank writes half the bytes of its unsharded twin (within 5%: slices end
    on whole rows, and each chunk carries a small header)."""
    _, ranks = run
    for rank, r in enumerate(ranks):
        ratio = r["sharded_bytes"] / r["unsharded_bytes"]
        assert abs(ratio - 0.5) <= 0.05 * 0.5, f"rank {rank}: {r['sharded_bytes']} / {r['unsharded_bytes']}"


def test_lost_node_recovers_from_node_stores_with_the_uninterrupted_losses(run):
    root, ranks = run
    stores = [node_tier(str(root), n) for n in "abc"]
    for step in SNAPSHOTS:
        commit_step(step, [rec for r in ranks for rec in r["records"][step]], [*stores, storage_tier(str(root))])
    shutil.rmtree(root / "b")                                 # node b (pipeline 1) lost in step 4
    after = run_world(restore_from_stores, 2, SURVIVORS, str(root), ("a", "c"), range(LOST_IN_STEP - 1, 5))
    uninterrupted = ranks[0]["losses"]
    reference = reference_run(ShardCase(name="ref", spec=SPEC, pipelines=LAYERWISE.pipelines))["losses"]
    assert all(abs(a - b) <= TOL * b for a, b in zip(uninterrupted, reference))
    for r in after:
        assert r["sharded_ops"] > 0
        assert r["step"] == LOST_IN_STEP - 1                  # the newest step: 0 lost steps
        assert r["bytes_by_tier"]["storage"] == 0, r["bytes_by_tier"]
        assert r["bytes_by_tier"]["node-c"] > 0               # b's slices came from their second node
        assert all(abs(a - b) <= TOL * b for a, b in zip(r["losses"], uninterrupted[LOST_IN_STEP - 1:])), \
            (r["losses"], uninterrupted)


def test_live_state_without_a_collective_holds_only_settled_weights(run):
    """A survivor's view after a loss: the sharded weights it returns (their all-gathers done) are the step's."""
    _, ranks = run
    assert any(r["live"] for r in ranks)
    for r in ranks:
        for name, (tensor, _, chunk) in r["live"].items():
            held, saved = r["state"][name][2], r["state"][name][0]
            assert chunk == held and torch.equal(tensor, saved), name
