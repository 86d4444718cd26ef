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


class FakeClock:
    """Time that moves only when an op runs, a wait happens or the pacer sleeps."""
    def __init__(self):
        self.t = 0.0

    def sleep(self, s: float) -> None:
        assert s >= 0
        self.t += s

    def now(self) -> float:
        return self.t

    def op(self, pacer: EmulationPacer, op: str, took_s: float) -> None:
        self.t += took_s
        pacer.pace(op, took_s)


def _clocked(**targets) -> tuple[EmulationPacer, FakeClock]:
    clock = FakeClock()
    pacer = EmulationPacer(targets={op: 0.0 for op in PACED_OPS} | targets, time_scale=1.0, sleep=clock.sleep,
                           now=clock.now)
    return pacer, clock


def test_sync_window_starts_at_the_last_compute_op_so_a_flush_wait_counts():
    # the engine's order: last backward, the bridge's flush (unpaced: it waits for a slow receiver), grad_sync
    pacer, clock = _clocked(backward=0.04, grad_sync=0.10)
    clock.op(pacer, "backward", 0.01)                 # paced to 0.04
    assert clock.t == pytest.approx(0.04)
    clock.t += 0.05                                     # flush waited 50 ms
    clock.op(pacer, "grad_sync", 0.02)                # the all-reduce itself
    assert clock.t == pytest.approx(0.04 + 0.10)      # exposed sync counted once, from the backward's end
    pacer.pace("optimizer", 0.0)
    assert pacer.report()["phases"] == {"compute_end_s": pytest.approx(0.04), "sync_s": pytest.approx(0.10),
                                        "optimizer_s": pytest.approx(0.0)}


def test_a_wait_longer_than_the_exposed_sync_is_not_slept_on_and_is_an_overrun():
    pacer, clock = _clocked(backward=0.04, grad_sync=0.03)
    clock.op(pacer, "backward", 0.04)
    clock.t += 0.05                                     # flush alone outlasts the predicted exposed sync
    clock.op(pacer, "grad_sync", 0.01)
    assert clock.t == pytest.approx(0.10)
    assert pacer.report()["overruns"] == {"grad_sync": 1}


def test_sends_after_the_last_compute_op_are_not_credited_twice():
    # a middle stage: last backward, its gradient is held for the link, then the sync window
    pacer, clock = _clocked(backward=0.04, send_grad=0.03, grad_sync=0.10)
    clock.op(pacer, "backward", 0.06)                 # 20 ms over: debt the sync window pays
    clock.op(pacer, "send_grad", 0.0)                 # held 30 ms, inside the window
    clock.op(pacer, "grad_sync", 0.01)
    assert clock.t == pytest.approx(0.06 + 0.10 - 0.02)


def test_end_step_drops_the_debt_of_an_evaluation():
    pacer, clock = _clocked(forward=0.01, backward=0.04)
    clock.op(pacer, "forward", 0.05)                  # an evaluation's forward overran by 40 ms
    pacer.end_step()
    clock.op(pacer, "backward", 0.0)
    assert clock.t == pytest.approx(0.05 + 0.04)


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
