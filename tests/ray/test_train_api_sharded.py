"""Ray Train with sharded optimizer state: a CPU TorchTrainer on the 3-node emulated cluster runs the asymmetric
plan with every stage sharding its optimizer state (each unit's master and moments split between its two
pipelines' holders); the losses equal the single-process reference (fp64), and the step it reports as a Ray
Train checkpoint resumes under an unsharded plan of another shape, whose next loss equals the reference too."""
from __future__ import annotations

import json
import os

import pytest

from autohet_ray.model.spec import load_model
from autohet_ray.data.synthetic import synthetic_batch
from autohet_ray.plan.schema import plan_from_dict
from ray_helpers import reference_losses, sharded_plan, train_cluster_for, two_stage_plan

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.timeout(420)
SPEC = load_model("tiny-gpt")
STEPS = 3






train_cluster = train_cluster_for(__name__)


def _loop(config: dict) -> None:
    """Restore `initial` if given, train to `steps` reporting a checkpoint every step; plan rank 0 logs
    (step, loss, sharded ops, resident sharded optimizer bytes) of each step."""
    import torch

    from autohet_ray.orchestrate.train_api import engine_for_worker, report_step, restore_from_train_checkpoint
    engine = engine_for_worker(plan_from_dict(config["plan"]), load_model("tiny-gpt"), dtype=torch.float64)
    restore_from_train_checkpoint(engine, initial=config.get("initial"))
    while engine.step < config["steps"]:
        batch = synthetic_batch(vocab_size=SPEC.vocab_size, global_batch=4, seq_len=16, seed=0, step=engine.step)
        out = engine.train_step(batch)
        if engine.rank == 0:
            sharded = sum(op.sharded for op in engine.grad_sync.ops)
            with open(os.path.join(config["out"], "log.jsonl"), "a") as f:
                f.write(json.dumps({"step": out["step"], "loss": out["loss"], "sharded_ops": sharded}) + "\n")
        report_step(engine, out, checkpoint_every=1)


def _fit(config: dict, storage):
    from ray.train import RunConfig
    from ray.train.torch import TorchTrainer

    from autohet_ray.orchestrate.train_api import plan_scaling_config
    scaling = plan_scaling_config(plan_from_dict(config["plan"]), use_gpu=False, resources_per_worker={"CPU": 1})
    return TorchTrainer(_loop, train_loop_config=config, scaling_config=scaling,
                        run_config=RunConfig(storage_path=str(storage))).fit()


def _log(out) -> list[dict]:
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


def test_sharded_plan_trains_through_ray_train_and_resumes_unsharded(train_cluster, tmp_path):
    from autohet_ray.orchestrate.train_checkpoint import checkpoint_manifest
    first, second = tmp_path / "sharded", tmp_path / "unsharded"
    first.mkdir(), second.mkdir()
    result = _fit({"plan": sharded_plan(), "out": str(first), "steps": STEPS}, first / "ray")
    assert result.error is None
    expected = reference_losses(STEPS + 1)
    log = _log(first)
    assert [e["step"] for e in log] == list(range(1, STEPS + 1)) and all(e["sharded_ops"] > 0 for e in log)
    assert [e["loss"] for e in log] == pytest.approx(expected[:STEPS], rel=1e-6)
    manifest = checkpoint_manifest(result.checkpoint)
    assert manifest.step == STEPS and not manifest.problems()

    resumed = _fit({"plan": two_stage_plan(), "out": str(second), "steps": STEPS + 1,
                    "initial": result.checkpoint}, second / "ray")
    assert resumed.error is None
    log = _log(second)
    assert [(e["step"], e["sharded_ops"]) for e in log] == [(STEPS + 1, 0)]
    assert log[0]["loss"] == pytest.approx(expected[STEPS], rel=1e-6)
