"""The planner against exhaustive search on tiny clusters, and against its baselines."""
import json
import subprocess
import sys

import pytest

from autohet_ray import ConfigError
from autohet_ray.cluster import cluster_from_dict, load_cluster
from autohet_ray.cost import evaluate_plan
from autohet_ray.model import PRESETS
from autohet_ray.plan import validate_plan
from autohet_ray.planner import plan_with_baselines
from autohet_ray.profile import analytic_profile
from exhaustive import exhaustive_best


def _cluster(*nodes, gbps=200):
    return cluster_from_dict({"name": "tiny", "network": {"inter_node_gbps": gbps},
                              "nodes": [{"name": f"n{i}", "device": d, "count": c} for i, (d, c) in enumerate(nodes)]})




@pytest.mark.parametrize("nodes, model, batch", [
    ((("H800", 2), ("H20", 2)), "gpt3-1.3b", 32),
    ((("A100-40GB", 2), ("H20", 2)), "llama-7b", 16),
    ((("H800", 1), ("A100-80GB", 1), ("H20", 2)), "bert-large", 64),
])
def test_planner_matches_exhaustive_search(nodes, model, batch):
    cluster, spec = _cluster(*nodes), PRESETS[model]
    profile = analytic_profile(spec, cluster, spec.max_seq_len, micro_batches=(1, 2))
    result, _ = plan_with_baselines(cluster=cluster, model=spec, profile=profile, global_batch=batch,
                                    seq_len=spec.max_seq_len)
    _, best = exhaustive_best(cluster, spec, profile, batch, spec.max_seq_len, [1, 2])
    assert result.evaluation.iteration_time_s <= best.iteration_time_s * 1.01
    validate_plan(result.plan, cluster, spec)


@pytest.mark.parametrize("cluster_file", ["paper-24", "uneven-4-4-16"])
def test_plan_never_worse_than_baselines_and_prediction_is_consistent(cluster_file):
    cluster, spec = load_cluster(f"jobs/clusters/{cluster_file}.yaml"), PRESETS["bert-large"]
    profile = analytic_profile(spec, cluster, 512)
    result, baselines = plan_with_baselines(cluster=cluster, model=spec, profile=profile, global_batch=384,
                                            seq_len=512, time_limit_s=60)
    for b in baselines.values():
        assert b.evaluation is not None
        assert result.evaluation.iteration_time_s <= b.evaluation.iteration_time_s + 1e-12
        validate_plan(b.plan, cluster, spec)
    again = evaluate_plan(result.plan, cluster, spec, profile)
    assert again.iteration_time_s == pytest.approx(result.plan.predicted.iteration_time_s)
    assert again.feasible and result.plan.predicted.profile_kind == "analytic"


def test_schedule_choice_can_be_restricted_and_zero_bubble_wins_on_deep_pipelines():
    cluster, spec = load_cluster("jobs/clusters/paper-24.yaml"), PRESETS["bert-large"]
    profile = analytic_profile(spec, cluster, 512, micro_batches=(8,))
    runs = {s: plan_with_baselines(cluster=cluster, model=spec, profile=profile, global_batch=768, seq_len=512,
                                   schedules=s) for s in (("1f1b",), ("1f1b", "zb-h1"))}
    only, auto = runs[("1f1b",)], runs[("1f1b", "zb-h1")]
    assert only[0].plan.schedule == "1f1b" and all(b.plan.schedule == "1f1b" for b in only[1].values())
    # 8 copies of a 3-stage pipeline either way; zero-bubble H1 removes most of its bubble (cost model)
    for result, _ in (only, auto):
        assert [len(p.stages) for p in result.plan.pipelines] == [3] * 8
    assert auto[0].plan.schedule == "zb-h1"
    # 4.7% faster since bf16 plans price their gradient all-reduce in fp32 (6.4% with a bf16 all-reduce)
    assert auto[0].evaluation.iteration_time_s < 0.96 * only[0].evaluation.iteration_time_s
    with pytest.raises(ConfigError, match="schedule 'interleaved'; valid: 1f1b, zb-h1"):
        plan_with_baselines(cluster=cluster, model=spec, profile=profile, global_batch=768, seq_len=512,
                            schedules=("interleaved",))


def test_homogeneous_cluster_matches_megatron_or_better():
    cluster, spec = _cluster(("H800", 8), ("H800", 8)), PRESETS["gpt3-2.7b"]
    profile = analytic_profile(spec, cluster, 2048)
    result, baselines = plan_with_baselines(cluster=cluster, model=spec, profile=profile, global_batch=64,
                                            seq_len=2048)
    assert result.evaluation.iteration_time_s <= baselines["megatron"].evaluation.iteration_time_s + 1e-12


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "autohet_ray.cli", *args], capture_output=True, text=True)


@pytest.mark.parametrize("args, fragment", [
    (["plan", "--cluster", "jobs/clusters/paper-24.yaml", "--model", "gpt5", "--global-batch", "8"],
     "unknown model 'gpt5'"),
    (["plan", "--cluster", "nope.yaml", "--model", "gpt3-1.3b", "--global-batch", "8"], "does not exist"),
    (["plan", "--cluster", "jobs/clusters/paper-24.yaml", "--model", "gpt3-1.3b", "--global-batch", "10",
      "--micro-batch", "4"], "not divisible by micro-batch 4"),
    (["plan", "--cluster", "{small}", "--model", "llama2-70b", "--global-batch", "8"], "missing 1145.6 GB"),
    (["plan", "--cluster", "{bad}", "--model", "llama2-70b", "--global-batch", "8"], "not valid YAML"),
    (["plan", "--cluster", "jobs/clusters/paper-24.yaml", "--model", "gpt3-1.3b", "--global-batch", "8",
      "--seq-len", "4096"], "seq_len 4096 must lie in [1, 2048] (gpt3-1.3b's max_seq_len)"),
    (["plan", "--cluster", "jobs/clusters/paper-24.yaml", "--model", "gpt3-1.3b", "--global-batch", "8",
      "--seq-len", "1024", "--profile", "{profile}"], "made for seq_len 2048, not 1024; profile again"),
    (["plan", "--cluster", "jobs/clusters/paper-24.yaml", "--model", "llama-7b", "--global-batch", "8",
      "--profile", "{profile}"], "made for model 'gpt3-1.3b', not 'llama-7b'"),
    (["train", "--cluster", "jobs/clusters/paper-24.yaml", "--model", "small-gpt", "--global-batch", "48",
      "--steps", "1", "--micro-batch", "5", "--emulate"], "global batch 48 is not divisible by micro-batch 5"),
    (["plan", "--cluster", "jobs/clusters/paper-24.yaml", "--model", "gpt3-1.3b", "--global-batch", "8",
      "--out", "{small}/plan.json"], "small.yaml/plan.json': folder"),        # checked before planning
    (["profile", "--local", "--model", "tiny-gpt", "--out", "{tmp}"], "is a directory; give a file name"),
    (["profile", "--local", "--model", "tiny-gpt", "--out", "{tmp}/p2.json", "--ranks", "999"],
     "--ranks=999 must lie in [1, "),
])
@pytest.mark.cli
def test_cli_bad_input_is_one_line_exit_2(args, fragment, tmp_path):
    (tmp_path / "small.yaml").write_text("name: small\nnodes: [{name: a, device: A10, count: 4}]\n")
    (tmp_path / "bad.yaml").write_text("name: [\n")
    cluster, spec = load_cluster("jobs/clusters/paper-24.yaml"), PRESETS["gpt3-1.3b"]
    analytic_profile(spec, cluster, 2048, micro_batches=(1,)).save(str(tmp_path / "p.json"))
    out = _cli(*(a.format(small=tmp_path / "small.yaml", bad=tmp_path / "bad.yaml", profile=tmp_path / "p.json",
                          tmp=tmp_path) for a in args))
    assert out.returncode == 2, out.stderr
    assert fragment in out.stderr and "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


@pytest.mark.cli
def test_cli_plan_json_evaluate_and_show(tmp_path):
    plan_file = tmp_path / "plan.json"
    # 3 is not among the analytic profile's default sizes: the CLI adds an entry for the size asked for
    out = _cli("plan", "--cluster", "jobs/clusters/paper-24.yaml", "--model", "bert-large", "--global-batch",
               "96", "--micro-batch", "3", "--json", "--out", str(plan_file))
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert set(doc) >= {"plan", "predicted", "baselines", "solve_time_s"}
    assert doc["predicted"]["iteration_time_s"] <= doc["baselines"]["megatron"]["iteration_time_s"]
    ev = _cli("evaluate", "--plan", str(plan_file), "--cluster", "jobs/clusters/paper-24.yaml", "--json")
    assert ev.returncode == 0 and json.loads(ev.stdout)["feasible"] is True
    assert json.loads(ev.stdout)["predicted"]["iteration_time_s"] == pytest.approx(
        doc["predicted"]["iteration_time_s"])
    png = tmp_path / "plan.png"
    shown = _cli("show", str(plan_file), "--png", str(png))
    assert shown.returncode == 0 and png.stat().st_size > 1000 and "p0 s0" in shown.stdout


def test_slow_gpus_go_to_early_stages_when_memory_binds():
    # llama-13b on the paper's mix is memory-bound: early 1F1B stages hold the most activations, and the
    # optimizer (not a rule) puts the memory-rich, compute-poor H20 first and the fast H800 last
    cluster, spec = load_cluster("jobs/clusters/paper-24.yaml"), PRESETS["llama-13b"]
    profile = analytic_profile(spec, cluster, 2048, micro_batches=(2,))
    result, _ = plan_with_baselines(cluster=cluster, model=spec, profile=profile, global_batch=768, seq_len=2048)
    for pipeline in result.plan.pipelines:
        speeds = [cluster.device(s.device_type).bf16_tflops for s in pipeline.stages]
        assert speeds == sorted(speeds), [s.device_type for s in pipeline.stages]


def test_grouping_program_accepts_a_warm_start_and_respects_node_room():
    from autohet_ray.cost.terms import GroupCostTable
    from autohet_ray.planner.candidates.grouping import solve_grouping
    from autohet_ray.planner.candidates.space import evaluate_template
    cluster, spec = _cluster(("H800", 4), ("H20", 4)), PRESETS["gpt3-1.3b"]
    table = GroupCostTable(model=spec, cluster=cluster, profile=analytic_profile(spec, cluster, 2048),
                           micro_batch=1, seq_len=2048)
    templates = [evaluate_template(k, cluster, table, 32) for k in
                 [(("H800", 2),), (("H20", 4),), (("H20", 1), ("H800", 1))]]
    g = solve_grouping(templates, cluster, 32, deadline_s=100.0, time_limit_s=5, warm_start={0: 1})
    used = {d: sum(c * tp * n for i, n in g.counts.items() for (dd, tp), c in templates[i].usage().items() if dd == d)
            for d in ("H800", "H20")}
    assert used["H800"] <= 4 and used["H20"] <= 4 and g.capacity >= 32


def test_program_groupings_realize_the_templates_they_count():
    """The grouping program indexes the shortlist (sorted by throughput), not the full template list: each
    realized plan must hold exactly the pipeline shapes the program chose."""
    import time
    from autohet_ray.cost.terms import GroupCostTable
    from autohet_ray.planner.candidates import per_size as search
    cluster, spec = _cluster(("H800", 1), ("A100-80GB", 1), ("H20", 2)), PRESETS["bert-large"]
    profile = analytic_profile(spec, cluster, spec.max_seq_len, micro_batches=(2,))
    table = GroupCostTable(model=spec, cluster=cluster, profile=profile, micro_batch=2, seq_len=spec.max_seq_len)
    clock = search._Deadline(time.perf_counter(), 60)
    templates = search.enumerate_templates(table, cluster, 32, clock)
    shortlist = search._shortlist(templates)
    assert [t.kinds for t in shortlist] != [t.kinds for t in templates]      # the two orders differ here
    groupings = search._groupings(shortlist, cluster, 32, clock, slacks=search.DEADLINE_SLACKS)
    assert groupings
    for g in groupings:
        plan = search._realize(g, shortlist, table, cluster, 64, True)
        assert plan is not None
        chosen = sorted(shortlist[i].kinds for i, c in g.counts.items() for _ in range(c))
        assert sorted(tuple((s.device_type, s.tp) for s in p.stages) for p in plan.pipelines) == chosen


def test_deep_usages_take_a_share_of_each_type_past_the_shallow_depth():
    from autohet_ray.planner.candidates.grouping import kinds_available
    from autohet_ray.planner.candidates.space import group_kinds
    from autohet_ray.planner.candidates.templates import deep_usages
    cluster, spec = load_cluster("jobs/clusters/v100-16gb-a100-24.yaml"), PRESETS["llama-13b"]
    available = kinds_available(cluster, group_kinds(cluster, spec))
    usages = list(deep_usages(group_kinds(cluster, spec), available, 6, 24))
    assert len({tuple(sorted(u.items())) for u in usages}) == len(usages)
    for usage in usages:
        assert 6 < sum(usage.values()) <= 24 and len({k[0] for k in usage}) == len(usage)    # one TP per type
        assert any(all(n == available[k] // copies for k, n in usage.items()) for copies in range(1, 17))
    assert {("V100-16GB", 4): 4, ("A100-40GB", 2): 4} in usages          # every GPU, 8 stages


def test_deep_templates_find_the_faster_deep_pipeline(monkeypatch):
    """llama-13b on 16 V100-16GB + 8 A100-40GB (batch 256): one pipeline of 8 stages (4 A100 TP2, then 4
    V100 TP4) is more than 5% faster than the best plan of pipelines of up to 6 stages."""
    from autohet_ray.planner.candidates import templates
    from autohet_ray.planner.search import plan_training, token_cap_sizes
    cluster, spec = load_cluster("jobs/clusters/v100-16gb-a100-24.yaml"), PRESETS["llama-13b"]
    profile = analytic_profile(spec, cluster, 2048, micro_batches=tuple(token_cap_sizes(2048)))
    request = dict(cluster=cluster, model=spec, profile=profile, global_batch=256, seq_len=2048, recompute="auto")
    deep = plan_training(**request)
    monkeypatch.setattr(templates, "DEEP_STAGES_UP_TO", 0)
    shallow = plan_training(**request)
    assert max(len(p.stages) for p in shallow.plan.pipelines) <= 6
    assert deep.evaluation.samples_per_s > 1.05 * shallow.evaluation.samples_per_s
    assert max(len(p.stages) for p in deep.plan.pipelines) > 6
