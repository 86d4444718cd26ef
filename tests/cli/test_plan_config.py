"""`autohet plan --config JOB.yaml` previews the plan `autohet train --config JOB.yaml` trains: the job read the same
way (file, then flags, then TrainJob's defaults), priced with the same profile (the emulated job's workers compute
in fp32), and planned with the same request. The train side is the controller's own first planning
(job/plan_choice.choose_plan, on the nodes an emulated discovery reports), without starting a cluster."""
from __future__ import annotations

import json
import os

import pytest

from autohet_ray import cli
from autohet_ray.cli.main import _parser
from autohet_ray.cli.train import train_job
from autohet_ray.cluster.live import Discovered, LiveNode
from autohet_ray.cluster.spec import cluster_from_dict
from autohet_ray.job.plan_choice import choose_plan
from autohet_ray.model.spec import model_from_dict
from autohet_ray.orchestrate.profiling import job_profile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# both sides get the same override; long enough that neither stops at the limit on a loaded 2-core host
TIME_LIMIT = ["--plan-time-limit-s", "120"]


def _train_plan(argv: list[str]) -> dict:
    job, launch = train_job(_parser().parse_args(["train", *argv]))
    cluster = cluster_from_dict(job.cluster)
    found = Discovered(cluster=cluster, nodes=tuple(
        LiveNode(name=n.name, node_id=f"id-{n.name}", ip="127.0.0.1", device_type=n.device, num_gpus=n.count,
                 emulated=launch.emulate) for n in cluster.nodes))
    model = model_from_dict(job.model)
    seq_len = job.seq_len or model.max_seq_len
    profile = job_profile(job, found=found, priced_model=model, cluster=cluster, seq_len=seq_len)
    plan, _, _, source = choose_plan(job, found=found, profile=profile, priced_model=model, seq_len=seq_len,
                                     plan=None, first=True, cache={})
    assert source == "planned"
    return plan.to_dict()


def test_plan_config_gives_the_plan_train_plans(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    argv = ["--config", "jobs/paper-24.yaml", *TIME_LIMIT]
    assert cli.main(["plan", *argv, "--json"]) == 0
    previewed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert not previewed["hit_time_limit"] and previewed["dtype"] == "float32"    # as the emulated workers run
    trained = _train_plan(argv)
    ignore = ("predicted",)          # the preview's figures come from the same evaluation; compared below
    assert {k: v for k, v in previewed["plan"].items() if k not in ignore} == \
        {k: v for k, v in trained.items() if k not in ignore}
    assert previewed["predicted"]["iteration_time_s"] == pytest.approx(trained["predicted"]["iteration_time_s"])


def test_a_flag_overrides_the_job_file_in_plan_as_in_train(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert cli.main(["plan", "--config", "jobs/paper-24.yaml", "--global-batch", "24", "--schedule", "1f1b",
                     "--no-emulate", "--plan-time-limit-s", "5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["plan"]["global_batch"] == 24 and out["plan"]["schedule"] == "1f1b" and out["dtype"] == "bfloat16"
