"""Survivors rewrite lost slices of sharded optimizer state from live state.

One spawned world (fp64, the layer-wise asymmetric plan, every unit sharded between its two pipelines: node a
runs pipeline 0, node b pipeline 1) trains 2 steps and snapshots with the real snapshotter into per-node
directory stores (each chunk on two nodes, checkpoint.peers.place_copies) and the storage. Then the stores of
nodes b and c are lost while every rank lives (b's store restarts empty): the slices rank 2 and 3 own whose two
copies were on b and c are in no store. Before the rescue a restore of the step reads them from the storage;
after each survivor rewrote what it holds live (Worker.write_live_chunks: its own slices of masters and AdamW
moments, found by name and region), the same restore reads 0 storage bytes.
"""
from __future__ import annotations

import pytest

from _harness import FAMILY_SPECS, pipeline
from _rescue_worker import rescue_lost_slices
from _sharded_worker import ShardCase
from autohet_ray.runtime import run_world

CASE = ShardCase(name="layerwise", spec=FAMILY_SPECS["llama"], steps=2,
                 pipelines=(pipeline(2, (0, 1, 1), (1, 4, 1)), pipeline(3, (0, 3, 1), (3, 4, 1))))
RANK_NODES = {0: "a", 1: "a", 2: "b", 3: "b"}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    root = tmp_path_factory.mktemp("stores")
    return run_world(rescue_lost_slices, 4, CASE, str(root), RANK_NODES, ("b", "c"))


def test_both_copies_of_slices_lost_are_rewritten_by_their_live_owners(ranks):
    orphans = set(ranks[0]["orphans"])
    assert orphans and all(set(r["orphans"]) == orphans for r in ranks)
    names = ranks[0]["orphan_names"]
    assert any(n.endswith(".exp_avg") for n in names) and any(n.endswith(".exp_avg_sq") for n in names), names
    written = [key for r in ranks for key in r["written"]]
    assert set(written) == orphans                        # every lost chunk, each by one survivor
    # the moments exist only on their owner (on node b); node a's ranks may rewrite b's master slices, which they
    # hold whole as their fp64 weights
    on_a = {k for r in ranks[:2] for k in r["written"]}
    assert not {k for k in on_a if "/optim." in k and "/optim.step/" not in k}
    moments = {k for k in orphans if ".exp_avg" in k}
    assert moments and moments <= set(ranks[2]["written"] + ranks[3]["written"])


def test_restore_reads_the_storage_before_the_rescue_and_nothing_after(ranks):
    assert sum(r["storage_bytes_before"] for r in ranks) > 0
    assert [r["storage_bytes_after"] for r in ranks] == [0, 0, 0, 0]
