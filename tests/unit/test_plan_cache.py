"""The controller plans each availability state once: a state it has planned before (the same live nodes and
GPUs, e.g. after a lost node's replacement joins) reuses that plan instead of paying the planner again; a new
state is planned. Elastic jobs plan the states one node loss away in the background (planning ahead)."""
from __future__ import annotations

import threading

from autohet_ray.cluster.spec import cluster_from_dict
from autohet_ray.model.spec import load_model
from autohet_ray.orchestrate.controller import Controller
from autohet_ray.cluster.live import Discovered, LiveNode
from autohet_ray.job.config import TrainJob
from autohet_ray.job.foresight import one_loss_states
from autohet_ray.job.plan_ahead import start_planning_ahead
from autohet_ray.plan.schema import plan_from_dict
from autohet_ray.profile.analytic import analytic_profile

NODES = {"name": "three-node", "nodes": [{"name": "a", "device": "H800", "count": 1},
                                          {"name": "b", "device": "H800", "count": 1},
                                          {"name": "c", "device": "H20", "count": 2}]}


def _found(names: list[str]) -> Discovered:
    nodes = [n for n in NODES["nodes"] if n["name"] in names]
    cluster = cluster_from_dict({"name": "live", "nodes": nodes})
    return Discovered(cluster=cluster, nodes=tuple(
        LiveNode(name=n["name"], node_id=f"id-{n['name']}", ip="127.0.0.1", device_type=n["device"],
                 num_gpus=n["count"], emulated=True) for n in nodes))


def test_a_state_planned_before_reuses_its_plan(monkeypatch):
    import autohet_ray.planner as planner
    calls = []
    real = planner.plan_training

    def counting(**request):
        calls.append(sorted(n.name for n in request["cluster"].nodes))
        return real(**request)
    monkeypatch.setattr(planner, "plan_training", counting)
    spec = load_model("tiny-gpt")
    ctl = Controller(TrainJob(model=spec.to_dict(), cluster=NODES, global_batch=4, baselines=False))
    ctl.profile = analytic_profile(spec, cluster_from_dict(NODES), spec.max_seq_len)
    plans = []
    for alive in (["a", "b", "c"], ["a", "c"], ["a", "b", "c"], ["a", "c"], ["b", "c"]):
        ctl.found = _found(alive)
        ctl.plan = plans[-1] if plans else None
        plans.append(ctl._choose_plan(None))
    assert calls == [["a", "b", "c"], ["a", "c"]]     # each state planned once; b+c is a+c renamed (a, b: 1 H800)
    assert plans[2].to_dict() == plans[0].to_dict() and plans[3].to_dict() == plans[1].to_dict()
    assert all(s.node != "b" for p in plans[1].pipelines for s in p.stages)
    renamed = [(s.node if s.node != "a" else "b", s.layers, s.tp) for p in plans[1].pipelines for s in p.stages]
    assert [(s.node, s.layers, s.tp) for p in plans[4].pipelines for s in p.stages] == renamed
    assert ctl.plan_source == "cached" and "b" in {s.node for p in plans[4].pipelines for s in p.stages}


def _controller(names: list[str]) -> Controller:
    spec = load_model("tiny-gpt")
    ctl = Controller(TrainJob(model=spec.to_dict(), cluster=NODES, global_batch=4, baselines=False))
    ctl.profile = analytic_profile(spec, cluster_from_dict(NODES), spec.max_seq_len)
    ctl.found = _found(names)
    return ctl


def _plan_ahead(ctl: Controller):
    """What the controller starts after each launch of an elastic job."""
    ctl.planning_ahead = start_planning_ahead(ctl.job, found=ctl.found, profile=ctl.profile,
                                              priced_model=ctl.priced_model, seq_len=ctl.priced_seq_len,
                                              cache=ctl.plan_cache)
    return ctl.planning_ahead


def test_planning_ahead_plans_each_kind_of_state_one_loss_away_as_the_planner_would(monkeypatch):
    """Losing a or b (one H800 each) gives equivalent states: one is planned, the other renamed from it."""
    import autohet_ray.planner as planner
    real, calls = planner.plan_training, []
    monkeypatch.setattr(planner, "plan_training", lambda **r: calls.append(sorted(n.name for n in r["cluster"].nodes))
                        or real(**r))
    ctl = _controller(["a", "b", "c"])
    ctl.plan = object()                                   # not the first launch
    ahead = _plan_ahead(ctl)
    assert ahead.wait(120) and ahead.errors == []
    assert sorted(calls) == [["a", "b"], ["b", "c"]]
    for alive in (["a", "c"], ["b", "c"], ["a", "b"]):
        ctl.found = _found(alive)
        chosen = ctl._choose_plan(None)
        assert ctl.plan_source == "planned ahead"
        direct = real(cluster=ctl.found.cluster, model=ctl.priced_model, profile=ctl.profile, global_batch=4,
                      seq_len=ctl.priced_seq_len, micro_batch=None, time_limit_s=ctl.job.plan_time_limit_s,
                      schedules=ctl.job.schedules(), recompute=ctl.job.recompute).plan
        assert plan_from_dict(chosen.to_dict()).pipelines == direct.pipelines
        assert {s.node for p in chosen.pipelines for s in p.stages} <= set(alive)
    assert len(calls) == 2                                 # nothing planned again
    ctl.found = _found(["a", "c"])
    ctl._choose_plan(None)
    assert ctl.plan_source == "cached"
    assert one_loss_states(_found(["a"]).cluster) == []


def test_a_recovery_waits_for_the_state_being_planned_and_stops_the_rest(monkeypatch):
    import autohet_ray.planner as planner
    real, calls = planner.plan_training, []
    started, release = threading.Event(), threading.Event()

    def slow(**request):
        calls.append(sorted(n.name for n in request["cluster"].nodes))
        started.set()
        assert release.wait(60)
        return real(**request)
    monkeypatch.setattr(planner, "plan_training", slow)
    ctl = _controller(["a", "b", "c"])
    ctl.plan = object()
    ahead = _plan_ahead(ctl)
    assert started.wait(60)
    first = calls[0]                                      # the state the thread is planning now
    ctl.found = _found(first)
    threading.Timer(0.5, release.set).start()
    ctl._choose_plan(None)                               # stops the thread, waits for its running state
    assert ctl.plan_source == "planned ahead"
    assert ahead.wait(60) and calls == [first]            # no other state was started


def test_a_state_the_thread_failed_to_plan_is_planned_by_the_recovery(monkeypatch):
    import autohet_ray.planner as planner
    real = planner.plan_training
    failing = {"on": True}

    def flaky(**request):
        if failing["on"]:
            raise RuntimeError("solver crashed")
        return real(**request)
    monkeypatch.setattr(planner, "plan_training", flaky)
    ctl = _controller(["a", "b", "c"])
    ctl.plan = object()
    ahead = _plan_ahead(ctl)
    assert ahead.wait(60) and len(ahead.errors) == 2 and "solver crashed" in ahead.errors[0]
    failing["on"] = False
    ctl.found = _found(["a", "c"])
    ctl._choose_plan(None)
    assert ctl.plan_source == "planned"
