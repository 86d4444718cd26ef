"""The fluid lower bound (planner/bounds/bound.py) is valid: never above the exhaustive optimum on small instances."""
import math
from dataclasses import replace

import pytest

from autohet_ray import ConfigError
from autohet_ray.cluster import cluster_from_dict
from autohet_ray.model import PRESETS
from autohet_ray.planner.bounds.bound import lower_bound_iteration_s
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


# (nodes, model, layers, seq_len, batch): memory-tight mixes where recomputation changes the optimum
RECOMPUTE_CASES = [
    ((("A100-40GB", 1), ("V100", 2)), "llama-7b", 8, 8192, 4),       # recomputing one stage is faster
    ((("A10", 2), ("V100", 1)), "gpt3-2.7b", 6, 65536, 4),           # nothing fits without it
    ((("A100-40GB", 1), ("V100", 2)), "llama-7b", 8, 40960, 4),      # nothing fits without it; the bound falls
]


@pytest.mark.parametrize("nodes, name, layers, seq, batch", RECOMPUTE_CASES)
def test_bound_with_recomputation_never_above_exhaustive_optimum(nodes, name, layers, seq, batch):
    cluster, model = _cluster(*nodes), replace(PRESETS[name], num_layers=layers, max_seq_len=seq)
    profile = analytic_profile(model, cluster, seq, micro_batches=(1, 2))
    bound = {rc: lower_bound_iteration_s(cluster=cluster, model=model, profile=profile, global_batch=batch,
                                         seq_len=seq, schedules=("1f1b",), recompute=rc) for rc in ("none", "auto")}
    best = {rc: exhaustive_best(cluster, model, profile, batch, seq, [1, 2], schedules=("1f1b",),
                                mixed_micro_batches=True, recompute=rc) for rc in ("none", "auto")}
    plan, ev = best["auto"]
    assert any(s.recompute for p in plan.pipelines for s in p.stages)       # the case needs recomputation
    assert best["none"] is None or best["none"][1].iteration_time_s > ev.iteration_time_s
    assert 0 < bound["auto"] <= bound["none"] * (1 + 1e-6)       # more options: no higher bound (to LP precision)
    assert bound["auto"] <= ev.iteration_time_s
    assert ev.iteration_time_s / bound["auto"] < 2.0


@pytest.mark.cli
def test_plan_json_bounds_a_recomputing_plan_and_prices_its_gain(tmp_path, capsys):
    """`autohet plan --recompute auto` on a mix that fits llama-13b only with recomputation: the JSON carries a
    bound below the plan (it was null for recomputing plans), and Whale, recomputing too, is the reference."""
    import json
    from autohet_ray import cli
    v100_16 = {"bf16_tflops": 125, "fp32_tflops": 15.7, "memory_gb": 16, "hbm_gbps": 900, "link_gbps": 300,
               "link_kind": "nvlink", "nic_gbps": 100}
    path = tmp_path / "mix.yaml"
    path.write_text(json.dumps({"name": "mix", "devices": {"V100-16GB": v100_16}, "network": {"inter_node_gbps": 100},
                                "nodes": [{"name": "v0", "device": "V100-16GB", "count": 8},
                                          {"name": "a0", "device": "A100-40GB", "count": 4}]}))
    assert cli.main(["plan", "--cluster", str(path), "--model", "llama-13b", "--global-batch", "64",
                     "--recompute", "auto", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert any(s.get("recompute") for p in report["plan"]["pipelines"] for s in p["stages"])
    assert 0 < report["lower_bound_iteration_s"] <= report["predicted"]["iteration_time_s"]
    assert report["strongest_baseline"] == "whale" and report["gains"]["whale"] >= 1.0
