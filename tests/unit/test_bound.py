"""The fluid lower bound (planner/bound.py) is valid: never above the exhaustive optimum on small instances."""
import math
from dataclasses import replace

import pytest

from autohet_ray import ConfigError
from autohet_ray.cluster import cluster_from_dict
from autohet_ray.model import PRESETS
from autohet_ray.planner.bound import lower_bound_iteration_s
from autohet_ray.profile import analytic_profile
from exhaustive import exhaustive_best


def _cluster(*nodes, gbps=200):
    return cluster_from_dict({"name": "tiny", "network": {"inter_node_gbps": gbps},
                              "nodes": [{"name": f"n{i}", "device": d, "count": c} for i, (d, c) in enumerate(nodes)]})


# (nodes, model, layers, batch, micro-batch sizes, schedules): 2-3 types, 3-6 GPUs
CASES = [
    ((("H800", 2), ("H20", 1)), "gpt3-1.3b", 8, 8, (1, 2), ("1f1b",)),
    ((("H800", 2), ("H20", 1)), "gpt3-1.3b", 8, 8, (1, 2), ("zb-h1",)),
    ((("A100-40GB", 1), ("V100", 1), ("H20", 1)), "llama-13b", 6, 6, (1,), ("1f1b", "zb-h1")),  # memory binds
    ((("H100", 1), ("L40S", 2)), "bert-large", 8, 16, (1, 2, 4), ("zb-h1",)),
    ((("A100-40GB", 2), ("RTX-4090", 1)), "llama-13b", 6, 6, (1,), ("1f1b",)),                  # TP2 needed
    ((("H800", 1), ("H20", 1), ("A100-80GB", 1)), "llama-7b", 8, 8, (1, 2), ("1f1b", "zb-h1")),
    ((("H100", 2), ("A10", 2)), "gpt3-2.7b", 8, 8, (1, 2), ("1f1b",)),
    ((("A100-80GB", 1), ("H20", 2), ("L40S", 2)), "bert-large", 6, 6, (1,), ("zb-h1",)),
    ((("H200", 2), ("V100", 4)), "gpt3-1.3b", 6, 6, (1,), ("1f1b",)),
]


@pytest.mark.parametrize("nodes, name, layers, batch, mbs, schedules", CASES)
def test_bound_never_above_exhaustive_optimum(nodes, name, layers, batch, mbs, schedules):
    cluster, model = _cluster(*nodes), replace(PRESETS[name], num_layers=layers)
    profile = analytic_profile(model, cluster, model.max_seq_len, micro_batches=mbs)
    bound = lower_bound_iteration_s(cluster=cluster, model=model, profile=profile, global_batch=batch,
                                    seq_len=model.max_seq_len, schedules=schedules)
    # every pipeline may pick its own micro-batch size: the widest plan space the searcher covers
    plan, ev = exhaustive_best(cluster, model, profile, batch, model.max_seq_len, list(mbs), schedules=schedules,
                               mixed_micro_batches=True)
    print(f"{'+'.join(f'{c}x{d}' for d, c in nodes)} {name} L={layers} B={batch} {schedules}: "
          f"bound {bound:.5f} s, optimum {ev.iteration_time_s:.5f} s, gap {ev.iteration_time_s / bound - 1:.1%}")
    assert 0 < bound <= ev.iteration_time_s
    assert ev.iteration_time_s / bound < 2.0          # a bound near zero would be valid but worthless


def test_bound_grows_with_the_batch_and_falls_with_more_devices():
    model = replace(PRESETS["gpt3-1.3b"], num_layers=8)
    small, large = _cluster(("H800", 2), ("H20", 2)), _cluster(("H800", 4), ("H20", 4))
    bound = lambda cluster, batch: lower_bound_iteration_s(  # noqa: E731
        cluster=cluster, model=model, profile=analytic_profile(model, cluster, model.max_seq_len),
        global_batch=batch, seq_len=model.max_seq_len)
    assert bound(small, 64) > bound(small, 32) > 0
    assert bound(large, 64) < bound(small, 64)


def test_bound_is_infinite_when_no_device_holds_a_layer():
    cluster, model = _cluster(("V100", 1), ("A10", 1)), replace(PRESETS["llama2-70b"], num_layers=8)
    profile = analytic_profile(model, cluster, 512, micro_batches=(1,))
    assert math.isinf(lower_bound_iteration_s(cluster=cluster, model=model, profile=profile, global_batch=4,
                                              seq_len=512))


def test_bound_rejects_unknown_schedule_bad_batch_and_other_seq_len():
    cluster, model = _cluster(("H800", 1), ("H20", 1)), replace(PRESETS["gpt3-1.3b"], num_layers=8)
    profile = analytic_profile(model, cluster, model.max_seq_len, micro_batches=(1,))
    with pytest.raises(ConfigError, match="gpipe"):
        lower_bound_iteration_s(cluster=cluster, model=model, profile=profile, global_batch=4,
                                seq_len=model.max_seq_len, schedules=("gpipe",))
    with pytest.raises(ConfigError, match="seq_len"):
        lower_bound_iteration_s(cluster=cluster, model=model, profile=profile, global_batch=4, seq_len=128)
    with pytest.raises(ConfigError, match="batch"):
        lower_bound_iteration_s(cluster=cluster, model=model, profile=profile, global_batch=0,
                                seq_len=model.max_seq_len)
