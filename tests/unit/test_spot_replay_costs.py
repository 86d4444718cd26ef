"""Issue 34's replay figures against hand-computed cases: checkpoint-restart's join policies, the snapshot
overhead, plan-ahead, and USD per million tokens (a fake planner: samples/s proportional to pool 0's nodes)."""
import math
from dataclasses import replace

import pytest

from autohet_ray.replay.figures import capped_planning_row, cost_figures, snapshot_sweep
from autohet_ray.replay.phases import PhaseModel
from autohet_ray.replay.planning import PlanCache, PlannedState
from autohet_ray.cost.money import Instance, Price, Prices
from autohet_ray.replay.run import run_systems
from autohet_ray.replay.systems import ReplayConfig
from autohet_ray.replay.timeline import build_timeline
from autohet_ray.replay.traces import PoolTrace, trace_from_rows

BATCH, PER_NODE, PLANNING_S, BYTES = 10, 10.0, 2.0, 4e9
PHASES = PhaseModel(detect_s=3.0, restart_s=5.0, local_Bps=1e9, cloud_Bps=0.5e9, cloud_upload_Bps=1e9,
                    warmup_iterations=1.0, switch_s=1.5)
LOCAL_S, CLOUD_S, UPLOAD_S = BYTES / 1e9, BYTES / 0.5e9, BYTES / 1e9
SLOW, FAST = PER_NODE, 2 * PER_NODE
JOIN = [(0, 1), (500.7, 2)]          # one node, a second one joins at 500.7 s; no loss at all


def fake_planner(state):
    rate = PER_NODE * state[0]
    return PlannedState(state=state, samples_per_s=rate, iteration_time_s=BATCH / rate if rate else math.inf,
                        nodes_used=(state[0],), bytes_per_node=BYTES, planning_s=PLANNING_S)


def replay(rows, window=1000.0, **config):
    pools = [PoolTrace(pool="H100", nodes=2, trace=trace_from_rows("t", rows, requested=2), cycle=False)]
    timeline = build_timeline(pools, window)
    cfg = ReplayConfig(global_batch=BATCH, phases=PHASES, **({"checkpoint_every_s": 100.0} | config))
    plans = PlanCache(fake_planner)
    return timeline, plans, cfg, run_systems(timeline, plans, cfg)


def launch_s(rate):
    return PLANNING_S + PHASES.restart_s + BATCH / rate


def test_a_join_alone_costs_the_corrected_baseline_nothing():
    _, _, _, out = replay(JOIN)                          # default join policy: the job keeps its one-node plan
    ckpt = out["summary"]["checkpoint_restart"]
    assert ckpt["lost_samples"] == 0 and ckpt["lost_steps"] == 0 and ckpt["replans"] == 1
    assert ckpt["committed_samples"] == pytest.approx(SLOW * (1000 - launch_s(SLOW)), abs=1)


def test_saving_before_a_join_loses_nothing_and_pays_the_upload():
    _, _, _, out = replay(JOIN, join_policy="save_then_restart")
    ckpt = out["summary"]["checkpoint_restart"]
    assert ckpt["lost_samples"] == 0 and ckpt["lost_steps"] == 0 and ckpt["replans"] == 2
    back = 500.7 + UPLOAD_S + PLANNING_S + PHASES.restart_s + CLOUD_S + BATCH / FAST
    expected = SLOW * (500.7 - launch_s(SLOW)) + FAST * (1000 - back)
    assert ckpt["committed_samples"] == pytest.approx(expected, abs=1)
    rec = out["ledgers"]["checkpoint_restart"].records[-1]
    assert rec["save_s"] == pytest.approx(UPLOAD_S) and rec["t_s"] == pytest.approx(500.7 + UPLOAD_S, abs=0.1)


def test_the_old_unsaved_restart_on_a_join_throws_work_away():
    _, _, _, out = replay(JOIN, join_policy="restart_unsaved")
    ckpt = out["summary"]["checkpoint_restart"]
    durable = math.floor((500.7 - launch_s(SLOW) - UPLOAD_S) / 100.0)
    done = math.floor((500.7 - launch_s(SLOW)) / (BATCH / SLOW))
    saved = math.floor(durable * 100.0 / (BATCH / SLOW))
    assert ckpt["lost_steps"] == done - saved + 1
    assert ckpt["lost_samples"] == pytest.approx(SLOW * (500.7 - launch_s(SLOW)) - saved * BATCH, abs=1)


def test_ours_pays_the_snapshot_overhead_on_every_step():
    timeline, plans, cfg, out = replay([(0, 2)], snapshot_overhead=0.1)
    assert out["summary"]["ours"]["committed_samples"] == pytest.approx(FAST / 1.1 * (1000 - launch_s(FAST)), abs=1)
    sweep = snapshot_sweep(timeline, plans, cfg, (1.0, 1.2))
    assert sweep[0]["ours_goodput"] == pytest.approx(1 - launch_s(FAST) / 1000, abs=1e-4)
    assert sweep[1]["ours_goodput"] == pytest.approx((1 - launch_s(FAST) / 1000) / 1.2, abs=1e-4)


def test_plan_ahead_builds_the_joined_plan_while_the_old_one_trains():
    _, _, _, plain = replay(JOIN)
    _, _, _, ahead = replay(JOIN, plan_ahead=True)
    ready = 500.7 + PLANNING_S + PHASES.restart_s        # planned and started in the background
    back = ready + PHASES.switch_s + LOCAL_S + BATCH / FAST
    expected = SLOW * (ready - launch_s(SLOW)) + FAST * (1000 - back)
    assert ahead["summary"]["ours"]["committed_samples"] == pytest.approx(expected, abs=1)
    before = 500.7 + PLANNING_S + PHASES.restart_s + LOCAL_S + BATCH / FAST
    assert plain["summary"]["ours"]["committed_samples"] == pytest.approx(
        SLOW * (500.7 - launch_s(SLOW)) + FAST * (1000 - before), abs=1)
    assert ahead["ledgers"]["ours"].records[-1]["action"] == "prepared switch"


def test_plan_ahead_plans_a_single_node_loss_in_the_background():
    rows = [(0, 2), (500.7, 1)]
    _, _, _, plain = replay(rows)
    _, _, _, ahead = replay(rows, plan_ahead=True)
    mine, theirs = ahead["summary"]["ours"], plain["summary"]["ours"]
    assert mine["committed_samples"] == pytest.approx(theirs["committed_samples"] + SLOW * PLANNING_S, abs=1)
    assert mine["lost_steps"] == theirs["lost_steps"] == 1
    assert ahead["ledgers"]["ours"].records[-1]["phases_s"]["replan_s"] == 0.0
    assert plain["ledgers"]["ours"].records[-1]["phases_s"]["replan_s"] == PLANNING_S


def test_a_loss_before_the_background_planned_its_state_pays_the_planning():
    rows = [(0, 2), (launch_s(FAST) + 1.0, 1)]          # the background needs PLANNING_S (2 s) from the launch
    _, _, _, plain = replay(rows)
    _, _, _, ahead = replay(rows, plan_ahead=True)
    assert ahead["summary"]["ours"] == plain["summary"]["ours"]


def test_a_loss_during_the_background_build_cancels_the_switch():
    rows = [(0, 1), (500.7, 2), (503.3, 1)]          # the joined node leaves before the new plan is ready
    _, _, _, out = replay(rows, plan_ahead=True)
    actions = [r["action"] for r in out["ledgers"]["ours"].records]
    assert actions == ["switch", "prepare", "recover"]
    assert out["summary"]["ours"]["lost_steps"] == 1


def test_usd_per_million_tokens_for_the_three_systems():
    """Billed per instance: a node of 4 GPUs runs on (and pays for) the smallest instance type that holds them."""
    timeline, plans, cfg, out = replay(JOIN)
    prices = Prices(instances=(Instance(name="8x", device="H100", gpus=8, price=Price(on_demand=80.0, spot=32.0)),
                               Instance(name="16x", device="H100", gpus=16, price=Price(on_demand=1.0, spot=1.0))))
    seq_len, gpus = 100, 4
    got = cost_figures(timeline, plans, cfg, gpus_per_node=(gpus,), spot_pools=(True,), prices=prices,
                       seq_len=seq_len, ledgers=out["ledgers"])
    fleet = 32.0 * (500.7 * 1 + (1000 - 500.7) * 2) / 3600
    assert got["fleet_usd"] == pytest.approx(fleet, abs=0.01)
    ours_tokens = out["ledgers"]["ours"].committed_samples * seq_len
    assert got["usd_per_million_tokens"]["ours"] == pytest.approx(fleet / ours_tokens * 1e6, abs=1e-4)
    od_usd = 2 * 80.0 * 1000 / 3600                   # both nodes on demand, the whole window
    od_tokens = FAST * (1000 - launch_s(FAST)) * seq_len
    assert got["usd_per_million_tokens"]["on_demand_only"] == pytest.approx(od_usd / od_tokens * 1e6, abs=1e-4)


def test_plan_ahead_with_a_notice_trains_until_the_next_plan_is_ready():
    rows, notice = [(0, 2), (500.7, 1)], 120.0
    _, _, _, out = replay(rows, plan_ahead=True, notice_s=notice)
    ready = 500.7 - notice + PLANNING_S + PHASES.restart_s        # well before the node goes
    back = ready + PHASES.switch_s + LOCAL_S + BATCH / SLOW
    ours = out["summary"]["ours"]
    assert ours["lost_steps"] == 0
    assert ours["committed_samples"] == pytest.approx(FAST * (ready - launch_s(FAST)) + SLOW * (1000 - back), abs=1)


def test_plan_ahead_with_a_short_notice_acts_at_once_as_the_controller_does():
    rows, notice = [(0, 2), (500.7, 1)], 4.0                      # within the controller's margin: no build
    _, _, _, out = replay(rows, plan_ahead=True, notice_s=notice)
    act = 500.7 - notice                 # flush and re-plan at the notice: a restart (the state was planned ahead)
    back = act + PHASES.restart_s + LOCAL_S + BATCH / SLOW
    ours = out["summary"]["ours"]
    assert ours["lost_steps"] == 0 and "prepared switch" not in [r["action"] for r in out["ledgers"]["ours"].records]
    assert ours["committed_samples"] == pytest.approx(FAST * (act - launch_s(FAST)) + SLOW * (1000 - back), abs=1)


def test_plan_ahead_with_a_notice_too_short_for_the_build_acts_at_the_margin():
    from autohet_ray.cloud.notices import NOTICE_MARGIN_S
    notice = NOTICE_MARGIN_S + 5.0                                # the build (planning + restart: 7 s) ends too late
    _, _, _, out = replay([(0, 2), (500.7, 1)], plan_ahead=True, notice_s=notice)
    act = 500.7 - NOTICE_MARGIN_S
    back = act + PLANNING_S + PHASES.restart_s + LOCAL_S + BATCH / SLOW      # the build's plan is not reused
    ours = out["summary"]["ours"]
    assert ours["lost_steps"] == 0
    assert ours["committed_samples"] == pytest.approx(FAST * (act - launch_s(FAST)) + SLOW * (1000 - back), abs=1)


def test_plan_ahead_with_a_notice_long_enough_for_the_build_switches_prepared():
    from autohet_ray.cloud.notices import NOTICE_MARGIN_S
    notice = NOTICE_MARGIN_S + PLANNING_S + PHASES.restart_s + 1.0
    _, _, _, out = replay([(0, 2), (500.7, 1)], plan_ahead=True, notice_s=notice)
    ready = 500.7 - notice + PLANNING_S + PHASES.restart_s
    back = ready + PHASES.switch_s + LOCAL_S + BATCH / SLOW
    assert out["ledgers"]["ours"].records[-1]["action"] == "prepared switch"
    assert out["summary"]["ours"]["committed_samples"] == pytest.approx(
        FAST * (ready - launch_s(FAST)) + SLOW * (1000 - back), abs=1)


def test_snapshots_every_k_steps_divide_the_overhead_and_lose_back_to_the_newest():
    rows, k = [(0, 2), (500.7, 1)], 4
    _, _, _, out = replay(rows, snapshot_overhead=0.2, snapshot_every_steps=k)
    rate = FAST / (1 + 0.2 / k)
    steps = math.floor((500.7 - launch_s(FAST)) / (BATCH / rate))
    kept = steps // k * k
    assert steps != kept                                       # the case loses whole steps, not only the one in flight
    ours = out["summary"]["ours"]
    assert ours["lost_steps"] == steps - kept + 1
    back = 500.7 + PHASES.detect_s + PLANNING_S + PHASES.restart_s + LOCAL_S + BATCH / SLOW
    assert ours["committed_samples"] == pytest.approx(kept * BATCH + SLOW / (1 + 0.2 / k) * (1000 - back), abs=1)


def test_held_node_billing_counts_only_the_nodes_a_plan_holds():
    idle = PoolTrace(pool="H20", nodes=3, trace=None)              # on demand, never used by the fake plans
    pools = [PoolTrace(pool="H100", nodes=2, trace=trace_from_rows("t", JOIN, requested=2), cycle=False), idle]
    timeline = build_timeline(pools, 1000.0)
    cfg = ReplayConfig(global_batch=BATCH, phases=PHASES, checkpoint_every_s=100.0)
    plans = PlanCache(lambda s: replace(fake_planner(s[:1]), state=s, nodes_used=(s[0], 0)))
    out = run_systems(timeline, plans, cfg)
    prices = Prices.of_gpus({"H100": Price(on_demand=10.0, spot=4.0), "H20": Price(on_demand=3.0, spot=1.0)})
    got = cost_figures(timeline, plans, cfg, gpus_per_node=(8, 8), spot_pools=(True, False), prices=prices,
                       seq_len=100, ledgers=out["ledgers"])
    switch = 500.7                                                  # ours holds 1 node, then 2 from the join on
    assert got["held_usd"]["ours"] == pytest.approx(8 * 4.0 * (switch + 2 * (1000 - switch)) / 3600, abs=0.01)
    assert got["held_usd"]["checkpoint_restart"] == pytest.approx(8 * 4.0 * 1000 / 3600, abs=0.01)
    assert got["held_usd"]["on_demand_only"] == pytest.approx(2 * 8 * 10.0 * 1000 / 3600, abs=0.01)
    assert got["fleet_usd"] > got["held_usd"]["ours"] + 3 * 8 * 3.0 * 1000 / 3600 - 0.01   # the idle H20s


def test_capped_planning_charges_at_most_the_cap():
    timeline, plans, cfg, out = replay([(0, 2)])
    row = capped_planning_row(timeline, plans, cfg, cap_s=0.5)
    gained = (PLANNING_S - 0.5) * FAST / out["ideal_samples"]     # the launch plans once, 1.5 s sooner
    assert row["ours_goodput"] == pytest.approx(out["summary"]["ours"]["goodput"] + gained, abs=1e-4)


def test_each_plan_pays_the_snapshot_overhead_of_its_own_rate():
    """Priced per plan: overhead = per_gb_s x the busiest GPU's GB per second of step (here 1 GB per step at
    0.5 s on two nodes: 2 GB/s, x1.10), the same as that fixed factor; a plan without the bytes is refused."""
    from autohet_ray.replay.systems import Ours, snapshot_overhead
    pools = [PoolTrace(pool="H100", nodes=2, trace=trace_from_rows("t", [(0, 2)], requested=2), cycle=False)]
    timeline = build_timeline(pools, 1000.0)
    plans = PlanCache(lambda s: replace(fake_planner(s), snapshot_bytes_per_gpu=1e9))
    per_plan = ReplayConfig(global_batch=BATCH, phases=PHASES, snapshot_overhead_per_gb_s=0.05)
    fixed = ReplayConfig(global_batch=BATCH, phases=PHASES, snapshot_overhead=0.10)
    assert snapshot_overhead(plans.get((2,)), per_plan) == pytest.approx(0.10)
    assert Ours(timeline, plans, per_plan).replay().committed_samples == pytest.approx(
        Ours(timeline, plans, fixed).replay().committed_samples)
    assert snapshot_overhead(plans.get((1,)), per_plan) == pytest.approx(0.05)     # 1 GB per 1 s step
    with pytest.raises(AssertionError, match="no snapshot bytes"):
        snapshot_overhead(fake_planner((2,)), per_plan)
