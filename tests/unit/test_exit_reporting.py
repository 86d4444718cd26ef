"""Failure lines, the recovery budget and the exit status of a run (no Ray, no process)."""
from __future__ import annotations

import os
import signal
import time

import pytest

from autohet_ray.cli.signals import Stopped, as_raised, exit_status, stop_signals, stopped_by
from autohet_ray.recovery.budget import RecoveryBudget, RecoveryExhausted
from autohet_ray.recovery.report import EXIT_GAVE_UP, EXIT_NOT_IN_STORAGE, report_failure
from autohet_ray.job.config import TrainJob
from autohet_ray import ConfigError


class Failure(RuntimeError):
    def __init__(self, message: str, rank: int):
        super().__init__(message)
        self.rank = rank


def test_a_failure_is_one_line_with_step_what_tier_and_reason(capsys):
    line = report_failure(4, "storage upload skipped", "storage", "rank 1: upload failed\nTraceback (most recent)")
    assert line == "step 4: storage upload skipped [tier storage]: rank 1: upload failed"
    assert capsys.readouterr().err == f"autohet: {line}\n"


def test_recoveries_without_progress_run_out_and_name_the_rank(capsys):
    budget = RecoveryBudget(max_recoveries=2, window_steps=3)
    budget.progressed(5)
    budget.charge(Failure("rank 3 died", 3), 6)
    budget.charge(Failure("rank 3 died", 3), 6)
    with pytest.raises(RecoveryExhausted, match=r"2 recoveries within 3 steps without progress \(the job reached "
                                                r"step 5\); failing rank 3: rank 3 died") as info:
        budget.charge(Failure("rank 3 died", 3), 6)
    assert info.value.rank == 3 and info.value.last_error == "rank 3 died"
    assert capsys.readouterr().err.count("autohet: step 6: rank 3 failed: rank 3 died (recovery") == 2


def test_recoveries_stop_counting_once_the_job_gets_a_window_further():
    budget = RecoveryBudget(max_recoveries=2, window_steps=3)
    for step in (1, 2, 4, 7, 10, 13):      # a loss every 3 steps, each followed by progress: never exhausted
        budget.progressed(step)
        budget.charge(Failure("node lost", 0), step + 1)
    budget.progressed(14)
    budget.charge(Failure("node lost", 0), 15)
    with pytest.raises(RecoveryExhausted):   # 13, 14, 14: the third within 3 steps of no progress
        budget.charge(Failure("node lost", 0), 15)


@pytest.mark.parametrize("field", ["max_recoveries", "recovery_window_steps"])
def test_the_budget_fields_must_be_positive_integers(field):
    with pytest.raises(ConfigError, match=f"{field}=0 must be an integer >= 1"):
        TrainJob(model={}, cluster={}, global_batch=4, **{field: 0})


@pytest.mark.parametrize("secured, failure, code", [
    ({"in_storage": True}, None, 0), ({}, None, 0), ({"in_storage": False}, None, EXIT_NOT_IN_STORAGE),
    ({"in_storage": True}, "a step failed", EXIT_GAVE_UP), ({"in_storage": False}, "gave up", EXIT_GAVE_UP)])
def test_exit_status(secured, failure, code):
    assert exit_status({"secured": secured, "failure": failure}) == code


@pytest.mark.parametrize("signum, raised", [(signal.SIGTERM, 128 + signal.SIGTERM), (signal.SIGHUP, 129),
                                            (signal.SIGINT, KeyboardInterrupt)])
def test_a_stop_signal_raises_once_and_is_remembered(signum, raised, capsys):
    before = signal.getsignal(signum)
    with pytest.raises(KeyboardInterrupt if raised is KeyboardInterrupt else Stopped) as info:
        with stop_signals():
            os.kill(os.getpid(), signum)
            time.sleep(1)                       # the handler runs in the main thread, between bytecodes
    if raised is not KeyboardInterrupt:
        assert info.value.code == raised
    assert stopped_by() == signum and isinstance(as_raised(signum), type(info.value))
    assert signal.getsignal(signum) is before


def test_a_second_stop_signal_is_noted_and_ignored(capsys):
    with pytest.raises(Stopped):
        with stop_signals():
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(1)
            finally:                            # the exit path runs: a second signal must not cut it short
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.2)
    assert "SIGTERM again: still securing the newest step" in capsys.readouterr().err
