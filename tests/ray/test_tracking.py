"""Experiment tracking on a real run: `autohet train --tracking mlflow wandb tensorboard` on the emulated 3-node
cluster, every tracker read back through its own client or files (MLflow's client over a local file store, the
W&B offline run file, TensorBoard's event reader) and compared with the run's metrics.jsonl, step by step. A
tracker whose store vanishes mid-run is logged once and dropped, and the run trains on to its last step."""
from __future__ import annotations

import glob
import json
import logging
import os
import shutil
import struct

import pytest
import yaml

from autohet_ray.checkpoint.keys import manifest_key
from autohet_ray.job.config import TrainJob
from autohet_ray.model.spec import load_model
from autohet_ray.orchestrate.controller import Controller
from autohet_ray.storage import job_files
from autohet_ray.storage.job_files import read_metrics
from autohet_ray.storage.spec import storage_spec

from ray_helpers import THREE_NODES, asymmetric_plan

pytestmark = pytest.mark.timeout(600)
mlflow = pytest.importorskip("mlflow")
pb = pytest.importorskip("wandb.proto.wandb_internal_pb2")
BLOCK, FULL, LAST = 32768, 1, 4           # the W&B run file: LevelDB log blocks of protobuf records


def wandb_records(run_root: str) -> list:
    """Every record of the one offline W&B run under `run_root`, read from its .wandb file."""
    (path,) = glob.glob(os.path.join(run_root, "wandb", "offline-run-*", "run-*.wandb"))
    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b":W&B", data[:8]
    pos, out, pending = 7, [], b""
    while pos + 7 <= len(data):
        room = BLOCK - pos % BLOCK
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if room < 7 or (length == 0 and kind == 0):       # the block's padding
            pos += room
            continue
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (FULL, LAST):
            record = pb.Record()
            record.ParseFromString(pending)
            out.append(record)
            pending = b""
    return out


def test_every_tracker_reads_back_the_runs_metrics(three_node_cluster, tmp_path, capsys, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from autohet_ray.cli import main
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(THREE_NODES))
    (tmp_path / "plan.json").write_text(json.dumps(asymmetric_plan()))
    code = main(["train", "--cluster", str(tmp_path / "cluster.yaml"), "--model", "tiny-gpt", "--global-batch", "4",
                 "--steps", "3", "--plan", str(tmp_path / "plan.json"), "--emulate", "--time-scale", "1",
                 "--storage", str(tmp_path / "job"), "--tensorboard", str(tmp_path / "tb"),
                 "--tracking", "mlflow", "wandb", "tensorboard", "--mlflow-uri", str(tmp_path / "mlruns"),
                 "--loss-grace-s", "30"])          # a loaded 2-core host stalls raylets for seconds
    assert code == 0, capsys.readouterr().err
    lines = read_metrics(storage_spec(str(tmp_path / "job")))
    steps, losses = [m["step"] for m in lines], [m["loss"] for m in lines]
    assert steps == [1, 2, 3]

    client = mlflow.tracking.MlflowClient(tracking_uri=str(tmp_path / "mlruns"))
    (run,) = client.search_runs([client.get_experiment_by_name("autohet").experiment_id])
    assert run.data.params["global_batch"] == "4" and run.data.params["model.name"] == "tiny-gpt"
    for key in ("loss", "tokens_per_s", "iteration_s", "compute_s", "mfu.H20", "mfu.H800"):
        history = sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)
        assert [m.step for m in history] == steps, key
        want = [m[key] if "." not in key else m["mfu_by_device_type"][key.split(".")[1]] for m in lines]
        assert [m.value for m in history] == pytest.approx(want, abs=1e-12, rel=0), key
    names = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"plan.json", "manifest-step-3.json"} <= names
    manifest = open(client.download_artifacts(run.info.run_id, "manifest-step-3.json", str(tmp_path))).read()
    assert manifest == job_files.read_text(storage_spec(str(tmp_path / "job")), manifest_key(3))
    assert client.get_metric_history(run.info.run_id, "predicted.iteration_time_s")[0].value == \
        pytest.approx(lines[0]["predicted_iteration_s"], abs=1e-12)

    records = wandb_records(str(tmp_path))
    history = [{i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
               | {"_step": r.history.step.num} for r in records if r.WhichOneof("record_type") == "history"]
    assert [h["_step"] for h in history] == steps
    assert [h["loss"] for h in history] == pytest.approx(losses, abs=1e-12, rel=0)
    assert [h["mfu/H20"] for h in history] == pytest.approx([m["mfu_by_device_type"]["H20"] for m in lines],
                                                           abs=1e-12, rel=0)
    config = {i.key: i.value_json for r in records if r.WhichOneof("record_type") == "config"
              for i in r.config.update}
    assert json.loads(config["global_batch"]) == "4" and json.loads(config["model.name"]) == "tiny-gpt"

    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [e.step for e in events.Scalars("loss")] == steps
    # TensorBoard's scalar events hold float32: equal to the JSONL's loss at that precision
    assert [e.value for e in events.Scalars("loss")] == pytest.approx(losses, rel=1e-6)


def test_a_tracker_that_fails_mid_run_is_logged_once_and_training_goes_on(three_node_cluster, tmp_path, caplog):
    store = tmp_path / "mlruns"
    job = TrainJob(model=load_model("tiny-gpt").to_dict(), global_batch=4, cluster=THREE_NODES,
                   plan=asymmetric_plan(), dtype="float64", setup_timeout_s=120, baselines=False, loss_grace_s=30,
                   storage=storage_spec(str(tmp_path / "job")), tracking=("mlflow",), mlflow_uri=str(store))

    def on_event(kind, report):
        if kind == "step" and report["step"] == 1:
            store.rename(tmp_path / "gone")     # the tracking store goes away under the run, at once

    with caplog.at_level(logging.WARNING, logger="autohet_ray.metrics.tracking"):
        out = Controller(job).run(3, on_event=on_event)
    assert [s["step"] for s in out["steps"]] == [1, 2, 3] and out["failure"] is None
    warnings = [r for r in caplog.records if r.name == "autohet_ray.metrics.tracking"]
    assert len(warnings) == 1 and "mlflow failed" in warnings[0].getMessage(), [r.getMessage() for r in warnings]
