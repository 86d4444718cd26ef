"""The emulation pacer (no Ray): ops last their target x time scale; overruns are counted and their excess is
taken off later ops of the step; waiting in a receive pays the debt."""
from __future__ import annotations

import pytest

from autohet_ray.cost.evaluate import evaluate_plan
from autohet_ray.model.spec import load_model
from autohet_ray.emulate.pacer import PACED_OPS, EmulationPacer, emulation_targets
from autohet_ray.plan.rankmap import build_rank_map
from autohet_ray.plan.schema import plan_from_dict
from autohet_ray.profile.analytic import analytic_profile
from ray_helpers import THREE_NODES, asymmetric_plan


def _pacer(**targets) -> EmulationPacer:
    slept = []
    pacer = EmulationPacer(targets={op: 0.0 for op in PACED_OPS} | targets, time_scale=0.5, sleep=slept.append)
    pacer.slept = slept
    return pacer


def test_pacer_stretches_and_carries_debt():
    pacer = _pacer(forward=0.04, backward=0.04)
    pacer.pace("forward", 0.0)
    assert pacer.slept == [pytest.approx(0.02)]
    pacer.pace("forward", 0.03)                         # 10 ms over its 20 ms budget
    assert pacer.debt_s == pytest.approx(0.01) and pacer.report()["overruns"] == {"forward": 1}
    pacer.pace("backward", 0.0)                         # 20 ms budget, 10 ms of debt
    assert pacer.slept[-1] == pytest.approx(0.01) and pacer.debt_s == 0
    pacer.pace("forward", 0.05)
    pacer.pace("recv_grad", 0.02)                       # waiting pays 20 of the 30 ms debt
    assert pacer.debt_s == pytest.approx(0.01)
    pacer.pace("optimizer", 0.0)
    assert pacer.debt_s == 0


def test_send_is_held_for_the_link_and_credited_to_the_sender():
    pacer = _pacer(send_activation=0.02, backward=0.04)
    pacer.pace("send_activation", 0.0)                  # the peer gets the message 10 ms later
    assert pacer.slept == [pytest.approx(0.01)]
    pacer.pace("backward", 0.0)                         # ... but the sender's schedule is not lengthened
    assert pacer.slept[-1] == pytest.approx(0.01)
    assert pacer.report()["overruns"] == {}


def test_targets_are_the_cost_model_figures():
    from autohet_ray.cluster.spec import cluster_from_dict
    cluster, spec = cluster_from_dict(THREE_NODES), load_model("tiny-gpt")
    plan = plan_from_dict(asymmetric_plan())
    profile = analytic_profile(spec, cluster, 16)
    ev = evaluate_plan(plan, cluster, spec, profile)
    targets = emulation_targets(plan, cluster, spec, profile, ev)
    assert len(targets) == 4
    assert targets[0]["forward"] + targets[0]["backward"] == pytest.approx(ev.stage_times_s[0][0])
    # a gradient goes back over the boundary as the bridge sends it (a TP funnel broadcasts on the other side)
    assert targets[2]["send_grad"] == pytest.approx(ev.back_link_times_s[0][0]) and targets[2]["send_activation"] == 0
    keys = [f"{r.node}:{r.device}" for r in build_rank_map(plan, spec.num_layers).ranks]
    # the sync is paced for what it adds after the last backward (the cost model overlaps the rest)
    assert [t["grad_sync"] for t in targets] == [pytest.approx(ev.sync_exposed_s[k]) for k in keys]
    assert all(t["grad_sync"] >= 0 for t in targets) and ev.sync_time_s > 0
    assert ev.optimizer_time_s == pytest.approx(max(t["optimizer"] for t in targets))
