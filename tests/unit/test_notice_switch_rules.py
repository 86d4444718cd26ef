"""Prepared switches without Ray: when a notice leaves time to prepare (job/notice_ahead.py), and the replay's
figures for them (replay/notice_figures.py) on a hand-computed one-pool case."""
import json
import math

import pytest

from autohet_ray import ConfigError
from autohet_ray.job.notice_ahead import (NOTICE_MARGIN_S, Leaving, act_at_once, earliest_deadline,
                                          preparation_left_s, switch_deadline, switch_now)
from autohet_ray.recovery.policy import Recovery
from autohet_ray.replay.notice_figures import bar_row, measured_switch, notice_figures
from autohet_ray.replay.phases import PhaseModel
from autohet_ray.replay.planning import PlanCache, PlannedState
from autohet_ray.replay.systems import ReplayConfig
from autohet_ray.replay.timeline import build_timeline
from autohet_ray.replay.traces import PoolTrace, trace_from_rows


def test_the_earliest_deadline_of_the_noticed_nodes_counts():
    notices = {"n1": {"deadline_s": 1000.0}, "n2": {"deadline_s": 900.0}, "n3": {}}
    drains = {"n1": 950_000, "n4": 0}
    assert earliest_deadline(notices, drains, {"n1"}) == 950.0          # Ray's drain deadline is in ms
    assert earliest_deadline(notices, drains, {"n1", "n2"}) == 900.0
    assert earliest_deadline(notices, drains, {"n3", "n4"}) is None     # none stated


def test_a_notice_is_prepared_only_with_more_than_the_margin_left():
    assert act_at_once(None, 0.0)                                       # no deadline known: act at once
    assert act_at_once(100.0 + NOTICE_MARGIN_S, 100.0)
    assert not act_at_once(100.0 + NOTICE_MARGIN_S + 0.1, 100.0)


def test_the_switch_is_planned_against_the_watchers_flush_timeout_too():
    # a 120 s notice posted at t=1000 by a watcher that waits 60 s: it drains its node at 1060
    assert switch_deadline(1120.0, [1060.0]) == 1060.0
    assert switch_deadline(1120.0, [1060.0, 1065.0]) == 1060.0      # the first watcher to give up counts
    assert switch_deadline(1050.0, [1060.0]) == 1050.0              # a deadline sooner than the timeout
    assert switch_deadline(1120.0, []) == 1120.0                    # a Ray drain: no watcher waits
    assert switch_deadline(None, [1060.0]) is None                  # no deadline known: act at once
    by = switch_deadline(1120.0, [1060.0])
    assert not act_at_once(by, 1020.0, margin_s=30.0)               # 40 s left before the drain
    assert act_at_once(by, 1031.0, margin_s=30.0)                   # under the notice's deadline alone: prepared


def test_a_preparation_that_cannot_finish_in_time_is_acted_on_at_once():
    assert preparation_left_s([], 5.0) == 0.0                               # nothing measured yet
    assert preparation_left_s([12.0, 20.0], 5.0) == 15.0                    # the longest earlier one, less elapsed
    assert preparation_left_s([12.0], 30.0) == 0.0
    by = 1060.0                                                             # 60 s after t=1000
    assert not act_at_once(by, 1000.0, margin_s=30.0, prepare_left_s=25.0)  # 60 - 25 = 35 s > margin
    assert act_at_once(by, 1000.0, margin_s=30.0, prepare_left_s=35.0)      # would end with 25 s < margin left
    assert act_at_once(by, 1000.0, margin_s=30.0, prepare_left_s=preparation_left_s([40.0], 5.0))


def test_the_controller_acts_at_once_when_the_watcher_would_drain_first():
    now = 1000.0
    recovery = Recovery(max_recoveries=3, window_steps=10)
    ctl = type("Ctl", (), {"recovery": recovery, "leaving": None})()
    deadline = now + 120.0                                           # an AWS notice: 2 minutes
    watched = {"n1": {"deadline_s": deadline, "flush_by_s": now + 60.0}}
    assert not switch_now(ctl, deadline, watched, {"n1"}, now)            # 60 s left before the drain: prepare
    assert not switch_now(ctl, deadline, {"n1": {"deadline_s": deadline}}, {"n1"}, now)   # posted by hand: no watcher
    assert switch_now(ctl, deadline, {"n1": {"deadline_s": deadline, "flush_by_s": now + 25.0}}, {"n1"}, now)
    recovery.recoveries.append({"groups_built_ahead": True, "prepared_s": 40.0})   # an earlier switch took 40 s
    assert switch_now(ctl, deadline, watched, {"n1"}, now)                # 60 - 40 = 20 s left: under the margin
    assert not switch_now(ctl, deadline + 600.0, {"n1": {"deadline_s": deadline + 600.0}}, {"n1"}, now)


def test_a_preparation_is_stale_once_other_nodes_leave_or_the_state_changed():
    prep = Leaving(leaving=["b"], key=json.dumps({"name": "x", "nodes": []}), base="s0", deadline_s=None)
    assert not prep.stale(["b"], "s0")
    assert prep.stale(["b", "c"], "s0") and prep.stale(["b"], "s1")
    assert prep.plan({}) is None


def switch_file(tmp_path, medians: dict) -> str:
    path = tmp_path / "switch.json"
    path.write_text("log line\n" + json.dumps({"label": "emulated, 3 nodes on one host", "command": "c",
                                                "medians": medians}) + "\n")
    return str(path)


def test_the_measured_switch_is_the_dearer_prepared_mode(tmp_path):
    path = switch_file(tmp_path, {"notice_at_once": {"switch_s": 9.0}, "notice_prepared": {"switch_s": 0.4},
                                  "join_prepared_groups_ahead": {"switch_s": 0.7}})
    got = measured_switch(path)
    assert got["switch_s"] == 0.7 and got["mode"] == "join_prepared_groups_ahead"
    assert got["job_stopped_s_median_by_mode"]["notice_at_once"] == 9.0
    with pytest.raises(ConfigError, match="no prepared switch"):
        measured_switch(switch_file(tmp_path, {"notice_at_once": {"switch_s": 9.0}}))


BATCH, PER_NODE, RESTART, SWITCH, DETECT = 10, 10.0, 30.0, 1.0, 3.0
PHASES = PhaseModel(detect_s=DETECT, restart_s=RESTART, local_Bps=1e12, cloud_Bps=1e9, cloud_upload_Bps=1e9,
                    warmup_iterations=0.0, switch_s=SWITCH)


def one_pool(rows):
    timeline = build_timeline([PoolTrace(pool="H100", nodes=8, trace=trace_from_rows("t", rows, requested=8),
                                         cycle=False)], 1000.0)
    plans = PlanCache(lambda s: PlannedState(state=s, samples_per_s=PER_NODE * s[0],
                                             iteration_time_s=BATCH / (PER_NODE * s[0]) if s[0] else math.inf,
                                             nodes_used=(s[0],), bytes_per_node=0.0, planning_s=0.0))
    return timeline, plans, ReplayConfig(global_batch=BATCH, phases=PHASES, plan_cache=True, notice_s=120.0)


def test_a_noticed_removal_costs_the_switch_and_an_unnoticed_one_detect_and_restart():
    timeline, plans, config = one_pool([(0, 8), (500.0, 7)])
    got = notice_figures(timeline, plans, config, fleet_usd=10.0, seq_len=100, switch=None)
    ideal = 8 * PER_NODE * 500.0 + 7 * PER_NODE * 500.0
    launch = RESTART                                               # planning 0, nothing to restore, no warm-up
    noticed = got["cases"]["notices_120s"]
    # prepared: the build (planning 0 + the restart) ends 90 s before the node goes; the switch stops the job 1 s
    at = 500.0 - 120.0 + RESTART
    assert noticed["ours_goodput"] == pytest.approx(
        (8 * PER_NODE * (at - launch) + 7 * PER_NODE * (1000.0 - at - SWITCH)) / ideal, abs=1e-3)
    assert noticed["lost_steps"] == 0
    lost = got["cases"]["no_notices"]                              # detect + restart, the step in flight lost
    assert lost["ours_goodput"] < noticed["ours_goodput"] and lost["lost_steps"] <= 1
    assert lost["ours_goodput"] == pytest.approx(
        (8 * PER_NODE * (500.0 - launch) + 7 * PER_NODE * (1000.0 - 500.0 - DETECT - RESTART)) / ideal, abs=3e-3)
    assert got["goodput_by_notice_and_switch_s"]["notice_120s"]["switch_30s"] < noticed["ours_goodput"]
    assert got["cases"]["notices_120s"]["ours_usd_per_million_tokens"] == pytest.approx(
        10.0 / (noticed["ours_goodput"] * ideal * 100) * 1e6, rel=1e-3)


def test_the_bar_names_its_assumption_and_gives_the_figure_without_notices():
    timeline, plans, config = one_pool([(0, 8), (500.0, 7)])
    figures = notice_figures(timeline, plans, config, fleet_usd=10.0, seq_len=100, switch=None)
    bar = bar_row(figures["cases"]["notices_120s"]["ours_goodput"], config, figures)
    assert "notice_s 120" in bar["headline_assumes"] and f"restart {RESTART:g} s" in bar["headline_assumes"]
    assert bar["ours_goodput_without_notices"] == figures["cases"]["no_notices"]["ours_goodput"]
    assert bar["met"] == (bar["ours_goodput"] >= 0.90)


def test_the_switch_needed_for_a_goodput_is_found_by_bisection():
    from autohet_ray.replay.notice_figures import switch_needed
    goodput_at = lambda s: 0.95 - s / 100          # noqa: E731 - 0.90 at 5 s
    assert switch_needed(goodput_at, 30.0, 0.90) == pytest.approx(5.0, abs=0.01)
    assert switch_needed(goodput_at, 3.0, 0.90) == 3.0 and switch_needed(goodput_at, 30.0, 0.96) is None
