"""Faults during prepared switches, on a 3-node emulated Ray cluster, through Controller.run (the loop every entry
point uses): a standby group whose setup fails (one of its workers killed for real) is printed, counted and
prepared again, and the switch still happens; a node lost while the standby group restores the flushed step is
recovered like any loss, from that step: the job goes on, no committed step is lost and the losses are those of
the uninterrupted fp64 run."""
from __future__ import annotations

import time

import pytest

ray = pytest.importorskip("ray")

from autohet_ray.cluster.spec import cluster_from_dict  # noqa: E402
from autohet_ray.job.config import TrainJob  # noqa: E402
from autohet_ray.model.spec import load_model  # noqa: E402
from autohet_ray.orchestrate import switch_ahead  # noqa: E402
from autohet_ray.orchestrate.controller import Controller  # noqa: E402
from autohet_ray.storage.spec import storage_spec  # noqa: E402
from ray_helpers import FAST_HEALTH_CHECKS, THREE_NODES, actors_alive, asymmetric_plan, reference_losses  # noqa: E402
from shared_clusters import shared_cluster  # noqa: E402

pytestmark = pytest.mark.timeout(900)

STEPS = 14
NOTICE_AT = 2           # the step after which node b gets its notice


cluster = shared_cluster(THREE_NODES, system_config=FAST_HEALTH_CHECKS, changes_nodes=True)


def switch_job(storage: str) -> TrainJob:
    return TrainJob(model=load_model("tiny-gpt").to_dict(), cluster=THREE_NODES, global_batch=4, elastic=True,
                    storage=storage_spec(storage), dtype="float64", checkpoint_every=0, collective_timeout_s=30,
                    detect_timeout_s=30, plan=asymmetric_plan(), baselines=False)


def noticed_run(ctl: Controller) -> dict:
    """Run STEPS steps; after step NOTICE_AT node b gets a 10-minute notice (posted on the job's board as a
    watcher posts it). Each step waits for a standby group being set up, so the switch comes within the run
    however slow the host is."""
    from autohet_ray.elastic.spot import start_board

    def on_event(kind: str, report: dict) -> None:
        if kind == "step" and report["step"] == NOTICE_AT:
            ctl.board = start_board(ctl.job_id)
            notice = {"action": "terminate", "provider": "aws", "deadline_s": time.time() + 600.0}
            ray.get(ctl.board.post.remote(ctl.found.node_ids["b"], notice), timeout=30)
        standby = ctl.leaving.standby if ctl.leaving is not None else None
        deadline = time.monotonic() + 240
        while standby is not None and not standby.ready():
            assert time.monotonic() < deadline, "the standby group never finished its setup"
            time.sleep(0.1)

    return ctl.run(STEPS, on_event=on_event)


class KillingStandbys:
    """switch_ahead, except that the first `kills` standby groups it builds lose their last worker (ray.kill) at
    once, while that worker's process still starts: their setup fails."""

    def __init__(self, kills: int = 1):
        self.killed, self.kills = [], kills

    def __getattr__(self, name):
        return getattr(switch_ahead, name)

    def Standby(self, ctl, plan, reuse):          # noqa: N802 - stands in for the class
        standby = switch_ahead.Standby(ctl, plan, reuse)
        if len(self.killed) < self.kills:
            self.killed.append(standby.group.actors[-1])
            ray.kill(self.killed[-1])
        return standby


def test_a_standby_whose_setup_fails_is_counted_and_prepared_again(cluster, tmp_path, capfd):
    ctl = Controller(switch_job(str(tmp_path / "cloud")))
    ctl.switch_side = side = KillingStandbys()
    summary = noticed_run(ctl)
    printed = capfd.readouterr().err
    assert summary["failure"] is None and len(side.killed) == 1
    assert len(summary["standby_failures"]) == 1, summary["standby_failures"]
    assert "the standby workers for the switch (spot notice: node(s) ['b']" in summary["standby_failures"][0]
    assert "died" in summary["standby_failures"][0]            # the cause: the killed worker
    assert summary["standby_failures"][0] in printed
    switches = [e for e in summary["events"] if e.get("nodes") == ["b"]]
    assert len(switches) == 1 and switches[0]["groups_built_ahead"] and switches[0]["lost_steps"] == 0
    losses = [s["loss"] for s in summary["steps"]]
    assert len(losses) == STEPS and losses == pytest.approx(reference_losses(STEPS), rel=1e-6)


def remove_node(ctl: Controller, cluster, victim: str) -> None:
    """Remove node `victim` (not gracefully) and wait until Ray declares it dead."""
    node_id = ctl.found.node_ids[victim]
    ctl.mark_fault()
    cluster.remove_node(next(n for n in cluster.list_all_nodes() if n.node_id == node_id), allow_graceful=False)
    deadline = time.monotonic() + 60
    while any(n["NodeID"] == node_id and n["Alive"] for n in ray.nodes()):
        assert time.monotonic() < deadline, "Ray never declared the removed node dead"
        time.sleep(0.2)


def ensure_node_c(cluster) -> None:
    """Add node c back when a test before removed it."""
    from autohet_ray.emulate.cluster import node_args
    from ray_helpers import wait_until_alive
    from autohet_ray.orchestrate.discovery import live_nodes
    if "c" not in {n.name for n in live_nodes()}:
        wait_until_alive([cluster.add_node(**node_args(cluster_from_dict(THREE_NODES).node("c"))).node_id])


def test_a_switch_whose_standby_fails_three_times_is_made_without_one(cluster, tmp_path):
    from autohet_ray.job.notice_ahead import STANDBY_TRIES
    ensure_node_c(cluster)
    ctl = Controller(switch_job(str(tmp_path / "cloud")))
    ctl.switch_side = side = KillingStandbys(kills=100)
    summary = noticed_run(ctl)
    assert summary["failure"] is None and len(side.killed) == STANDBY_TRIES
    assert len(summary["standby_failures"]) == STANDBY_TRIES
    assert "(3 of 3 tries); switching without standby workers" in summary["standby_failures"][-1]
    switches = [e for e in summary["events"] if e.get("nodes") == ["b"]]
    assert len(switches) == 1 and not switches[0].get("groups_built_ahead") and switches[0]["lost_steps"] == 0
    assert all(stage.split(":")[0] in "ac" for p in switches[0]["plan"] for stage in p), switches[0]["plan"]
    losses = [s["loss"] for s in summary["steps"]]
    assert len(losses) == STEPS and losses == pytest.approx(reference_losses(STEPS), rel=1e-6)


class LosingNodeInSwitch(Controller):
    """A controller whose node `victim` is removed (not gracefully) as the standby group of a prepared switch
    starts restoring the flushed step (`after_restore`: once that restore is done, before the leaving node's
    store is dropped)."""

    def __init__(self, job, cluster, victim: str, *, after_restore: bool = False):
        super().__init__(job)
        self.cluster, self.victim, self.after_restore, self.completed_at_loss = cluster, victim, after_restore, None

    def resume_on_group(self, restore):
        switching = self.completed_at_loss is None and self.plan_source == "planned ahead" and self.leaving is not None
        if switching:
            self.completed_at_loss = self.step_index
        if switching and not self.after_restore:
            remove_node(self, self.cluster, self.victim)
        report = super().resume_on_group(restore)
        if switching and self.after_restore:
            remove_node(self, self.cluster, self.victim)
        return report


def test_a_node_lost_while_the_standby_restores_is_recovered_from_the_flushed_step(cluster, tmp_path):
    ensure_node_c(cluster)
    ctl = LosingNodeInSwitch(switch_job(str(tmp_path / "cloud")), cluster, "c")   # a: the head, b: noticed
    summary = noticed_run(ctl)
    assert summary["failure"] is None and ctl.completed_at_loss is not None
    recovered = [e for e in summary["events"] if e.get("during_switch")]
    assert len(recovered) == 1, summary["events"]
    rec = recovered[0]
    assert rec["lost_nodes"] == ["c"] and rec["completed_step"] == ctl.completed_at_loss
    assert rec["lost_steps"] == 0 and rec["restored_step"] == ctl.completed_at_loss   # the flushed step
    assert rec["bytes_by_tier"].get("storage", 0) == 0                                   # local-first
    assert all(stage.startswith("a:") for p in rec["plan"] for stage in p), rec["plan"]  # the survivor
    assert ctl.leaving is None and "b" not in ctl.keeper_specs and "c" not in ctl.keeper_specs
    losses = [s["loss"] for s in summary["steps"]]
    assert len(losses) == STEPS and losses == pytest.approx(reference_losses(STEPS), rel=1e-6)
    assert summary["secured"]["step"] == STEPS and summary["secured"]["in_storage"]


def test_a_node_lost_right_after_a_switch_loses_no_step_the_leaving_node_held(cluster, tmp_path):
    """Node c dies once the standby group restored (b's notice), before any step commits under the new plan:
    the chunks of the flushed step that b and c held are on no staying store unless b handed them over
    before its store was dropped. They were: the step is restored from node a alone."""
    ensure_node_c(cluster)
    ctl = LosingNodeInSwitch(switch_job(str(tmp_path / "cloud")), cluster, "c", after_restore=True)
    summary = noticed_run(ctl)
    assert summary["failure"] is None and ctl.completed_at_loss is not None
    switch = next(e for e in summary["events"] if e.get("nodes") == ["b"])
    assert switch["groups_built_ahead"] and switch["handed_over_bytes"] > 0
    lost = [e for e in summary["events"] if e.get("lost_nodes") == ["c"]]
    assert len(lost) == 1 and not lost[0].get("during_switch"), summary["events"]
    assert lost[0]["restored_step"] == ctl.completed_at_loss and lost[0]["lost_steps"] == 0
    assert lost[0]["bytes_by_tier"].get("storage", 0) == 0                               # from node a's store
    losses = [s["loss"] for s in summary["steps"]]
    assert len(losses) == STEPS and losses == pytest.approx(reference_losses(STEPS), rel=1e-6)


class LosingNodeInFlush(Controller):
    """A controller whose node `victim` is removed (not gracefully) as a prepared switch starts its flush, and
    Ray declares it dead before the flush runs: the old workers there are gone before their newest step is
    committed. Whether the standby workers live is noted as the recovery ends."""

    def __init__(self, job, cluster, victim: str):
        super().__init__(job)
        self.cluster, self.victim, self.committed_at_loss, self.standby = cluster, victim, None, None
        self.standby_alive = None

    def flush(self, *args, **kwargs):
        standby = self.leaving.standby if self.leaving is not None else None
        if self.committed_at_loss is None and standby is not None and standby.ready():   # the switch begins
            self.committed_at_loss, self.standby = self.committer.committed[-1], standby
            remove_node(self, self.cluster, self.victim)
        return super().flush(*args, **kwargs)

    def _recover_switch(self, failure):
        report = super()._recover_switch(failure)
        self.standby_alive = actors_alive(self.standby.group.actors)
        return report


def test_a_node_lost_during_the_switchs_flush_is_recovered_from_the_newest_committed_step(cluster, tmp_path):
    ensure_node_c(cluster)
    ctl = LosingNodeInFlush(switch_job(str(tmp_path / "cloud")), cluster, "c")
    summary = noticed_run(ctl)
    assert summary["failure"] is None and ctl.committed_at_loss is not None
    assert ctl.standby_alive is not None and not any(ctl.standby_alive)   # the standby group was dropped
    recovered = [e for e in summary["events"] if e.get("during_switch")]
    assert len(recovered) == 1, summary["events"]
    rec = recovered[0]
    assert rec["lost_nodes"] == ["c"] and rec["restored_step"] == ctl.committed_at_loss   # nothing committed lost
    assert rec["lost_steps"] == rec["completed_step"] - ctl.committed_at_loss == 1   # the unflushed step only
    assert rec["bytes_by_tier"].get("storage", 0) == 0
    assert all(stage.startswith("a:") for p in rec["plan"] for stage in p), rec["plan"]
    ref = reference_losses(STEPS)
    assert summary["steps"][-1]["step"] == STEPS
    for step in summary["steps"]:                                      # a step run again repeats its loss
        assert step["loss"] == pytest.approx(ref[step["step"] - 1], rel=1e-6), step
