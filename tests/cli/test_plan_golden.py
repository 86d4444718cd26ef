"""`autohet plan` reads right at every size: golden outputs on a tiny (4 GPUs) and the paper's 24-GPU cluster,
each run end to end (long enough a time limit that the solver finishes, so the plan is the same every run), and
the same printing of a 1024-GPU plan (one pipeline per node, priced by the cost model; the planner itself is too
slow at that size for a test)."""
from __future__ import annotations

import os

import pytest

from autohet_ray import cli
from autohet_ray.cli.plan import plan_lines, plan_report
from autohet_ray.cluster.spec import load_cluster
from autohet_ray.cost.evaluate import evaluate_plan
from autohet_ray.job.config import TrainJob
from autohet_ray.job.plan_choice import analytic_job_profile
from autohet_ray.model.spec import load_model
from autohet_ray.plan.schema import plan_from_dict
from autohet_ray.planner.bounds.bound import lower_bound_iteration_s
from autohet_ray.planner.result import PlanResult
from golden import check_golden

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FINISH = ["--plan-time-limit-s", "120"]


@pytest.mark.parametrize("name,argv", [
    ("plan-tiny.txt", ["--cluster", "jobs/local-3.yaml", "--model", "tiny-gpt", "--global-batch", "8"]),
    ("plan-24.txt", ["--config", "jobs/paper-24.yaml"]),
])
def test_plan_output(name, argv, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert cli.main(["plan", *argv, *FINISH]) == 0
    out = capsys.readouterr().out
    assert "time limit hit" not in out
    check_golden(name, out)


def test_plan_output_at_1024_gpus():
    cluster, model = load_cluster(os.path.join(REPO, "jobs/clusters/mixed-1024.yaml")), load_model("llama-7b")
    job = TrainJob(model=model.to_dict(), cluster=cluster.to_dict(), global_batch=2048)
    seq_len = model.max_seq_len
    profile = analytic_job_profile(job, priced_model=model, cluster=cluster, seq_len=seq_len, cuda=True)
    per_node = job.global_batch // len(cluster.nodes)
    plan = plan_from_dict({
        "schema_version": 3, "model": model.name, "model_spec": None, "cluster": cluster.name,
        "global_batch": job.global_batch, "micro_batch": 1, "seq_len": seq_len, "schedule": "1f1b",
        "predicted": None, "pipelines": [
            {"num_microbatches": per_node, "micro_batch": 1, "stages": [
                {"layers": [0, model.num_layers], "tp": n.count, "device_type": n.device, "node": n.name,
                 "devices": list(range(n.count)), "recompute": False}]} for n in cluster.nodes]})
    ev = evaluate_plan(plan, cluster, model, profile)
    assert ev.feasible, ev.reason
    result = PlanResult(plan=plan.with_predicted(ev.predicted()), evaluation=ev, solve_time_s=0.0,
                        num_templates=0, hit_time_limit=False)
    bound = lower_bound_iteration_s(cluster=cluster, model=model, profile=profile, global_batch=job.global_batch,
                                    seq_len=seq_len)
    report = plan_report(result, {}, wall_s=0.0) | {"lower_bound_iteration_s": bound, "dtype": "bfloat16"}
    check_golden("plan-1024.txt", "\n".join(plan_lines(job, result, report, cluster, model, profile, seq_len)) + "\n")
