"""Measured profiles: the DB `autohet profile --local` writes loads and the planner accepts it."""
from __future__ import annotations

import pytest

from autohet_ray import ConfigError
from autohet_ray.cli import main
from autohet_ray.cluster.spec import cluster_from_dict
from autohet_ray.model.spec import load_model
from autohet_ray.planner import plan_with_baselines
from autohet_ray.profile.db import load_profile
from autohet_ray.profile.measure import measure_profile, parse_ints

CPU_DEVICE = {"bf16_tflops": 1, "fp32_tflops": 1, "memory_gb": 16, "hbm_gbps": 20, "link_gbps": 10,
              "link_kind": "pcie", "nic_gbps": 10}


@pytest.mark.dist
def test_measure_profile_entries_are_positive():
    db = measure_profile(load_model("tiny-gpt"), "CPU", (1, 2), (1,), 16)
    assert db.kind == "measured" and set(db.entries) == {("CPU", 1, 1), ("CPU", 2, 1)}
    for layers in db.entries.values():
        for kind in ("embedding", "layer", "head"):
            p = layers[kind]
            assert p.fwd_s > 0 and p.bwd_s > 0 and p.param_bytes > 0 and p.activation_bytes > 0
    # a TP2 shard holds about half the layer's weights
    one, two = db.entries[("CPU", 1, 1)]["layer"], db.entries[("CPU", 2, 1)]["layer"]
    assert two.param_bytes < 0.7 * one.param_bytes
    assert db.meta["versions"]["torch"]


@pytest.mark.dist
def test_cli_profile_local_feeds_the_planner(tmp_path, capsys):
    out = tmp_path / "prof.json"
    assert main(["profile", "--local", "--model", "tiny-gpt", "--out", str(out), "--tp", "1,2",
                 "--micro-batch", "1,2", "--device-type", "CPU", "--ranks", "2"]) == 0
    printed = capsys.readouterr().out
    assert "measured" in printed and "tp=1 compute: in situ: the runtime's stage of 4 layers on 2 gloo ranks" in printed
    db = load_profile(str(out))
    assert db.kind == "measured" and len(db.entries) == 4 and db.optimizer_s_per_param["CPU"] > 0
    # this 2-core host runs a 2-rank gloo group: every entry's compute is timed in situ on both cores at once,
    # and the TP entries carry their collectives, measured
    assert set(db.meta["compute"]) == {"1", "2"} and all("2 gloo ranks" in v for v in db.meta["compute"].values())
    assert db.meta["tp_collectives"] == {"2": "measured in 1 2-rank gloo group(s)"}
    assert db.meta["update"].startswith("in situ: every rank updating at once")
    for (_, tp, _), layers in db.entries.items():
        assert (layers["layer"].tp_comm_fwd_s is None) == (tp == 1)
        assert all(p.fwd_s > 0 and p.bwd_s > 0 for p in layers.values())
    cluster = cluster_from_dict({"name": "local", "nodes": [{"name": "n0", "device": "CPU", "count": 2}],
                                 "devices": {"CPU": CPU_DEVICE}})
    result, baselines = plan_with_baselines(cluster=cluster, model=load_model("tiny-gpt"), profile=db,
                                            global_batch=4, seq_len=16, time_limit_s=10)
    assert result.plan.num_devices == 2 and result.plan.predicted.profile_kind == "measured"
    assert baselines["megatron"].plan is not None


def test_bad_lists_are_config_errors():
    with pytest.raises(ConfigError, match="--tp"):
        parse_ints("1,x", "--tp")
    with pytest.raises(ConfigError, match="TP degree 3"):
        measure_profile(load_model("tiny-gpt"), "CPU", (3,), (1,), 16)


@pytest.mark.dist
def test_the_measured_optimizer_rate_prices_the_update(tmp_path):
    """The update's rate (the engine's norm + clip + AdamW, timed on a stage's worth of layers) survives a profile's save and
    load, the cost model prices a stage's update as its parameters times that rate, and `autohet profile
    --local` records it."""
    from autohet_ray.cost.terms import GroupCostTable
    from autohet_ray.runtime.update_rate import timed_layers, update_s_per_param
    spec = load_model("tiny-gpt")
    db = measure_profile(spec, "CPU", (1,), (1,), 16)
    rate = db.optimizer_s_per_param["CPU"] = update_s_per_param(spec, "cpu")
    assert 1e-11 < rate < 1e-6                      # seconds per parameter on a CPU core
    assert timed_layers(spec) == min(4, spec.num_layers)
    assert timed_layers(load_model("small-gpt")) == 4 and timed_layers(load_model("gpt3-1.3b")) == 1  # 50 M a layer
    db.save(str(tmp_path / "p.json"))
    assert load_profile(str(tmp_path / "p.json")).optimizer_s_per_param == {"CPU": rate}
    cluster = cluster_from_dict({"name": "local", "nodes": [{"name": "n0", "device": "CPU", "count": 1}],
                                 "devices": {"CPU": CPU_DEVICE}})
    gc = GroupCostTable(cluster=cluster, model=spec, profile=db, micro_batch=1, seq_len=16).get("CPU", 1)
    params = gc.stage_params(spec.num_layers, True, True)
    assert gc.optimizer_s(spec.num_layers, True, True) == pytest.approx(params * rate)


@pytest.mark.dist
def test_tp_collectives_are_timed_where_the_runtime_runs_them():
    """In a real 2-rank gloo group: a block's forward and backward each run two all-reduces, the embedding's
    forward one and its backward none (runtime/tp.py), so the measured extra time lands on those and not on the
    embedding's backward."""
    import torch

    from autohet_ray.runtime.in_situ_cost import measure_in_situ
    costs, update_rate = measure_in_situ(load_model("tiny-gpt"), 2, 2, 1, 16, torch.float32, "gloo")
    assert 1e-11 < update_rate < 1e-6                       # seconds per parameter on a CPU core
    assert set(costs) == {"embedding", "layer", "head"}
    assert all(c.tp_comm_fwd_s >= 0 and c.tp_comm_bwd_s >= 0 for c in costs.values())
    layer = costs["layer"]
    assert layer.tp_comm_fwd_s > 2e-5 and layer.tp_comm_bwd_s > 2e-5   # a loopback gloo all-reduce: tens of us
    assert costs["embedding"].tp_comm_bwd_s < layer.tp_comm_bwd_s / 4


@pytest.mark.dist
def test_in_situ_compute_times_the_runtime_loss_not_torch_fused_one():
    """At TP 1 the in-situ stage is the runtime's own (runtime/parallelize.py), its loss the runtime's
    vocabulary-parallel cross-entropy: with a vocabulary 16x the hidden size the head's forward is mostly that
    loss, and it costs more than the fused torch cross-entropy profile/measure.py times alone. Two ranks at
    once; TP 1 has no collectives."""
    import torch

    from autohet_ray.model.spec import model_from_dict
    from autohet_ray.runtime.in_situ_cost import measure_in_situ
    spec = model_from_dict({"name": "wide-vocab", "family": "gpt", "num_layers": 2, "hidden": 64, "num_heads": 4,
                            "num_kv_heads": 4, "ffn_hidden": 256, "vocab_size": 8192, "max_seq_len": 64})
    isolated = measure_profile(spec, "CPU", (1,), (2,), 64).entries[("CPU", 1, 2)]
    costs, _ = measure_in_situ(spec, 1, 2, 2, 64, torch.float32, "gloo")
    assert all(c.tp_comm_fwd_s is None for c in costs.values())
    assert costs["head"].compute_fwd_s > 1.1 * isolated["head"].fwd_s



def test_a_tp_group_segment_is_its_ranks_mean_not_the_slowest():
    """Rank 0 reaches the layers' last all-reduce 2 ms before rank 1 and waits; rank 1 then spends those 2 ms
    less in the head. The sum of the per-kind means is what a step of both ranks takes; the per-kind slowest
    ranks would add the wait twice."""
    from autohet_ray.runtime.in_situ_cost import _median_of_slowest
    rep = lambda layer, head: {"embedding": (0.0, 0.0), "layer": (layer, 0.0), "head": (head, 0.0)}  # noqa: E731
    per_rank = [[rep(0.010, 0.003)] * 3, [rep(0.008, 0.005)] * 3]
    total = sum(_median_of_slowest(per_rank, 2, lambda r, k=kind: r[k][0]) for kind in ("embedding", "layer", "head"))
    assert total == pytest.approx(0.013)


def test_ranks_computing_at_once_are_priced_at_the_slowest_in_each_rep():
    """A synchronous step waits for the slower rank at every hand-off, so each rep counts its slowest rank (at
    TP 1) or its slowest TP group's mean (at TP 2). Here each rank is slow in a different rep: either rank's own
    median is 8 ms, the median over reps of the slowest is 10 ms."""
    from autohet_ray.runtime.in_situ_cost import _median_of_slowest
    per_rank = [[0.010, 0.008, 0.008, 0.010, 0.008], [0.008, 0.010, 0.010, 0.008, 0.008]]
    assert _median_of_slowest(per_rank, 1, lambda seconds: seconds) == pytest.approx(0.010)
    # two TP groups of two ranks: the slower group's mean in each rep
    groups = [[0.010, 0.004], [0.006, 0.004], [0.006, 0.009], [0.006, 0.009]]
    assert _median_of_slowest(groups, 2, lambda seconds: seconds) == pytest.approx((0.008 + 0.009) / 2)
