"""Ray Train as deep as the CLI: a CPU TorchTrainer on the 3-node emulated cluster asks for one worker per GPU of the
cluster file, and the planner inside the trainer plans on the workers it got: priced for a long-sequence model,
an asymmetric plan (two H800 pipelines of 7 micro-batches, one H20 TP2 pipeline of 2). It trains on a dataset of
`autohet data prepare`; one worker is killed (SIGKILL) mid-run, Ray Train restarts the group
(FailureConfig(max_failures=1)), the restart restores the newest checkpoint under the same plan, reads the same
samples again, and the losses equal the single-process reference (fp64, rel 1e-6); CheckpointConfig(num_to_keep=2)
leaves 2 checkpoints. Its final step, exported as a Hugging Face model, starts a second run (hf: weights) on 3
workers, which the trainer plans anew."""
from __future__ import annotations

import json
import os

import pytest

from autohet_ray import ConfigError
from autohet_ray.cluster.spec import cluster_from_dict
from autohet_ray.plan.schema import plan_from_dict
from ray_helpers import THREE_NODES, asymmetric_plan, prepare_stdlib_dataset
from shared_clusters import shared_cluster

pytestmark = pytest.mark.timeout(600)
MODEL = {"name": "data-gpt", "family": "gpt", "num_layers": 4, "hidden": 32, "num_heads": 4, "num_kv_heads": 4,
         "ffn_hidden": 128, "vocab_size": 512, "max_seq_len": 16}
# the real-size model the plan is priced for: the same layers, 8192-token samples (compute-bound, so data
# parallelism over every GPU pays, the H20s as one TP2 pipeline)
PRICED = MODEL | {"name": "long-gpt", "hidden": 256, "num_heads": 8, "num_kv_heads": 8, "ffn_hidden": 1024,
                  "max_seq_len": 8192}
GLOBAL_BATCH, STEPS, KILL_AFTER = 16, 5, 3

def _pickled_by_value():
    import sys

    from ray import cloudpickle
    cloudpickle.register_pickle_by_value(sys.modules[__name__])     # the workers cannot import a test module


_pickled_by_value()
train_cluster = shared_cluster(THREE_NODES, cpus_per_gpu=1, name="train_cluster", module=__name__)  # the sharded one's


@pytest.fixture(scope="module")
def dataset(train_cluster, tmp_path_factory):
    return prepare_stdlib_dataset(tmp_path_factory, 6)


@pytest.fixture(scope="module")
def priced(tmp_path_factory) -> dict:
    """The job settings that price the plan for PRICED, in bf16 as the GPUs would run it (an analytic profile
    DB file; the CPU workers compute in fp64, which the analytic profile would price as fp32)."""
    from autohet_ray.model.spec import model_from_dict
    from autohet_ray.profile.analytic import analytic_profile
    path = tmp_path_factory.mktemp("profile") / "bf16.json"
    db = analytic_profile(model_from_dict(PRICED), cluster_from_dict(THREE_NODES), PRICED["max_seq_len"], (1,))
    path.write_text(json.dumps(db.to_dict()))
    return {"priced_as": PRICED, "priced_seq_len": PRICED["max_seq_len"], "profile": str(path)}


def _job(data: str | None, **kw) -> dict:
    from autohet_ray.job.config import TrainJob
    return TrainJob(**(dict(model=MODEL, cluster=THREE_NODES, global_batch=GLOBAL_BATCH, micro_batch=1, data=data,
                            dtype="float64", baselines=False, collective_timeout_s=60) | kw)).to_dict()


def _loop(config: dict) -> None:
    """Plan, restore, train to `steps` (a checkpoint every `every`, a report every step); the last plan rank kills
    its own process once after step `kill_after`, once the checkpoints so far are registered. Plan rank 0 logs each
    step it computes: (time, restored step, plan source, plan, step, loss, sample ids)."""
    import signal
    import time

    import ray.train

    from autohet_ray.orchestrate.train_api import TrainReporter, start_worker
    start = start_worker(config["job"], initial=config.get("initial"))
    reporter = TrainReporter(start, checkpoint_every=config["every"])
    engine = start.engine
    if engine is None:
        return reporter.stand_by(config["steps"])
    marker = os.path.join(config["out"], "killed-once")
    while engine.step < config["steps"]:
        batch = start.data.batch(engine.step)
        out = engine.train_step(batch)
        if engine.rank == 0:
            ids = sorted(batch["sample_ids"].tolist()) if "sample_ids" in batch else []
            with open(os.path.join(config["out"], "log.jsonl"), "a") as f:
                f.write(json.dumps({"t": time.time(), "restored": start.restored, "source": start.plan_source,
                                    "plan": start.plan.to_dict(), "step": out["step"], "loss": out["loss"],
                                    "sample_ids": ids}) + "\n")
        if engine.step == config.get("kill_after") and engine.rank == engine.plan.num_devices - 1 \
                and not os.path.exists(marker):
            open(marker, "w").close()
            ray.train.get_all_reported_checkpoints()      # waits until the reports so far are processed
            os.kill(os.getpid(), signal.SIGKILL)
        reporter.report(out)
    start.data.close()


def _fit(config: dict, storage, scaling, *, max_failures: int = 0, num_to_keep: int | None = None):
    from ray.train import CheckpointConfig, FailureConfig, RunConfig
    from ray.train.torch import TorchTrainer
    return TorchTrainer(_loop, train_loop_config=config, scaling_config=scaling,
                        run_config=RunConfig(storage_path=str(storage),
                                             failure_config=FailureConfig(max_failures=max_failures),
                                             checkpoint_config=CheckpointConfig(num_to_keep=num_to_keep))).fit()


def _scaling(cluster: dict):
    """One worker per GPU of `cluster`, pinned to its node: the emulated workers hold a CPU, not a GPU, which
    alone would not keep two H800 workers off one H800 node."""
    from autohet_ray.orchestrate.train_api import cluster_scaling_config
    return cluster_scaling_config(cluster_from_dict(cluster), use_gpu=False, resources_per_worker={"CPU": 1},
                                  pin_nodes=True)


def _log(out_dir) -> list[dict]:
    return [json.loads(line) for line in (out_dir / "log.jsonl").read_text().splitlines()]


def _reference(data: str, steps: int):
    """The uninterrupted single-process run (fp64) on the dataset's first `steps` global batches, and its model."""
    import torch

    from autohet_ray.data import Dataset
    from autohet_ray.model.spec import model_from_dict
    from autohet_ray.runtime.reference import Reference
    ds, ref = Dataset.open(data), Reference(model_spec=model_from_dict(MODEL), dtype=torch.float64)
    return [ref.train_step(ds.global_batch(i, GLOBAL_BATCH, 16, 0))["loss"] for i in range(steps)], ref, ds


@pytest.fixture(scope="module")
def recovered_run(dataset, priced, tmp_path_factory):
    out = tmp_path_factory.mktemp("recover")
    config = {"job": _job(dataset, **priced), "out": str(out), "steps": STEPS, "every": 1, "kill_after": KILL_AFTER}
    result = _fit(config, out / "ray", _scaling(THREE_NODES), max_failures=1, num_to_keep=2)
    return result, out


def test_planned_asymmetric_plan_survives_a_killed_worker_on_prepared_data(dataset, recovered_run):
    from autohet_ray.orchestrate.train_checkpoint import checkpoint_manifest
    result, out = recovered_run
    assert result.error is None and (out / "killed-once").exists()
    log = _log(out)
    assert [(e["restored"], e["source"], e["step"]) for e in log] == \
        [(None, "planned", 1), (None, "planned", 2), (None, "planned", 3),
         (2, "checkpoint", 3), (2, "checkpoint", 4), (2, "checkpoint", 5)]
    plan = log[0]["plan"]
    assert all(e["plan"] == plan for e in log)
    shapes = sorted((p["num_microbatches"], [(s["layers"], s["tp"], s["device_type"]) for s in p["stages"]])
                    for p in plan["pipelines"])
    assert shapes == [(2, [([0, 4], 2, "H20")]), (7, [([0, 4], 1, "H800")]), (7, [([0, 4], 1, "H800")])]
    expected, _, ds = _reference(dataset, STEPS)
    for entry in log:                               # step 3 ran twice: before the kill and after the restore
        assert entry["loss"] == pytest.approx(expected[entry["step"] - 1], rel=1e-6)
        assert entry["sample_ids"] == sorted(ds.sample_ids(entry["step"] - 1, GLOBAL_BATCH, 16, 0).tolist())
    manifest = checkpoint_manifest(result.checkpoint)
    assert manifest.step == STEPS and not manifest.problems()
    assert manifest.extra["data"]["samples_consumed"] == STEPS * GLOBAL_BATCH
    # num_to_keep=2: of the 6 checkpoints reported (steps 1, 2, then 3, 4, 5 after the restart) Ray Train kept the
    # newest 2 and deleted the rest from the run's storage (their chunks and manifests live only there)
    kept = [d for d in os.listdir(result.path)
            if d.startswith("checkpoint_") and os.path.isdir(os.path.join(result.path, d))]
    assert len(kept) == 2
    assert [checkpoint_manifest(c).step for c, _ in result.best_checkpoints] == [4, 5]


def test_every_stage_reports_its_figures(recovered_run):
    """Every worker reports the same figures: the loss, tokens/s, MFU per GPU type and each stage's own."""
    result, _ = recovered_run
    m = result.metrics
    assert m["step"] == STEPS and m["clock"] == "wall"
    assert m["tokens_per_s"] == pytest.approx(GLOBAL_BATCH * 16 / m["step_s"])
    assert sorted(m["mfu_by_device_type"]) == ["H20", "H800"]
    assert all(0 < v < 1 for v in m["mfu_by_device_type"].values())
    assert sorted(s["device_type"] for s in m["stages"]) == ["H20", "H800", "H800"]      # one per pipeline
    assert all(s["model_tflops"] > 0 and 0 < s["mfu"] < 1 for s in m["stages"])


def test_restart_replans_only_when_the_workers_changed():
    """choose_worker_plan (plan rank 0, at every start): a checkpoint saved by the same workers keeps its plan; one
    saved by other workers is re-planned on the workers there are now; a given plan must fit them."""
    from autohet_ray.orchestrate.train_api import choose_worker_plan, workers_summary
    from autohet_ray.job.config import job_from_dict
    from autohet_ray.plan.roles import WorkerPlace, plan_fits_places
    places = [WorkerPlace(train_rank=i, node=n, device_type=d, gpu=g, ip="x")
              for i, (n, d, g) in enumerate([("a", "H800", "0"), ("b", "H800", "0"), ("c", "H20", "0"),
                                             ("c", "H20", "1")])]
    job = job_from_dict(_job(None, global_batch=4, priced_as=None))
    planned, source = choose_worker_plan(job, places, restoring=None)
    assert source == "planned" and plan_fits_places(plan_from_dict(planned), places, 4)
    same = {"plan": asymmetric_plan(), "workers": workers_summary(places)}
    assert choose_worker_plan(job, places, restoring=same) == (asymmetric_plan(), "checkpoint")
    fewer = [p for p in places if p.node != "b"]
    replanned, source = choose_worker_plan(job, fewer, restoring=same)
    assert source == "planned" and {s["node"] for p in replanned["pipelines"] for s in p["stages"]} <= {"a", "c"}
    given = job_from_dict(_job(None, global_batch=4, priced_as=None, plan=asymmetric_plan()))
    assert choose_worker_plan(given, places, restoring=None)[1] == "given"
    with pytest.raises(ConfigError, match="node 'b': the plan puts 1 ranks"):
        choose_worker_plan(given, fewer, restoring=None)


def test_assign_roles_by_location_idle_workers_and_mismatch():
    from autohet_ray.plan.roles import IDLE, WorkerPlace, assign_roles
    plan = plan_from_dict(asymmetric_plan())
    places = [WorkerPlace(train_rank=0, node="a", device_type="H800", gpu="0", ip="x"),
              WorkerPlace(train_rank=1, node="b", device_type="H800", gpu="0", ip="x"),
              WorkerPlace(train_rank=2, node="c", device_type="H20", gpu="1", ip="x"),
              WorkerPlace(train_rank=3, node="c", device_type="H20", gpu="0", ip="x")]
    assert assign_roles(plan, places, 4) == [2, 3, 1, 0]
    extra = places + [WorkerPlace(train_rank=4, node="a", device_type="H800", gpu="1", ip="x")]
    assert assign_roles(plan, extra, 4, allow_idle=True) == [2, 3, 1, 0, IDLE]
    with pytest.raises(ConfigError, match="node 'a': the plan puts 1 ranks"):
        assign_roles(plan, extra, 4)
    with pytest.raises(ConfigError, match="node 'b': the plan puts 1 ranks"):
        assign_roles(plan, [p for p in places if p.node != "b"], 4, allow_idle=True)


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

    from autohet_ray.orchestrate.train_api import cluster_scaling_config
    from autohet_ray.orchestrate.train_checkpoint import check_checkpoint_every, checkpoint_manifest
    with pytest.raises(ConfigError, match="checkpoint_every=-1 must be an integer >= 0"):
        check_checkpoint_every(-1)
    with pytest.raises(ConfigError, match="min_workers=5 must be between 1 and the cluster's 4 GPUs"):
        cluster_scaling_config(cluster_from_dict(THREE_NODES), min_workers=5)
    (tmp_path / "model.pt").write_bytes(b"not ours")
    with pytest.raises(ConfigError, match="holds no committed autohet step"):
        checkpoint_manifest(Checkpoint.from_directory(str(tmp_path)))


def test_hf_export_starts_a_run_planned_on_other_workers(dataset, priced, recovered_run, tmp_path):
    """The final step exported as a Hugging Face model (with the dataset's tokenizer) starts a new run from hf:
    weights on nodes a and c only (3 workers): the trainer plans on those, and its first loss is the reference
    model's (after the same 5 steps) on the dataset's first batch."""
    import torch

    from autohet_ray.model.spec import load_model, model_from_dict
    from autohet_ray.orchestrate.train_checkpoint import checkpoint_manifest, export_train_checkpoint
    result, _ = recovered_run
    export = str(tmp_path / "hf")
    report = export_train_checkpoint(result.checkpoint, model_from_dict(MODEL), export, data=dataset)
    assert report["step"] == STEPS and report["tokenizer"]
    two_nodes = {"name": "a-and-c", "nodes": [n for n in THREE_NODES["nodes"] if n["name"] != "b"]}
    hf_model = load_model(f"hf:{export}").to_dict()
    config = {"job": _job(dataset, model=hf_model, init_from=export, cluster=two_nodes, **priced),
              "out": str(tmp_path), "steps": 1, "every": 1}
    run = _fit(config, tmp_path / "ray", _scaling(two_nodes))
    assert run.error is None
    (entry,) = _log(tmp_path)
    assert entry["source"] == "planned" and entry["restored"] is None
    shapes = sorted((p["num_microbatches"], [(s["layers"], s["tp"], s["node"]) for s in p["stages"]])
                    for p in entry["plan"]["pipelines"])      # planned on a and c: the H20s as two pipelines now
    assert shapes == [(2, [([0, 4], 1, "c")]), (2, [([0, 4], 1, "c")]), (12, [([0, 4], 1, "a")])]
    _, ref, ds = _reference(dataset, STEPS)
    with torch.no_grad():
        expected = float(ref.loss(ds.global_batch(0, GLOBAL_BATCH, 16, 0)))
    assert entry["loss"] == pytest.approx(expected, rel=1e-6)
    assert checkpoint_manifest(run.checkpoint).step == 1
