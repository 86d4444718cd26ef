"""Recovery's decisions (recovery/policy.py), given events and no Ray: what a failed step, a loss while
relaunching, a spot notice or a joined node calls for, and the state Recovery keeps between them."""
from __future__ import annotations

import time

import pytest

from autohet_ray.recovery.budget import RecoveryExhausted
from autohet_ray.recovery.decisions import Drain, Grow, Relaunch, RecoveryFailed, Salvage, StepFailed, Stop
from autohet_ray.recovery.policy import MAX_RECOVERIES_IN_A_ROW, Recovery

NODE_IDS = {"a": "id-a", "b": "id-b", "c": "id-c"}
LOST_B = {"lost_nodes": ["b"], "dead_ranks": [1], "message": "lost node(s) ['b']: rank 1 (pipeline 0 stage 1)"}


class Failure(RuntimeError):
    """A failed group call as the worker group raises it: the failing rank, and whether its worker died."""

    def __init__(self, message: str = "rank 1 failed", *, dead: bool = True):
        super().__init__(message)
        self.rank, self.dead = 1, dead


def _recovery(**kw) -> Recovery:
    return Recovery(**{"max_recoveries": 5, "window_steps": 10, **kw})


def _never():
    raise AssertionError("not to be asked")


def _diagnose(rec: Recovery, failure=None, *, healthy=_never, detect=lambda: LOST_B, keeps_checkpoints=True):
    return rec.diagnose(failure or Failure(), healthy=healthy, detect=detect, keeps_checkpoints=keeps_checkpoints,
                        node_ids=NODE_IDS)


def test_a_lost_node_is_salvaged_and_never_planned_onto_again():
    rec = _recovery()
    assert rec.on_failure(Failure(), completed=3) is None
    decision = _diagnose(rec)
    assert isinstance(decision, Salvage) and decision.lost == LOST_B and decision.detect_s >= 0
    assert rec.gone == {"id-b"}


def test_detection_is_timed_from_the_injected_fault():
    rec = _recovery()
    rec.mark_fault()
    time.sleep(0.2)
    rec.on_failure(Failure(), completed=1)
    assert _diagnose(rec).detect_s >= 0.2


def test_a_step_error_on_a_healthy_cluster_stops_the_job_without_detection():
    rec = _recovery()
    rec.on_failure(Failure(dead=False), completed=2)
    decision = _diagnose(rec, Failure("ValueError: bad batch", dead=False), healthy=lambda: True, detect=_never)
    assert isinstance(decision, Stop) and isinstance(decision.error, StepFailed)
    assert "every node and worker alive: ValueError: bad batch" in str(decision.error)
    assert rec.gone == set()


def test_a_step_error_on_an_unhealthy_cluster_is_a_loss():
    rec = _recovery()
    rec.on_failure(Failure(dead=False), completed=2)
    assert isinstance(_diagnose(rec, Failure(dead=False), healthy=lambda: False), Salvage)


def test_a_failure_nothing_explains_stops_the_job():
    def nothing_found():
        raise RuntimeError("a step failed but Ray reports no lost node or dead actor within 5 s")
    rec = _recovery()
    rec.on_failure(Failure(), completed=2)
    decision = _diagnose(rec, detect=nothing_found)
    assert isinstance(decision, Stop) and type(decision.error) is RecoveryFailed
    assert "no lost node or dead actor" in str(decision.error)


def test_a_job_without_checkpoints_cannot_recover():
    rec = _recovery()
    rec.on_failure(Failure(), completed=2)
    decision = _diagnose(rec, keeps_checkpoints=False)
    assert isinstance(decision, Stop) and "keeps no checkpoints" in str(decision.error)
    assert LOST_B["message"] in str(decision.error) and rec.gone == set()


def test_failures_without_progress_spend_the_budget_then_stop():
    rec = _recovery(max_recoveries=2, window_steps=3)
    assert rec.on_failure(Failure(), completed=4) is None
    assert rec.on_failure(Failure(), completed=4) is None
    decision = rec.on_failure(Failure("rank 1 died again"), completed=4)
    assert isinstance(decision, Stop) and isinstance(decision.error, RecoveryExhausted)
    assert "2 recoveries within 3 steps without progress" in str(decision.error)


def test_progress_earns_the_budget_back():
    rec = _recovery(max_recoveries=1, window_steps=3)
    assert rec.on_failure(Failure(), completed=4) is None
    rec.progressed(7)
    assert rec.on_failure(Failure(), completed=7) is None


@pytest.mark.parametrize("mode, nothing_committed, planned, restore_from", [
    ("local_first", False, False, "local_first"), ("cloud_only", False, False, "cloud_only"),
    ("cloud_only", False, True, "local_first"), ("local_first", True, False, None), ("cloud_only", True, True, None)])
def test_a_relaunch_restores_as_the_mode_says_or_starts_over_when_nothing_was_committed(
        mode, nothing_committed, planned, restore_from):
    decision = _recovery(mode=mode).relaunch("why", {"a": ["actor"]}, nothing_committed=nothing_committed,
                                             planned=planned, plan={"p": 1})
    assert decision == Relaunch("why", {"a": ["actor"]}, {"p": 1}, restore_from)


def test_losses_while_relaunching_start_new_rounds_until_too_many():
    rec = _recovery()
    rec.on_failure(Failure(), completed=6)
    for k in range(MAX_RECOVERIES_IN_A_ROW - 1):
        assert rec.lost_again(Failure(f"loss {k}"), {"round": k}) is None
    decision = rec.lost_again(Failure("the last loss"), {"round": "last"})
    assert isinstance(decision, Stop)
    assert str(decision.error) == f"{MAX_RECOVERIES_IN_A_ROW} losses in a row while recovering; last: the last loss"


def test_a_recovery_report_counts_rounds_and_lost_steps_and_is_kept():
    rec = _recovery()
    rec.mark_fault()
    fault_at = rec.fault_at
    rec.on_failure(Failure(), completed=6)
    rec.lost_again(Failure(), {"round": 1})
    report = rec.recovered({"restored_step": 5})
    assert report["rounds"] == 2 and report["earlier_rounds"] == [{"round": 1}]
    assert report["completed_step"] == 6 and report["lost_steps"] == 1 and report["started_at"] == fault_at
    assert rec.fault_at is None and rec.recoveries == [report]
    planned = rec.replanned({"restored_step": 9}, completed=9)
    assert planned["lost_steps"] == 0 and rec.recoveries == [report, planned]


def test_a_new_recovery_starts_its_rounds_afresh():
    rec = _recovery()
    rec.on_failure(Failure(), completed=2)
    rec.lost_again(Failure(), {"round": 1})
    rec.recovered({"restored_step": 2})
    rec.on_failure(Failure(), completed=5)
    assert rec.recovered({"restored_step": 5})["rounds"] == 1


def test_no_notice_and_no_drain_is_no_decision():
    assert _recovery().on_notices(set(), set(), {"id-a": "a"}) is None


def test_a_noticed_node_of_the_job_is_left_and_never_planned_onto():
    rec = _recovery()
    decision = rec.on_notices({"id-b"}, set(), {"id-a": "a", "id-b": "b"})
    assert decision == Drain(ack=["id-b"], leaving=["b"]) and rec.draining == {"id-b"}


def test_a_ray_drain_of_a_job_node_is_left_with_nothing_to_acknowledge():
    rec = _recovery()
    assert rec.on_notices(set(), {"id-a", "id-x"}, {"id-a": "a", "id-b": "b"}) == Drain(ack=[], leaving=["a"])
    assert rec.draining == {"id-a"}


def test_a_notice_for_a_node_the_job_does_not_use_is_only_acknowledged():
    rec = _recovery()
    assert rec.on_notices({"id-z"}, set(), {"id-a": "a"}) == Drain(ack=["id-z"], leaving=[])
    assert rec.draining == {"id-z"}          # it joined but was never planned onto: it never will be


def test_joined_nodes_are_the_available_ones_the_plan_does_not_use():
    assert Recovery.on_joins({"a"}, {"a", "b", "d"}) == Grow(joined=["b", "d"])
    assert Recovery.on_joins({"a", "b"}, {"a", "b"}) is None
    replacement = "f" * 51 + "00003"              # an autoscaled node, named by its Ray node id
    assert Recovery.on_joins({"f" * 51 + "00001"}, {"f" * 51 + "00001", replacement}) == Grow(joined=[replacement])
