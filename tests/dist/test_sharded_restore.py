"""Cross-plan restore through the checkpoint format: a checkpoint written by a sharded plan restores onto an
unsharded plan of another shape, and one written unsharded restores onto a sharded plan (uneven slices);
training continues with the one-process reference's losses (fp64).

Each run's ranks return what their snapshots store (a sharded rank: only its own slices of the sharded
tensors, Engine.snapshot_state); the test writes them with the real snapshotter (one writer per unique chunk,
assign_writers) into a local-directory tier and commits the step; the second world restores its
own chunks from that tier (checkpoint.restore reshards) and trains on.
"""
from __future__ import annotations

import pytest

from _harness import FAMILY_SPECS, pipeline, reference_run
from _sharded_worker import ShardCase, restore_then_train, train_then_state
from _slice_worker import write_checkpoint
from autohet_ray.checkpoint import LocalDirTier
from autohet_ray.runtime import run_world

SPEC = FAMILY_SPECS["llama"]
STEPS, SAVED_AT = 5, 2
# both plans run global batch 10, so both see the reference's batches
# the sharded plan's slices are uneven (rank 1 owns 3 parts of each bucket it shares with rank 3's 1)
SHARDED = ShardCase(name="layerwise", spec=SPEC, pipelines=(pipeline(2, (0, 1, 1), (1, 4, 1)),
                                                              pipeline(3, (0, 3, 1), (3, 4, 1))),
                    shard_weights={0: 1.0, 1: 3.0, 2: 2.0, 3: 1.0})
OTHER = ShardCase(name="tp2_and_3stage", spec=SPEC, pipelines=(pipeline(2, (0, 2, 2), (2, 4, 1)),
                                                              pipeline(3, (0, 1, 1), (1, 3, 1), (3, 4, 1))))
TOL = 1e-6


def _world_size(case: ShardCase) -> int:
    return sum(s.tp for p in case.pipelines for s in p.stages)


@pytest.mark.parametrize("first,second", [(("sharded", SHARDED, None), ("unsharded", OTHER, "none")),
                                          (("unsharded", OTHER, "none"), ("sharded", SHARDED, None))],
                         ids=["sharded-uneven-to-unsharded", "unsharded-to-sharded-uneven"])
def test_restore_across_plans_and_sharding(first, second, tmp_path):
    _, case_a, mode_a = first
    _, case_b, mode_b = second
    reference = reference_run(ShardCase(name="ref", spec=SPEC, pipelines=SHARDED.pipelines, steps=STEPS))["losses"]
    before = run_world(train_then_state, _world_size(case_a), case_a, SAVED_AT, mode_a)
    assert bool(before[0]["sharded_ops"]) == (mode_a is None)
    sliced = any(not isinstance(key, str) for r in before for key in r["state"])
    assert sliced == (mode_a is None)                    # a sharded plan stores slices, not gathered chunks
    write_checkpoint(before, LocalDirTier(tmp_path), SAVED_AT)
    after = run_world(restore_then_train, _world_size(case_b), case_b, str(tmp_path), range(SAVED_AT, STEPS), mode_b)
    assert bool(after[0]["sharded_ops"]) == (mode_b is None)
    for r in before:
        assert all(abs(a - b) <= TOL * b for a, b in zip(r["losses"], reference[:SAVED_AT]))
    for r in after:
        assert r["step"] == STEPS
        assert all(abs(a - b) <= TOL * b for a, b in zip(r["losses"], reference[SAVED_AT:])), (r["losses"], reference)
