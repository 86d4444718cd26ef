"""A plan's price does not depend on the order its pipelines are listed in: a gradient all-reduce that spans
nodes first reduces inside each node over that node's own link (the slowest node sets the pace), whichever
pipeline comes first."""
from dataclasses import replace

import pytest

from autohet_ray.cluster import cluster_from_dict
from autohet_ray.cost.evaluate import evaluate_plan
from autohet_ray.cost.sync import gradient_sync_times
from autohet_ray.model import PRESETS
from autohet_ray.plan.schema import Pipeline, Plan, Stage
from autohet_ray.profile import analytic_profile


@pytest.mark.parametrize("shard", [False, True])
def test_price_does_not_depend_on_pipeline_order(shard):
    # V100s talk over NVLink, A10s over PCIe: the cross-node all-reduce waits for the A10 node's local reduce
    cluster = cluster_from_dict({"name": "tiny", "network": {"inter_node_gbps": 200},
                                 "nodes": [{"name": "a10", "device": "A10", "count": 2},
                                           {"name": "v100", "device": "V100-16GB", "count": 2}]})
    model = replace(PRESETS["gpt3-2.7b"], num_layers=8, max_seq_len=2048)
    profile = analytic_profile(model, cluster, 2048, micro_batches=(1,))
    pipes = [Pipeline(num_microbatches=2, stages=(Stage(layers=(0, 8), tp=1, device_type=device, node=node,
                                                        devices=(gpu,), shard_optimizer=shard),))
             for node, device in (("a10", "A10"), ("v100", "V100-16GB")) for gpu in (0, 1)]
    plans = [Plan(model=model.name, model_spec=model.to_dict(), global_batch=8, micro_batch=1, seq_len=2048,
                  pipelines=tuple(order)) for order in (pipes, pipes[::-1], pipes[1:] + pipes[:1])]
    evs = [evaluate_plan(p, cluster, model, profile) for p in plans]
    syncs = [max(gradient_sync_times(p, cluster, model, profile).values()) for p in plans]
    assert syncs[0] > 0 and syncs[0] == pytest.approx(syncs[1], rel=1e-12) == pytest.approx(syncs[2], rel=1e-12)
    assert evs[0].iteration_time_s == pytest.approx(evs[1].iteration_time_s, rel=1e-12)
    assert evs[0].iteration_time_s == pytest.approx(evs[2].iteration_time_s, rel=1e-12)
