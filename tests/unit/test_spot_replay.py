"""The spot replay's trace scaling and goodput accounting against hand-computed cases (a fake planner: samples/s
proportional to the nodes alive, fixed planning time), so every figure below is arithmetic on the inputs."""
import math

import pytest

from autohet_ray import ConfigError
from autohet_ray.replay.phases import PhaseModel
from autohet_ray.replay.planning import PlanCache, PlannedState
from autohet_ray.replay.run import run_systems
from autohet_ray.replay.systems import CheckpointRestart, NoReplan, Ours, ReplayConfig
from autohet_ray.replay.timeline import build_timeline
from autohet_ray.replay.traces import PoolTrace, scaled_nodes, trace_from_rows

BATCH = 10
PER_NODE = 10.0            # samples/s per node of pool 0 (the only pool the fake plans use)
PLANNING_S = 2.0
BYTES = 4e9
PHASES = PhaseModel(detect_s=3.0, restart_s=5.0, local_Bps=1e9, cloud_Bps=0.5e9, cloud_upload_Bps=1e9,
                    warmup_iterations=1.0)
LOCAL_S, CLOUD_S, UPLOAD_S = BYTES / 1e9, BYTES / 0.5e9, BYTES / 1e9


def fake_planner(state):
    rate = PER_NODE * state[0]
    return PlannedState(state=state, samples_per_s=rate, iteration_time_s=BATCH / rate if rate else math.inf,
                        nodes_used=(state[0],) + (0,) * (len(state) - 1), bytes_per_node=BYTES,
                        planning_s=PLANNING_S)


def replay(rows, window=1000.0, extra_pool=None, **config):
    pools = [PoolTrace(pool="H100", nodes=2, trace=trace_from_rows("t", rows, requested=2), cycle=False)]
    if extra_pool:
        pools.append(extra_pool)
    timeline = build_timeline(pools, window)
    cfg = ReplayConfig(global_batch=BATCH, phases=PHASES, **({"checkpoint_every_s": 100.0} | config))
    return timeline, run_systems(timeline, PlanCache(fake_planner), cfg)


def test_trace_drops_leading_zeros_and_keeps_the_later_row_of_a_change():
    trace = trace_from_rows("t", [(0, 0), (100, 0), (100, 4), (130, 4), (130, 12), (200, 12), (200, 5), (260, 5)])
    assert trace.times_s == (0, 30, 100) and trace.counts == (4, 12, 5)
    assert trace.duration_s == 160 and trace.requested == 12
    assert [trace.count_at(t) for t in (0, 29.9, 30, 99, 100, 500)] == [4, 4, 12, 12, 5, 5]


def test_scaling_keeps_the_fraction_alive():
    assert [scaled_nodes(n, 12, 32) for n in (2, 6, 12)] == [5, 16, 32]
    assert scaled_nodes(9, 10, 32) == 29
    with pytest.raises(ConfigError):
        trace_from_rows("t", [(0, 3), (10, 5)], requested=4)


def test_a_cycled_pool_repeats_its_trace_and_an_offset_shifts_it():
    trace = trace_from_rows("t", [(0, 2), (40, 1), (100, 1)], requested=2)     # 100 s long
    pool = PoolTrace(pool="H100", nodes=4, trace=trace)
    assert pool.change_times(250) == [40, 100, 140, 200, 240]
    assert [pool.nodes_at(t) for t in (0, 50, 100, 150, 205)] == [4, 2, 4, 2, 4]
    shifted = PoolTrace(pool="H100", nodes=4, trace=trace, offset_s=30)
    assert shifted.change_times(150) == [10, 70, 110]


def test_constant_availability_loses_only_the_launch():
    timeline, out = replay([(0, 2)])
    assert not timeline.events
    launch = PLANNING_S + PHASES.restart_s + BATCH / (2 * PER_NODE)        # plan, start, one warm-up step
    for name in ("ours", "checkpoint_restart", "no_replan"):
        assert out["summary"][name]["goodput"] == pytest.approx(1 - launch / 1000.0)
        assert out["summary"][name]["lost_steps"] == 0


def test_one_removal_without_notice():
    t_loss = 500.7
    _, out = replay([(0, 2), (t_loss, 1)])
    fast, slow = 2 * PER_NODE, PER_NODE
    up = PLANNING_S + PHASES.restart_s + BATCH / fast
    ideal = fast * t_loss + slow * (1000 - t_loss)
    assert out["ideal_samples"] == pytest.approx(ideal)
    # ours: whole steps until the loss, the step in flight lost; then detect, plan, restart, restore, warm-up
    steps = math.floor((t_loss - up) / (BATCH / fast))
    back = t_loss + PHASES.detect_s + PLANNING_S + PHASES.restart_s + LOCAL_S + BATCH / slow
    ours = out["summary"]["ours"]
    assert ours["lost_steps"] == 1
    assert ours["goodput"] == pytest.approx((steps * BATCH + slow * (1000 - back)) / ideal)
    rec = [r for r in out["ledgers"]["ours"].records if r["event"] == 0][0]
    assert rec["phases_s"]["restore_s"] == pytest.approx(LOCAL_S) and rec["phases_s"]["detect_s"] == 3.0
    # checkpoint-restart: back to the newest uploaded checkpoint (every 100 s, durable 4 s later)
    durable = math.floor((t_loss - up - UPLOAD_S) / 100.0)
    saved = math.floor(durable * 100.0 / (BATCH / fast))
    back_cloud = t_loss + PHASES.detect_s + PLANNING_S + PHASES.restart_s + CLOUD_S + BATCH / slow
    ckpt = out["summary"]["checkpoint_restart"]
    assert ckpt["lost_steps"] == steps - saved + 1
    assert ckpt["goodput"] == pytest.approx((saved * BATCH + slow * (1000 - back_cloud)) / ideal)
    # no re-planning: its plan needs both nodes, so it waits for the rest of the replay
    none = out["summary"]["no_replan"]
    assert none["goodput"] == pytest.approx(steps * BATCH / ideal)
    assert none["wait_s"] == pytest.approx(1000 - t_loss)


def test_a_notice_turns_the_loss_into_a_planned_switch():
    t_loss, notice = 500.7, 120.0
    _, out = replay([(0, 2), (t_loss, 1)], notice_s=notice)
    fast, slow = 2 * PER_NODE, PER_NODE
    up = PLANNING_S + PHASES.restart_s + BATCH / fast
    act = t_loss - notice
    back = act + PLANNING_S + PHASES.restart_s + LOCAL_S + BATCH / slow
    ours = out["summary"]["ours"]
    assert ours["lost_steps"] == 0
    assert ours["committed_samples"] == pytest.approx(fast * (act - up) + slow * (1000 - back), abs=1)


def test_the_plan_cache_charges_a_state_once():
    rows = [(0, 2), (300.7, 1), (600.7, 2)]
    _, plain = replay(rows)
    _, cached = replay(rows, plan_cache=True)
    assert plain["ledgers"]["ours"].planning_charged_s == pytest.approx(3 * PLANNING_S)
    assert cached["ledgers"]["ours"].planning_charged_s == pytest.approx(2 * PLANNING_S)
    gained = cached["ledgers"]["ours"].committed_samples - plain["ledgers"]["ours"].committed_samples
    assert gained == pytest.approx(PLANNING_S * 2 * PER_NODE)
    # no-replan resumes on the join without planning: its plan's two nodes are back
    none = plain["ledgers"]["no_replan"]
    assert none.wait_s == pytest.approx(600.7 - 300.7) and none.records[-1]["action"] == "resume"


def test_a_removal_of_idle_nodes_interrupts_nobody():
    idle = PoolTrace(pool="H20", nodes=2, trace=trace_from_rows("u", [(0, 2), (400.3, 1)], requested=2),
                     cycle=False)
    timeline, out = replay([(0, 2)], extra_pool=idle)
    assert len(timeline.events) == 1
    for name in ("ours", "checkpoint_restart"):
        assert out["summary"][name]["lost_steps"] == 0
        assert out["summary"][name]["replans"] == 1          # the launch only


def test_systems_share_one_interface():
    assert {cls.name for cls in (Ours, CheckpointRestart, NoReplan)} == {"ours", "checkpoint_restart", "no_replan"}


def test_saved_plans_answer_only_the_same_request(tmp_path):
    cache = PlanCache(fake_planner)
    for state in [(2,), (1,)]:
        cache.get(state)
    path = str(tmp_path / "plans.json")
    cache.save(path, {"model": "m", "global_batch": BATCH})
    again = PlanCache(lambda state: pytest.fail(f"planned {state} again"))
    again.load(path, {"model": "m", "global_batch": BATCH})
    assert again.get((1,)) == cache.get((1,)) and again.get((2,)) == cache.get((2,))
    with pytest.raises(ConfigError, match="holds plans for"):
        PlanCache(fake_planner).load(path, {"model": "m", "global_batch": 2 * BATCH})


def test_checkpoint_restart_can_ignore_joins():
    rows = [(0, 2), (300.7, 1), (600.7, 2)]
    _, every = replay(rows, join_policy="restart_unsaved")
    _, losses_only = replay(rows)                         # the default: joins wait for the next restart
    assert every["summary"]["checkpoint_restart"]["replans"] == 3
    assert losses_only["summary"]["checkpoint_restart"]["replans"] == 2
    # after the loss it keeps the one-node plan to the end: everything after its restart counts (a normal end)
    fast, slow = 2 * PER_NODE, PER_NODE
    up = PLANNING_S + PHASES.restart_s + BATCH / fast
    saved = math.floor(math.floor((300.7 - up - UPLOAD_S) / 100.0) * 100.0 / (BATCH / fast))
    back = 300.7 + PHASES.detect_s + PLANNING_S + PHASES.restart_s + CLOUD_S + BATCH / slow
    assert losses_only["summary"]["checkpoint_restart"]["committed_samples"] == pytest.approx(
        saved * BATCH + slow * (1000 - back), abs=1)


def test_phases_from_an_emulated_replay_take_its_medians(tmp_path):
    import json

    from autohet_ray import ConfigError
    from autohet_ray.replay.phases import DEFAULT_PHASES, phases_from_emulated_replay
    phases = [{"kind": "join", "detect_s": 0.0, "restart_s": 4.0}, {"kind": "recovery", "detect_s": 3.5, "restart_s": 9.0},
              {"kind": "recovery", "detect_s": 2.5, "restart_s": 7.0}, {"kind": "notice", "detect_s": 0.0, "restart_s": 5.0}]
    path = tmp_path / "emulated.json"
    path.write_text("log line\n" + json.dumps({"phases": phases}) + "\n")
    model = phases_from_emulated_replay(str(path))
    assert (model.detect_s, model.restart_s) == (3.0, 8.0)          # recoveries' detect; the dearest kind's restart
    assert model.local_Bps == DEFAULT_PHASES.local_Bps and "measured" in model.basis["restart_s"]
    path.write_text(json.dumps({"goodput": 1.0}))
    with pytest.raises(ConfigError, match="not a spot_replay_emulated.py result"):
        phases_from_emulated_replay(str(path))
