"""Spot notices acted on ahead, on a 3-node emulated Ray cluster: the state without the noticed node is planned
and its workers set up (process groups, engines) while the job trains; the switch at a step boundary flushes,
loses no step, reads nothing from the storage and trains on exactly as the uninterrupted run. A noticed node
that vanishes before the switch is a loss like any other: the preparation is dropped, its workers killed."""
from __future__ import annotations

import time
from dataclasses import replace

import pytest

ray = pytest.importorskip("ray")

from autohet_ray.cluster.spec import cluster_from_dict  # noqa: E402
from autohet_ray.job.config import TrainJob  # noqa: E402
from autohet_ray.job.notice_ahead import NOTICE_MARGIN_S  # noqa: E402
from autohet_ray.model.spec import load_model  # noqa: E402
from autohet_ray.orchestrate.controller import Controller  # noqa: E402
from autohet_ray.storage.spec import storage_spec  # noqa: E402
from ray_helpers import FAST_HEALTH_CHECKS, THREE_NODES, actors_alive, asymmetric_plan, reference_losses  # noqa: E402
from shared_clusters import shared_cluster  # noqa: E402

pytestmark = pytest.mark.timeout(600)


cluster = shared_cluster(THREE_NODES, system_config=FAST_HEALTH_CHECKS, changes_nodes=True)


def notice_job(storage: str) -> TrainJob:
    return TrainJob(model=load_model("tiny-gpt").to_dict(), cluster=THREE_NODES, global_batch=4, elastic=True,
                    storage=storage_spec(storage), dtype="float64", checkpoint_every=0, collective_timeout_s=30,
                    detect_timeout_s=30, plan=asymmetric_plan(), baselines=False)


def post_notice(ctl: Controller, name: str, in_s: float = 120.0):
    """A notice for node `name` on a notice board of the job (as a watcher posts it): the board."""
    from autohet_ray.elastic.spot import start_board
    board = start_board(ctl.job_id)
    notice = {"action": "terminate", "provider": "aws", "deadline_s": time.time() + in_s}
    ray.get(board.post.remote(ctl.found.node_ids[name], notice), timeout=30)
    return board


def test_a_noticed_node_is_switched_off_with_groups_built_ahead(cluster, tmp_path):
    ctl = Controller(notice_job(str(tmp_path / "cloud")))
    try:
        ctl.start()
        losses = [ctl.step()["loss"] for _ in range(2)]
        board = post_notice(ctl, "b")
        report, trained, deadline = None, 0, time.monotonic() + 240
        while report is None:
            assert time.monotonic() < deadline, "the prepared switch never happened"
            report = ctl.check_notices(board)
            switched_at = time.time()
            if report is None:
                assert ctl.leaving is not None and ctl.leaving.leaving == ["b"]
                losses.append(ctl.step()["loss"])
                trained += 1
        losses += [ctl.step()["loss"] for _ in range(2)]
        pending = ray.get(board.pending.remote(), timeout=30)
    finally:
        ctl.close()
    assert trained >= 1                                       # the job trained while the switch was prepared
    assert report["notice_deadline_s"] - switched_at > NOTICE_MARGIN_S     # prepared, not the at-once fallback
    assert report["nodes"] == ["b"] and report["groups_built_ahead"] and report["plan_source"] == "planned ahead"
    assert report["lost_steps"] == 0 and report["restored_step"] == 2 + trained
    assert report["restart_s"] == 0.0 and report["standby_setup_s"] > 0     # groups were set up before the switch
    assert report["bytes_by_tier"].get("storage", 0) == 0 and sum(report["bytes_by_tier"].values()) > 0
    assert all("b:" not in stage for p in report["plan"] for stage in p), report["plan"]
    assert report["reused_actors"] == report["num_ranks"] and pending == {}          # acknowledged: the watcher may drain
    assert losses == pytest.approx(reference_losses(len(losses)), rel=1e-6)


def test_a_noticed_node_lost_before_the_switch_drops_the_preparation(cluster, tmp_path):
    ctl = Controller(notice_job(str(tmp_path / "cloud")))
    try:
        ctl.start()
        losses = [ctl.step()["loss"] for _ in range(2)]
        board = post_notice(ctl, "b")
        deadline = time.monotonic() + 240
        while ctl.leaving is None or ctl.leaving.standby is None:     # until the standby workers are started
            assert time.monotonic() < deadline, "no standby group was started"
            assert ctl.check_notices(board) is None
            if ctl.leaving.standby is None:
                losses.append(ctl.step()["loss"])
        standby = list(ctl.leaving.standby.group.actors)
        victim = next(n for n in cluster.list_all_nodes() if n.node_id == ctl.found.node_ids["b"])

        def lose_node_b(controller):
            controller.mark_fault()
            cluster.remove_node(victim, allow_graceful=False)

        first = ctl.step(fault_hook=lose_node_b)
        rec = first["recovery"]
        after = ctl.check_notices(board)                 # b is gone: only the acknowledgement is left
        resumed = [first["loss"], *[ctl.step()["loss"] for _ in range(2)]]
    finally:
        ctl.close()
    assert rec["lost_nodes"] == ["b"] and ctl.leaving is None
    assert not any(actors_alive(standby))                       # the preparation's workers were killed
    assert after == {"nodes": [], "flush_s": after["flush_s"]}
    assert rec["bytes_by_tier"].get("storage", 0) == 0 and rec["lost_steps"] <= 1
    ref = reference_losses(rec["restored_step"] + 3)
    assert losses == pytest.approx(ref[:len(losses)], rel=1e-6)
    assert resumed == pytest.approx(ref[rec["restored_step"]:rec["restored_step"] + 3], rel=1e-6)


def test_a_loss_while_a_join_is_prepared_drops_it_and_recovers_onto_the_joined_node(cluster, tmp_path):
    from autohet_ray.emulate.cluster import node_args
    from autohet_ray.orchestrate.discovery import live_nodes
    from ray_helpers import wait_until_alive
    assert "b" not in {n.name for n in live_nodes()}       # the test before removed it
    ctl = Controller(replace(notice_job(str(tmp_path / "cloud")), plan=None))      # planned on a and c
    try:
        ctl.start()
        losses = [ctl.step()["loss"] for _ in range(2)]
        added = cluster.add_node(**node_args(cluster_from_dict(THREE_NODES).node("b")))
        wait_until_alive([added.node_id])
        deadline = time.monotonic() + 240
        while ctl.joining is None or ctl.joining.standby is None:   # b's workers, then the standby group started
            assert time.monotonic() < deadline, "no standby group was started for the join"
            assert ctl.check_joins() is None
            if ctl.joining.standby is None:
                losses.append(ctl.step()["loss"])
        prepared = [a for actors in ctl.joining.actors.values() for a in actors]
        standby = list(ctl.joining.standby.group.actors)
        victim = next(n for n in cluster.list_all_nodes() if n.node_id == ctl.found.node_ids["c"])   # a: the head

        def lose_node_c(controller):
            controller.mark_fault()
            cluster.remove_node(victim, allow_graceful=False)

        first = ctl.step(fault_hook=lose_node_c)
        rec = first["recovery"]
        resumed = [first["loss"], *[ctl.step()["loss"] for _ in range(2)]]
        after = ctl.check_joins()                        # b was taken by the recovery: nothing left to join
    finally:
        ctl.close()
    assert rec["lost_nodes"] == ["c"] and ctl.joining is None and after is None
    assert any(stage.startswith("b:") for p in rec["plan"] for stage in p), rec["plan"]   # the joined node is used
    assert not any(actors_alive(standby + prepared))            # the preparation's workers were killed
    assert rec["bytes_by_tier"].get("storage", 0) == 0 and rec["lost_steps"] <= 1
    ref = reference_losses(rec["restored_step"] + 3)
    assert losses == pytest.approx(ref[:len(losses)], rel=1e-6)
    assert resumed == pytest.approx(ref[rec["restored_step"]:rec["restored_step"] + 3], rel=1e-6)
