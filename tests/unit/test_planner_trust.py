"""What a user must be able to trust: the pruned baseline search is the full one, the planner reaches every
baseline without being seeded with them, the same input gives the same plan, and the rough edges are gone."""
import json
import subprocess
import sys

import pytest

from autohet_ray.cluster import cluster_from_dict, load_cluster
from autohet_ray.cost.evaluate import best_schedule
from autohet_ray.cost.terms import GroupCostTable
from autohet_ray.model import PRESETS
from autohet_ray.planner import BASELINES, best_baseline, plan_with_baselines
from autohet_ray.planner import baselines as bl
from autohet_ray.planner.candidates.floor import iteration_floor_s
from autohet_ray.planner.search import micro_batch_candidates, token_cap_sizes
from autohet_ray.profile import analytic_profile


def _cluster(*nodes, gbps=200):
    return cluster_from_dict({"name": "tiny", "network": {"inter_node_gbps": gbps},
                              "nodes": [{"name": f"n{i}", "device": d, "count": c} for i, (d, c) in enumerate(nodes)]})


def _every_layout(name, cluster, spec, profile, batch, mbs, subsets):
    """Every candidate of the baseline's rules, priced by the full cost model (no pruning)."""
    out = []
    for c in bl._candidates(name, cluster, spec, profile, batch, spec.max_seq_len, mbs, subsets, ("1f1b", "zb-h1")):
        table = GroupCostTable(model=spec, cluster=cluster, profile=profile, micro_batch=c.micro_batch,
                               seq_len=spec.max_seq_len)
        plan = bl._plan(spec, cluster, bl._grid(c.nodes, c.tp, c.pp, c.dp), c.counts, c.micro, global_batch=batch,
                        micro_batch=c.micro_batch, seq_len=spec.max_seq_len)
        out.append((c, best_schedule(plan, cluster, spec, profile, table)[1]))
    return out


@pytest.mark.parametrize("nodes, model, batch", [
    ((("H800", 4), ("H20", 4)), "gpt3-1.3b", 64),
    ((("A100-80GB", 2), ("H20", 4), ("H800", 2)), "bert-large", 128),
    ((("A100-40GB", 4), ("V100", 4)), "llama-7b", 32),
])
def test_floor_is_below_every_priced_layout_and_pruning_keeps_the_best(nodes, model, batch):
    cluster, spec = _cluster(*nodes), PRESETS[model]
    profile = analytic_profile(spec, cluster, spec.max_seq_len, micro_batches=(1, 2, 4))
    for name, (rules, subsets) in BASELINES.items():
        priced = _every_layout(rules, cluster, spec, profile, batch, [1, 2, 4], subsets)
        assert priced, name
        for c, ev in priced:
            assert c.floor_s <= ev.iteration_time_s * (1 + 1e-9) or not ev.feasible, (name, c)
        fitting = [ev.iteration_time_s for _, ev in priced if ev.feasible]
        found = best_baseline(rules, cluster=cluster, model=spec, profile=profile, global_batch=batch,
                              seq_len=spec.max_seq_len, micro_batches=[1, 2, 4], subsets=subsets)
        assert found.evaluation.iteration_time_s == pytest.approx(min(fitting), rel=1e-12), name


def test_plan_floor_is_below_its_evaluation():
    cluster, spec = _cluster(("H800", 2), ("H20", 2), ("A100-80GB", 2)), PRESETS["gpt3-1.3b"]
    profile = analytic_profile(spec, cluster, 2048, micro_batches=(1, 2))
    result, baselines = plan_with_baselines(cluster=cluster, model=spec, profile=profile, global_batch=32,
                                            seq_len=2048)
    for plan, ev in [(result.plan, result.evaluation)] + [(b.plan, b.evaluation) for b in baselines.values()]:
        floor = iteration_floor_s(plan, cluster, spec, profile)
        assert 0.5 * ev.iteration_time_s < floor <= ev.iteration_time_s * (1 + 1e-9)


@pytest.mark.parametrize("nodes, model, batch", [
    ((("H800", 2), ("H20", 2)), "gpt3-1.3b", 32),
    ((("A100-40GB", 2), ("H20", 2)), "llama-7b", 16),
    ((("H800", 1), ("A100-80GB", 1), ("H20", 2)), "bert-large", 64),
    ((("H100", 2), ("L40S", 2)), "gpt3-1.3b", 16),
    ((("A100-40GB", 4), ("V100", 4)), "bert-large", 128),
])
def test_planner_without_seeding_reaches_every_baseline(nodes, model, batch):
    cluster, spec = _cluster(*nodes), PRESETS[model]
    profile = analytic_profile(spec, cluster, spec.max_seq_len, micro_batches=(1, 2, 4))
    result, baselines = plan_with_baselines(cluster=cluster, model=spec, profile=profile, global_batch=batch,
                                            seq_len=spec.max_seq_len, seed=False)
    assert set(baselines) == {"megatron", "megatron-subset", "whale"}
    for name, b in baselines.items():
        if b.evaluation is not None:
            assert result.evaluation.iteration_time_s <= b.evaluation.iteration_time_s * 1.005, name


def test_best_subset_is_at_least_as_strong_as_all_gpus_and_says_why_none_exists():
    cluster, spec = load_cluster("jobs/clusters/paper-24.yaml"), PRESETS["llama-7b"]
    profile = analytic_profile(spec, cluster, 2048, micro_batches=(1, 2))
    # 24 GPUs, 32 layers: PP would need a factor 3, which divides no power-of-two DP and no 32 layers
    found = {n: best_baseline(r, cluster=cluster, model=spec, profile=profile, global_batch=512, seq_len=2048,
                              micro_batches=[1, 2], subsets=s) for n, (r, s) in BASELINES.items()}
    assert found["megatron"].plan is None
    assert "no uniform (TP, PP, DP) layout covers all 24 GPUs" in found["megatron"].reason
    assert "PP dividing the 32 layers" in found["megatron"].reason
    assert found["megatron-subset"].plan is not None and found["whale"].plan is not None
    used = {s.device_type for p in found["megatron-subset"].plan.pipelines for s in p.stages}
    assert sum(cluster.gpus_of(d) for d in used) < 24


def test_micro_batch_candidates_reach_the_token_cap():
    assert token_cap_sizes(512) == [1, 2, 4, 8, 16]
    assert token_cap_sizes(2048) == [1, 2, 4]
    cluster, spec = load_cluster("jobs/clusters/paper-24.yaml"), PRESETS["bert-large"]
    profile = analytic_profile(spec, cluster, 512, micro_batches=tuple(token_cap_sizes(512)) + (32,))
    assert micro_batch_candidates(768, profile, None) == [1, 2, 4, 8, 16]


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "autohet_ray.cli", *args], capture_output=True, text=True)


@pytest.mark.cli
def test_saved_profile_plans_and_json_plan_output_evaluates(tmp_path):
    cluster, spec = load_cluster("jobs/clusters/paper-24.yaml"), PRESETS["bert-large"]
    db = analytic_profile(spec, cluster, 512, micro_batches=(2, 4))
    db.links = {k: type(v)(bandwidth_Bps=v.bandwidth_Bps, latency_s=1e-05) for k, v in db.links.items()}
    db.save(str(tmp_path / "p.json"))          # json.dump writes 1e-05, which YAML 1.1 reads as a string
    assert "1e-05" in (tmp_path / "p.json").read_text()
    out = _cli("plan", "--cluster", "jobs/clusters/paper-24.yaml", "--model", "bert-large", "--global-batch", "96",
               "--profile", str(tmp_path / "p.json"), "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["hit_time_limit"] is False and doc["wall_time_s"] >= doc["solve_time_s"] > 0
    assert set(doc["baselines"]) == {"megatron", "megatron-subset", "whale"}
    assert doc["strongest_baseline"] in doc["baselines"]
    assert doc["gains"][doc["strongest_baseline"]] == min(g for g in doc["gains"].values() if g is not None)
    (tmp_path / "out.json").write_text(out.stdout)
    ev = _cli("evaluate", "--plan", str(tmp_path / "out.json"), "--cluster", "jobs/clusters/paper-24.yaml",
              "--profile", str(tmp_path / "p.json"), "--json")
    assert ev.returncode == 0, ev.stderr
    assert json.loads(ev.stdout)["predicted"]["iteration_time_s"] == pytest.approx(
        doc["predicted"]["iteration_time_s"])


@pytest.mark.cli
def test_same_input_same_plan_and_a_hit_limit_is_reported():
    runs = [_cli("plan", "--cluster", "jobs/clusters/uneven-4-4-16.yaml", "--model", "gpt3-1.3b",
                 "--global-batch", "256", "--json", "--plan-time-limit-s", limit) for limit in ("60", "60", "0.01")]
    docs = [json.loads(r.stdout) for r in runs]
    assert docs[0]["plan"] == docs[1]["plan"] and docs[0]["hit_time_limit"] is False
    assert docs[2]["hit_time_limit"] is True and docs[2]["plan"]["pipelines"]
    text = _cli("plan", "--cluster", "jobs/clusters/paper-24.yaml", "--model", "llama-7b", "--global-batch", "512")
    assert text.returncode == 0, text.stderr
    assert "Megatron-LM, all GPUs" in text.stdout and "cannot run (no uniform (TP, PP, DP)" in text.stdout
    assert "gain over the strongest baseline" in text.stdout


def test_floor_order_counts_extrapolate_exactly():
    from autohet_ray.planner.candidates.floor import _counted, _order_counts
    for schedule in ("1f1b", "zb-h1"):
        for p in range(1, 7):
            for j in range(p):
                for m in (1, p, 4 * p + 1, 4 * p + 2, 4 * p + 9, 61):
                    assert _order_counts(schedule, j, p, m) == _counted(schedule, j, p, m), (schedule, j, p, m)


def test_memory_on_the_short_schedule_equals_the_long_one():
    from autohet_ray.cost.memory import live_counts
    from autohet_ray.planner.candidates.floor import steady_microbatches
    for schedule in ("1f1b", "zb-h1"):
        for p in range(1, 7):
            for j in range(p):
                for m in (1, p, 4 * p, 4 * p + 1, 4 * p + 7, 64):
                    assert live_counts(schedule, p, j, steady_microbatches(p, m)) == live_counts(schedule, p, j, m)


def test_baselines_recompute_when_the_job_allows_it():
    """Under --recompute auto the baselines may recompute as the planner may: Megatron-LM on all GPUs of this
    V100-16GB + A100-40GB mix runs out of memory without it at 16k tokens, and fits with it, recomputing only
    on the stages that need it."""
    from dataclasses import replace
    from autohet_ray.cost.evaluate import evaluate_plan
    v100_16 = {"bf16_tflops": 125, "fp32_tflops": 15.7, "memory_gb": 16, "hbm_gbps": 900, "link_gbps": 300,
               "link_kind": "nvlink", "nic_gbps": 100}
    mix = cluster_from_dict({"name": "mix", "devices": {"V100-16GB": v100_16}, "network": {"inter_node_gbps": 100},
                             "nodes": [{"name": "v0", "device": "V100-16GB", "count": 4},
                                       {"name": "a0", "device": "A100-40GB", "count": 4}]})
    spec = replace(PRESETS["gpt3-2.7b"], max_seq_len=16384)
    profile = analytic_profile(spec, mix, 16384, micro_batches=(1,))
    request = dict(cluster=mix, model=spec, profile=profile, global_batch=16, seq_len=16384, micro_batches=[1])
    none = best_baseline("megatron", **request, recompute="none")
    assert none.plan is None and "out of memory" in none.reason and "--recompute auto" in none.reason
    auto = best_baseline("megatron", **request, recompute="auto")
    assert auto.evaluation is not None and auto.evaluation.feasible
    flags = auto.plan.recompute_flags()
    assert any(any(f) for f in flags)
    assert not evaluate_plan(auto.plan.with_recompute(False), mix, spec, profile).feasible
    for k, stage_flags in enumerate(flags):
        for j, on in enumerate(stage_flags):
            if on:              # kept only where needed: off on this stage alone, it runs out of memory
                off = [list(f) for f in flags]
                off[k][j] = False
                assert not evaluate_plan(auto.plan.with_recompute(off), mix, spec, profile).feasible
    full = best_baseline("megatron", **request, recompute="full")
    assert all(all(f) for f in full.plan.recompute_flags())
    assert full.evaluation.iteration_time_s >= auto.evaluation.iteration_time_s * (1 - 1e-9)
    # `autohet plan --recompute auto` prices its gain against it
    result, baselines = plan_with_baselines(cluster=mix, model=spec, profile=profile, global_batch=16,
                                            seq_len=16384, micro_batch=1, recompute="auto")
    assert baselines["megatron"].evaluation.iteration_time_s == pytest.approx(auto.evaluation.iteration_time_s)
    assert result.evaluation.iteration_time_s <= auto.evaluation.iteration_time_s * (1 + 1e-9)
