"""Ray Train: a CPU TorchTrainer on a 3-node emulated cluster runs an asymmetric plan through our API; each
worker takes the role of the node it landed on, and the losses equal the single-process reference. Committed
steps are reported as Ray Train checkpoints in autohet's format: a worker failure restarts the group, which
resumes from the newest one, and a checkpoint saved under one plan is resumed under another."""
from __future__ import annotations

import json
import os

import pytest

from autohet_ray import ConfigError
from autohet_ray.model.spec import load_model
from autohet_ray.data.synthetic import synthetic_batch
from autohet_ray.plan.schema import plan_from_dict
from ray_helpers import asymmetric_plan, reference_losses, train_cluster_for, two_stage_plan

pytestmark = pytest.mark.timeout(300)
SPEC = load_model("tiny-gpt")


def _batch(step: int) -> dict:
    """The global batch of the step that starts at engine step `step` (0-based)."""
    return synthetic_batch(vocab_size=SPEC.vocab_size, global_batch=4, seq_len=16, seed=0, step=step)




train_cluster = train_cluster_for(__name__)


def _fit(loop, config: dict, storage, *, max_failures: int = 0):
    from ray.train import FailureConfig, RunConfig
    from ray.train.torch import TorchTrainer

    from autohet_ray.orchestrate.train_api import plan_scaling_config
    scaling = plan_scaling_config(plan_from_dict(config["plan"]), use_gpu=False, resources_per_worker={"CPU": 1})
    trainer = TorchTrainer(loop, train_loop_config=config, scaling_config=scaling,
                           run_config=RunConfig(storage_path=str(storage),
                                                failure_config=FailureConfig(max_failures=max_failures)))
    return trainer.fit()


def _recovering_loop(config: dict) -> None:
    """Resume from the newest checkpoint (or `initial`), train to `steps`, report every step (a checkpoint every
    `every`); plan rank `fail_rank` fails once after step `fail_at`, once the checkpoints so far are registered.
    Each worker records its node and its plan rank's node; plan rank 0 logs (restored step, step, loss) of every
    step it computes."""
    import ray.train
    import torch

    from autohet_ray.orchestrate.train_api import engine_for_worker, report_step, restore_from_train_checkpoint
    engine = engine_for_worker(plan_from_dict(config["plan"]), load_model("tiny-gpt"), dtype=torch.float64)
    restored = restore_from_train_checkpoint(engine, initial=config.get("initial"))
    with open(os.path.join(config["out"], f"place-{engine.rank}-{restored}.json"), "w") as f:
        json.dump({"node": ray.get_runtime_context().get_node_labels()["autohet.io/node"],
                   "plan_node": engine.info.node}, f)
    marker = os.path.join(config["out"], "failed-once")
    while engine.step < config["steps"]:
        out = engine.train_step(_batch(engine.step))
        if engine.rank == 0:
            with open(os.path.join(config["out"], "log.jsonl"), "a") as f:
                f.write(json.dumps({"restored": restored, "step": out["step"], "loss": out["loss"]}) + "\n")
        if engine.step == config.get("fail_at") and engine.rank == config["fail_rank"] and not os.path.exists(marker):
            open(marker, "w").close()
            ray.train.get_all_reported_checkpoints()     # waits until the reports so far are processed
            raise RuntimeError(f"injected failure of plan rank {engine.rank} after step {engine.step}")
        report_step(engine, out, checkpoint_every=config["every"])


def _log(out_dir) -> list[dict]:
    return [json.loads(line) for line in (out_dir / "log.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def recovered_run(train_cluster, tmp_path_factory):
    """Plan A (asymmetric, 4 workers), 4 steps, a checkpoint every 2; plan rank 3 fails after step 3 on the first
    attempt, after the step-2 checkpoint was registered; FailureConfig(max_failures=1) restarts the group."""
    out = tmp_path_factory.mktemp("recover")
    config = {"plan": asymmetric_plan(), "out": str(out), "steps": 4, "every": 2, "fail_at": 3, "fail_rank": 3}
    result = _fit(_recovering_loop, config, out / "ray", max_failures=1)
    return result, out


def test_torch_trainer_runs_a_plan_by_worker_location(recovered_run):
    """Each worker takes the plan role of the node Ray Train put it on, in both attempts."""
    from autohet_ray.orchestrate.train_api import plan_scaling_config
    scaling = plan_scaling_config(plan_from_dict(asymmetric_plan()), use_gpu=False, resources_per_worker={"CPU": 1})
    assert [s["autohet.io/node"] for s in scaling.label_selector] == ["c", "c", "a", "b"]
    _, out = recovered_run
    places = [json.loads((out / f"place-{rank}-{restored}.json").read_text())
              for rank in range(4) for restored in (None, 2)]
    assert all(p["node"] == p["plan_node"] for p in places)


def test_worker_failure_resumes_from_the_newest_reported_checkpoint(recovered_run):
    from autohet_ray.orchestrate.train_checkpoint import checkpoint_manifest
    result, out = recovered_run
    assert result.error is None and (out / "failed-once").exists()
    log = _log(out)
    assert [(e["restored"], e["step"]) for e in log] == [(None, 1), (None, 2), (None, 3), (2, 3), (2, 4)]
    expected = reference_losses(4)
    for entry in log:                                  # step 3 ran twice: before the failure and after the restore
        assert entry["loss"] == pytest.approx(expected[entry["step"] - 1], rel=1e-6)
    manifest = checkpoint_manifest(result.checkpoint)  # the newest registered checkpoint: step 4, complete
    assert manifest.step == 4 and not manifest.problems()
    assert manifest.extra["plan"]["pipelines"] == plan_from_dict(asymmetric_plan()).to_dict()["pipelines"]
    # one directory in the run's storage holds every rank's chunks: TP halves of layers 0-1 (pipeline 0's
    # tiles), whole tensors elsewhere; each chunk once
    root = result.checkpoint.path
    assert os.path.isfile(os.path.join(root, "manifests", "step-0000000004.json"))
    chunks = lambda name: sorted(r.chunk.offsets for r in manifest.records if r.name == name)  # noqa: E731
    assert chunks("layers.0.mlp.fc1.weight") == [(0, 0), (SPEC.ffn_hidden // 2, 0)]
    assert chunks("layers.3.mlp.fc1.weight") == [(0, 0)] and chunks("optim.step") == [()]
    for record in manifest.records:
        assert os.path.isfile(os.path.join(root, record.key))


def test_checkpoint_of_one_plan_resumes_under_another(recovered_run, tmp_path):
    """Plan B (one pipeline of two stages, other TP degrees and boundaries, node b left out) restores the step-4
    checkpoint plan A reported and trains step 5: the loss equals the reference's."""
    from autohet_ray.orchestrate.train_checkpoint import checkpoint_manifest
    result_a, _ = recovered_run
    config = {"plan": two_stage_plan(), "out": str(tmp_path), "steps": 5, "every": 1,
              "initial": result_a.checkpoint}
    result = _fit(_recovering_loop, config, tmp_path / "ray")
    assert result.error is None
    log = _log(tmp_path)
    assert [(e["restored"], e["step"]) for e in log] == [(4, 5)]
    assert log[0]["loss"] == pytest.approx(reference_losses(5)[4], rel=1e-6)
    manifest = checkpoint_manifest(result.checkpoint)
    assert manifest.step == 5 and manifest.extra["plan"]["pipelines"][0]["stages"][0]["layers"] == [0, 3]


def test_assign_roles_by_location_and_mismatch():
    from autohet_ray.plan.roles import WorkerPlace, assign_roles
    plan = plan_from_dict(asymmetric_plan())
    places = [WorkerPlace(train_rank=0, node="a", device_type="H800", gpu="0", ip="x"),
              WorkerPlace(train_rank=1, node="b", device_type="H800", gpu="0", ip="x"),
              WorkerPlace(train_rank=2, node="c", device_type="H20", gpu="1", ip="x"),
              WorkerPlace(train_rank=3, node="c", device_type="H20", gpu="0", ip="x")]
    assert assign_roles(plan, places, 4) == [2, 3, 1, 0]
    wrong = places[:3] + [WorkerPlace(train_rank=3, node="a", device_type="H800", gpu="1", ip="x")]
    with pytest.raises(ConfigError, match="node 'a': the plan puts 1 ranks"):
        assign_roles(plan, wrong, 4)


def test_checkpoint_writers_tile_each_tensor_once():
    """Pipeline 0 holds `w` as TP2 halves, pipelines 1 and 2 each hold it whole (data-parallel copies); every rank
    holds `n` whole: the step's writes are pipeline 0's halves of `w` and one copy of `n`."""
    from autohet_ray.checkpoint.peers import assign_writers
    from autohet_ray.layout import Chunk, covers_exactly
    from autohet_ray.orchestrate.train_checkpoint import tile_holdings
    whole, top, bottom, n = Chunk((0, 0), (4, 2)), Chunk((0, 0), (2, 2)), Chunk((2, 0), (2, 2)), Chunk((0,), (3,))
    holdings = {0: [("w", top, 32), ("n", n, 24)], 1: [("w", bottom, 32), ("n", n, 24)],
                2: [("w", whole, 64), ("n", n, 24)], 3: [("w", whole, 64), ("n", n, 24)]}
    tiled = tile_holdings(holdings, {0: 0, 1: 0, 2: 1, 3: 2})
    assert tiled == {0: holdings[0], 1: holdings[1], 2: [("n", n, 24)], 3: [("n", n, 24)]}
    writes = [item for items in assign_writers(tiled).values() for item in items]
    assert sorted(c.offsets for name, c in writes if name == "w") == [(0, 0), (2, 0)]
    assert [c for name, c in writes if name == "n"] == [n]
    assert covers_exactly([c for name, c in writes if name == "w"], (4, 2))


def test_user_errors_name_the_value(tmp_path):
    from ray.train import Checkpoint

    from autohet_ray.orchestrate.train_checkpoint import checkpoint_manifest, report_step
    with pytest.raises(ConfigError, match="checkpoint_every=-1 must be an integer >= 0"):
        report_step(None, {}, checkpoint_every=-1)
    (tmp_path / "model.pt").write_bytes(b"not ours")
    with pytest.raises(ConfigError, match="holds no committed autohet step"):
        checkpoint_manifest(Checkpoint.from_directory(str(tmp_path)))


def test_reports_carry_speed_and_memory_metrics(recovered_run):
    """`report_step` sends lr, grad norm, tokens/s and the worker's MFU through ray.train.report; CPU workers
    report no peak memory figure (not measured) and say so."""
    result, _ = recovered_run
    m = result.metrics
    assert m["step"] == 4 and m["clock"] == "wall" and m["device_type"] in ("H20", "H800")
    assert m["tokens_per_s"] == pytest.approx(4 * 16 / m["step_s"])
    assert 0 < m["mfu"] < 1 and m["model_tflops"] > 0 and m["lr"] > 0 and m["grad_norm"] > 0
    assert "peak_memory_bytes" not in m and m["peak_memory_source"].startswith("none")
