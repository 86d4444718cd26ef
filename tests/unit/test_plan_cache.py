"""The controller plans each availability state once: a state it has planned before (the same live nodes and
GPUs, e.g. after a lost node's replacement joins) reuses that plan instead of paying the planner again; a new
state is planned."""
from __future__ import annotations

from autohet_ray.cluster.spec import cluster_from_dict
from autohet_ray.model.spec import load_model
from autohet_ray.orchestrate.controller import Controller
from autohet_ray.cluster.live import Discovered, LiveNode
from autohet_ray.job.config import TrainJob
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
    assert calls == [["a", "b", "c"], ["a", "c"], ["b", "c"]]           # each state planned once
    assert plans[2].to_dict() == plans[0].to_dict() and plans[3].to_dict() == plans[1].to_dict()
    assert all(s.node != "b" for p in plans[1].pipelines for s in p.stages)
