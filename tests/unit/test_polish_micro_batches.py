"""polish re-orders the stages of a plan whose pipelines run micro-batches of different sizes (an incumbent the
search is seeded with may): each reordered pipeline keeps its own size, so every plan it prices is valid."""
from dataclasses import replace

from autohet_ray.cluster import cluster_from_dict
from autohet_ray.cost.evaluate import evaluate_plan
from autohet_ray.cost.terms import GroupCostTable
from autohet_ray.model import PRESETS
from autohet_ray.plan.schema import Pipeline, Plan, Stage
from autohet_ray.planner.passes.polish import polished
from autohet_ray.profile import analytic_profile


def _stage(layers, device, node, gpu):
    return Stage(layers=layers, tp=1, device_type=device, node=node, devices=(gpu,))


def test_polish_keeps_each_pipelines_micro_batch_size():
    cluster = cluster_from_dict({"name": "tiny", "network": {"inter_node_gbps": 200},
                                 "nodes": [{"name": "a", "device": "H800", "count": 2},
                                           {"name": "b", "device": "H20", "count": 2}]})
    model = replace(PRESETS["gpt3-1.3b"], num_layers=8)
    profile = analytic_profile(model, cluster, model.max_seq_len, micro_batches=(1, 2))
    # fast GPUs first: the slow-first order is faster, so polish builds and prices reordered plans
    pipes = tuple(Pipeline(num_microbatches=m, micro_batch=mb,
                           stages=(_stage((0, 6), "H800", "a", k), _stage((6, 8), "H20", "b", k)))
                  for k, (m, mb) in enumerate([(2, 2), (4, 1)]))
    plan = Plan(model=model.name, model_spec=model.to_dict(), global_batch=8, micro_batch=2,
                seq_len=model.max_seq_len, pipelines=pipes)
    ev = evaluate_plan(plan, cluster, model, profile)
    table = GroupCostTable(model=model, cluster=cluster, profile=profile, micro_batch=2, seq_len=model.max_seq_len)
    top = polished(plan, ev, table, cluster, exhaustive=True, keep=3)
    assert len(top) > 1                                  # reordered plans were priced and kept
    for cplan, cev in top:
        assert [p.micro_batch for p in cplan.pipelines] == [2, 1]
        assert evaluate_plan(cplan, cluster, model, profile).iteration_time_s == cev.iteration_time_s
    assert top[0][1].iteration_time_s <= ev.iteration_time_s
