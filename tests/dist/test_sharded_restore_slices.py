"""A sharded rank's restore reads only the boxes of the moments that overlap its own slices (Engine.restore_needs)
instead of its full chunks, and training continues with the one-process reference's losses (fp64).

A sharded run (uneven slices from the plan) stores its slices (train_then_state, write_checkpoint); a second
world restores them onto the same plan and onto another sharded plan (other stage boundaries, equal slices).
Onto the same plan each needed slice is one saved box: the bytes read fall with the elements needed (within 5%:
each chunk carries a small header). Onto the other plan the saved boxes that overlap a slice are read whole.
"""
from __future__ import annotations

import pytest

from _harness import FAMILY_SPECS, pipeline, reference_run
from _sharded_worker import ShardCase, restore_slices_then_train, train_then_state
from _slice_worker import write_checkpoint
from autohet_ray.checkpoint import LocalDirTier
from autohet_ray.runtime import run_world

SPEC = FAMILY_SPECS["llama"]
STEPS, SAVED_AT = 4, 2
SAVED = ShardCase(name="layerwise-uneven", spec=SPEC, steps=STEPS, slice_weights=((1.0, 3.0), (2.0, 1.0)),
                  pipelines=(pipeline(2, (0, 1, 1), (1, 4, 1)), pipeline(3, (0, 3, 1), (3, 4, 1))))
OTHER = ShardCase(name="whole-model-pipelines", spec=SPEC, steps=STEPS,
                  pipelines=(pipeline(2, (0, 4, 1)), pipeline(3, (0, 2, 1), (2, 4, 1))))
TOL = 1e-6


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoint")
    before = run_world(train_then_state, 4, SAVED, SAVED_AT, None)
    write_checkpoint(before, LocalDirTier(root), SAVED_AT)
    return str(root)


@pytest.mark.parametrize("case", [SAVED, OTHER], ids=lambda c: c.name)
def test_restore_reads_only_the_moments_a_rank_owns(case, saved):
    reference = reference_run(ShardCase(name="ref", spec=SPEC, pipelines=SAVED.pipelines, steps=STEPS))["losses"]
    world = sum(s.tp for p in case.pipelines for s in p.stages)
    for rank, r in enumerate(run_world(restore_slices_then_train, world, case, saved, range(SAVED_AT, STEPS))):
        assert r["sliced_needed"] < 0.8 * r["full_needed"], r        # its moments' slices, not full chunks
        assert r["sliced_read"] < r["full_read"], r
        if case is SAVED:
            ratio = (r["sliced_read"] / r["full_read"]) / (r["sliced_needed"] / r["full_needed"])
            assert abs(ratio - 1) <= 0.05, (rank, r)
        assert all(abs(a - b) <= TOL * b for a, b in zip(r["losses"], reference[SAVED_AT:])), (r, reference)
