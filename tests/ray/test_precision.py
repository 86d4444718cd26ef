"""An elastic bf16 job with a cosine schedule on an emulated cluster: stopped after a committed step and
continued with `autohet resume`, it takes the uninterrupted run's learning rates and losses, bit for bit (the
checkpoints hold the fp32 master weights and AdamW moments; the schedule travels in the job record)."""
from __future__ import annotations

import json

import pytest

ray = pytest.importorskip("ray")

from autohet_ray.cli import main  # noqa: E402
from autohet_ray.plan.schema import plan_summary  # noqa: E402
from autohet_ray.storage.spec import storage_spec  # noqa: E402
from autohet_ray.model.spec import load_model  # noqa: E402
from autohet_ray.orchestrate.controller import Controller  # noqa: E402
from autohet_ray.job.config import TrainJob  # noqa: E402
from autohet_ray.runtime.lr_schedule import OptimizerConfig  # noqa: E402
from ray_helpers import FAST_HEALTH_CHECKS, THREE_NODES  # noqa: E402
from shared_clusters import shared_cluster  # noqa: E402

pytestmark = [pytest.mark.timeout(400), pytest.mark.slow]
SPEC = load_model("tiny-gpt")
STEPS, STOP = 6, 4
OPTIMIZER = OptimizerConfig(lr=1e-2, min_lr=1e-3, warmup_steps=2, decay="cosine", decay_steps=STEPS, weight_decay=0.1)


cluster = shared_cluster(THREE_NODES, system_config=FAST_HEALTH_CHECKS)


def bf16_job(storage: str) -> TrainJob:
    return TrainJob(model=SPEC.to_dict(), cluster=THREE_NODES, global_batch=4, storage=storage_spec(storage),
                    elastic=True, dtype="bf16", optimizer=OPTIMIZER, checkpoint_every=2, collective_timeout_s=30,
                    detect_timeout_s=30, baselines=False)


def run(job: TrainJob, steps: int) -> tuple[list[dict], list]:
    ctl = Controller(job)
    try:
        ctl.start()
        history = [ctl.step() for _ in range(steps)]
        plan = plan_summary(ctl.plan)
    finally:
        ctl.close()
    return history, plan


def test_bf16_elastic_job_resumes_with_the_uninterrupted_rates_and_losses(cluster, tmp_path, capsys):
    full, full_plan = run(bf16_job(str(tmp_path / "full")), STEPS)
    assert [m["lr"] for m in full] == [OPTIMIZER.lr_at(s) for s in range(STEPS)]     # metrics carry lr ...
    assert all(m["grad_norm"] > 0 for m in full)                                     # ... and grad norm
    stopped = str(tmp_path / "stopped")
    first, first_plan = run(bf16_job(stopped), STOP)
    assert first_plan == full_plan                        # the planner chose the same plan on the same nodes
    capsys.readouterr()
    assert main(["resume", "--storage", stopped, "--steps", str(STEPS), "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["resumed_from"] == STOP and out["launch"]["plan"] == full_plan
    rest = out["steps"]
    assert [s["step"] for s in rest] == list(range(STOP + 1, STEPS + 1))
    assert [s["lr"] for s in rest] == [m["lr"] for m in full[STOP:]]
    assert [m["loss"] for m in first] == [m["loss"] for m in full[:STOP]]
    assert [s["loss"] for s in rest] == [m["loss"] for m in full[STOP:]]           # bit for bit, in bf16
