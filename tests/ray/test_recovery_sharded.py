"""A node lost mid-run under sharded optimizer state: on the 3-node emulated cluster of test_recovery.py, the
asymmetric plan with every stage sharding its optimizer state (each unit's master and moments split between
its two pipelines' holders), a snapshot after every step. Node b (all of pipeline 1) is removed mid-step: the
controller re-plans on a and c, restores from the node and peer keepers (0 cloud bytes, 0 lost steps: step 3
is committed before the loss)
and the losses equal the uninterrupted single-process run's (fp64)."""
from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")

from autohet_ray.orchestrate.controller import Controller  # noqa: E402
from ray_helpers import FAST_HEALTH_CHECKS, reference_losses, sharded_plan  # noqa: E402
from test_recovery import NODES, elastic_job, node_handle  # noqa: E402
from shared_clusters import shared_cluster  # noqa: E402

pytestmark = pytest.mark.timeout(420)


cluster = shared_cluster(NODES, system_config=FAST_HEALTH_CHECKS, changes_nodes=True)




def test_node_loss_under_sharded_optimizer_state_loses_nothing(cluster, tmp_path):
    ctl = Controller(elastic_job(str(tmp_path / "cloud"), plan=sharded_plan(), checkpoint_every=1,
                                 optimizer_sharding="dp"))
    try:
        ctl.start()
        before = [ctl.step()["loss"] for _ in range(3)]
        assert ctl.planning_ahead.wait(120) and ctl.planning_ahead.errors == []
        # step 3's node-store commit would otherwise run while step 4 computes (after the loss): commit it
        # first, so that the node lost mid-step 4 takes no committed step with it
        assert ctl.flush()["committed"] == [3]
        victim = node_handle(cluster, ctl, "b")

        def lose_node_b(controller):
            controller.mark_fault()
            cluster.remove_node(victim, allow_graceful=False)

        first = ctl.step(fault_hook=lose_node_b)
        rec = first["recovery"]
        after = [ctl.step()["loss"] for _ in range(2)]
    finally:
        ctl.close()
    assert rec["lost_nodes"] == ["b"]
    assert rec["bytes_by_tier"].get("storage", 0) == 0
    assert rec["lost_steps"] == 0 and rec["restored_step"] == 3, rec
    ref = reference_losses(rec["restored_step"] + 3)
    assert before == pytest.approx(ref[:3], rel=1e-6)
    assert [first["loss"], *after] == pytest.approx(ref[3:6], rel=1e-6)
