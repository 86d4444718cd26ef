"""Activation recomputation: the cost model prices it (only layer inputs kept, one more forward per backward),
plans record it per stage, `autohet plan --recompute auto` fits a model on a V100-16GB + A100-40GB mix that
`none` cannot, keeping it only on stages that need it, and the stage module applies it (fewer saved tensors,
same numbers)."""
from __future__ import annotations

import json

import pytest
import torch

from autohet_ray import ConfigError, cli
from autohet_ray.cluster.spec import cluster_from_dict
from autohet_ray.cost.evaluate import evaluate_plan
from autohet_ray.cost.terms import GroupCostTable
from autohet_ray.model.spec import PRESETS
from autohet_ray.nn.model import StageModel
from autohet_ray.plan.schema import plan_from_dict, plan_from_json
from autohet_ray.planner import plan_training
from autohet_ray.profile.analytic import analytic_profile

V100_16 = {"bf16_tflops": 125, "fp32_tflops": 15.7, "memory_gb": 16, "hbm_gbps": 900, "link_gbps": 300,
           "link_kind": "nvlink", "nic_gbps": 100}


def _cluster_yaml(tmp_path, v100s: int) -> str:
    path = tmp_path / "mix.yaml"
    path.write_text(json.dumps({"name": "v100-16-a100-40", "devices": {"V100-16GB": V100_16},
                                "nodes": [{"name": "v0", "device": "V100-16GB", "count": v100s},
                                          {"name": "a0", "device": "A100-40GB", "count": 4}],
                                "network": {"inter_node_gbps": 100}}))
    return str(path)


def _table(recompute: bool) -> GroupCostTable:
    model = PRESETS["llama-7b"]
    cluster = cluster_from_dict({"name": "a", "nodes": [{"name": "a0", "device": "A100-40GB", "count": 4}]})
    return GroupCostTable(model=model, cluster=cluster, profile=analytic_profile(model, cluster, 2048),
                          micro_batch=2, seq_len=2048, recompute=recompute)


def test_cost_model_keeps_layer_inputs_and_adds_a_forward():
    plain, again = _table(False).get("A100-40GB", 2), _table(True).get("A100-40GB", 2)
    model = PRESETS["llama-7b"]
    assert again.layer_act_bytes == 2 * 2048 * model.hidden * 2      # bf16 hidden state per token, 2 samples
    assert again.layer_act_bytes < plain.layer_act_bytes / 5
    assert again.recompute_bytes == plain.layer_act_bytes             # one layer rebuilt at a time
    f0, b0, w0 = plain.stage_split(8, False, False)
    f1, b1, w1 = again.stage_split(8, False, False)
    assert f1 == pytest.approx(f0) and w1 == pytest.approx(w0)
    assert b1 == pytest.approx(b0 + f0)                               # the input-gradient backward redoes F
    in_flight = 4
    assert again.stage_memory(8, False, False, in_flight) == pytest.approx(
        plain.stage_memory(8, False, False, in_flight)
        - in_flight * 8 * (plain.layer_act_bytes - again.layer_act_bytes) + plain.layer_act_bytes, abs=8)


@pytest.mark.cli
def test_auto_fits_what_none_cannot(tmp_path, capsys):
    cluster = _cluster_yaml(tmp_path, v100s=8)
    args = ["plan", "--cluster", cluster, "--model", "llama-13b", "--global-batch", "64", "--json"]
    assert cli.main(args + ["--recompute", "none"]) == 2
    assert "fits nowhere" in capsys.readouterr().err
    out = tmp_path / "plan.json"
    assert cli.main(args + ["--recompute", "auto", "--out", str(out)]) == 0
    capsys.readouterr()
    plan = plan_from_json(out.read_text())
    flags = [s.recompute for p in plan.pipelines for s in p.stages]
    assert any(flags)
    spec, mix = PRESETS["llama-13b"], cli_cluster(cluster)
    profile = analytic_profile(spec, mix, plan.seq_len, (plan.micro_batch,))
    assert evaluate_plan(plan, mix, spec, profile).feasible
    assert not evaluate_plan(plan.with_recompute(False), mix, spec, profile).feasible
    # auto keeps recomputation only where a stage needs it: turning any one off runs out of memory
    for k, p in enumerate(plan.pipelines):
        for j, stage in enumerate(p.stages):
            if stage.recompute:
                off = [list(f) for f in plan.recompute_flags()]
                off[k][j] = False
                assert not evaluate_plan(plan.with_recompute(off), mix, spec, profile).feasible


def cli_cluster(path: str):
    from autohet_ray.cluster.spec import load_cluster
    return load_cluster(path)


def test_auto_equals_none_where_none_fits_and_full_recomputes_everywhere():
    spec = PRESETS["gpt3-1.3b"]
    cluster = cluster_from_dict({"name": "a", "nodes": [{"name": "a0", "device": "A100-40GB", "count": 4}]})
    profile = analytic_profile(spec, cluster, 2048)
    request = dict(cluster=cluster, model=spec, profile=profile, global_batch=16, seq_len=2048, time_limit_s=20)
    none, auto, full = (plan_training(**request, recompute=m) for m in ("none", "auto", "full"))
    assert not any(s.recompute for p in auto.plan.pipelines for s in p.stages)
    assert auto.evaluation.iteration_time_s == pytest.approx(none.evaluation.iteration_time_s)
    assert all(s.recompute for p in full.plan.pipelines for s in p.stages)
    assert full.evaluation.iteration_time_s > none.evaluation.iteration_time_s
    with pytest.raises(ConfigError, match="recompute='sometimes'"):
        plan_training(**request, recompute="sometimes")


def test_plan_json_records_recompute_and_old_plans_load_without_it():
    raw = {"schema_version": 3, "model": "tiny-gpt", "global_batch": 2, "micro_batch": 1, "seq_len": 8,
           "pipelines": [{"num_microbatches": 2, "stages": [
               {"layers": [0, 2], "tp": 1, "device_type": "cpu", "node": "n", "devices": [0]},
               {"layers": [2, 4], "tp": 1, "device_type": "cpu", "node": "n", "devices": [1], "recompute": True}]}]}
    plan = plan_from_dict(raw)
    assert plan.recompute_flags() == ((False, True),)
    again = plan_from_json(plan.to_json())
    assert again.recompute_flags() == ((False, True),)
    assert "recompute" not in again.to_dict()["pipelines"][0]["stages"][0]       # old readers see no change
    raw["pipelines"][0]["stages"][1]["recompute"] = "yes"
    with pytest.raises(ConfigError, match="recompute='yes'"):
        plan_from_dict(raw)


def _saved_tensors(model: StageModel, ids: torch.Tensor) -> tuple[int, torch.Tensor, dict]:
    count = [0]

    def pack(t):
        count[0] += 1
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(ids).float().logsumexp(-1).mean()
    saved = count[0]
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    return saved, loss.detach(), grads


def test_stage_model_checkpoints_each_block():
    torch.manual_seed(0)
    model = StageModel(PRESETS["tiny-llama"], layers=(0, PRESETS["tiny-llama"].num_layers), first=True, last=True)
    ids = torch.randint(0, PRESETS["tiny-llama"].vocab_size, (2, 8))
    saved_plain, loss_plain, grads_plain = _saved_tensors(model, ids)
    model.recompute = True
    saved_re, loss_re, grads_re = _saved_tensors(model, ids)
    assert saved_re < saved_plain / 2
    assert torch.equal(loss_re, loss_plain)
    for name, g in grads_plain.items():
        torch.testing.assert_close(grads_re[name], g, rtol=1e-6, atol=1e-7)
