"""Plain (non-elastic) training on a 3-node emulated Ray cluster with two GPU types, through the one controller
and its workers: it matches the single-process reference, appends metrics.jsonl every step and leaves its
final step in the storage; clear errors for missing GPUs, unschedulable workers, dead workers."""
from __future__ import annotations

import json
import os
import time

import pytest
import ray

from autohet_ray import ConfigError
from autohet_ray.recovery.decisions import RecoveryFailed
from autohet_ray.storage.job_files import read_metrics
from autohet_ray.storage.spec import storage_spec
from autohet_ray.model.spec import load_model
from autohet_ray.orchestrate.controller import Controller
from autohet_ray.data.synthetic import synthetic_batch
from autohet_ray.orchestrate.discovery import discover
from autohet_ray.job.config import TrainJob
from autohet_ray.runtime.reference import Reference

from ray_helpers import THREE_NODES, asymmetric_plan, reference_losses

pytestmark = pytest.mark.timeout(300)
SPEC = load_model("tiny-gpt")


def job(**kw) -> TrainJob:
    base = {"model": SPEC.to_dict(), "global_batch": 4, "cluster": THREE_NODES, "plan": asymmetric_plan(),
            "dtype": "float64", "setup_timeout_s": 30, "baselines": False}
    return TrainJob(**(base | kw))


def test_discovery_reads_labels(three_node_cluster):
    found = discover()
    assert [(n.name, n.device_type, n.num_gpus) for n in found.nodes] == [("a", "H800", 1), ("b", "H800", 1),
                                                                         ("c", "H20", 2)]
    assert found.emulated and found.single_host


def test_a_standby_worker_given_no_gpu_takes_the_gpu_it_is_pinned_to(three_node_cluster):
    """A worker Ray gives no GPU (a standby one) sees only the node's GPU it is pinned to, as its device 0; the
    node's CUDA_VISIBLE_DEVICES is its raylet's, which this process started. Where it then sees no GPU (here: a
    CPU host), its setup fails, naming why, instead of training on the CPU."""
    from autohet_ray.orchestrate.worker_group import kill_actors, worker_actor
    from autohet_ray.runtime.device import node_gpu_id
    node_c = discover().node_ids["c"]
    pinned, unpinned = worker_actor(node_c, 0, gpus=0.0, gpu_index=1), worker_actor(node_c, 1, gpus=0.0)
    try:
        seen = ray.get([pinned.where.remote(), unpinned.where.remote()], timeout=120)
        assert seen[0]["cuda_visible_devices"] == node_gpu_id(1, os.environ.get("CUDA_VISIBLE_DEVICES"))
        assert seen[1]["cuda_visible_devices"] == os.environ.get("CUDA_VISIBLE_DEVICES")     # left as Ray left it
        assert ray.available_resources().get("GPU", 0) == ray.cluster_resources()["GPU"]      # no GPU taken
        with pytest.raises(ray.exceptions.RayTaskError, match="pinned to its node's GPU 1 but sees no GPU"):
            ray.get(pinned.setup.remote(master_addr="127.0.0.1", master_port=1, world_size=1, plan={}, model_spec={},
                                        seed=0, dtype="auto", collective_timeout_s=5), timeout=60)   # (this CPU host)
    finally:
        kill_actors([pinned, unpinned], wait_s=10)


def test_emulated_asymmetric_training_matches_reference_and_leaves_its_model(three_node_cluster, tmp_path):
    import torch
    ctl = Controller(job(time_scale=1.0, storage=storage_spec(str(tmp_path)), checkpoint_every=2))
    dead = tmp_path / "step-0000000009" / "w" / ".0-4.tmp-dead"        # a dead writer's, from before the start
    dead.parent.mkdir(parents=True)
    dead.write_bytes(b"x")
    os.utime(dead, (time.time() - 60, time.time() - 60))
    try:
        ctl.start()
        assert not dead.exists()                                 # swept at the start
        where = ctl.group.call("where", timeout_s=30)
        nodes = {loc["rank"]: loc["labels"]["autohet.io/node"] for loc in where}
        assert nodes == {0: "c", 1: "c", 2: "a", 3: "b"}        # every rank on the node its stage names
        metrics = []
        for i in range(3):
            metrics.append(ctl.step())
            lines = read_metrics(storage_spec(str(tmp_path)))
            assert len(lines) == i + 1 and lines[-1]["step"] == i + 1                # appended every step
    finally:
        secured = ctl.close()
    losses = [m["loss"] for m in metrics]
    assert losses == pytest.approx(reference_losses(3, torch.float64), rel=1e-4)
    assert all(m["emulated"] and m["predicted_iteration_s"] > 0 for m in metrics)
    assert (tmp_path / "plan.json").exists() and json.loads((tmp_path / "job.json").read_text())["job_id"]
    assert secured["step"] == 3                                  # the final step is committed: a model is left
    assert sorted(p.name for p in (tmp_path / "manifests").iterdir())[-1].endswith("3.json")


def test_plan_needing_missing_gpus_is_a_clear_error(three_node_cluster):
    plan = asymmetric_plan()
    plan["pipelines"][0]["stages"][0] = {"layers": [0, 2], "tp": 4, "device_type": "H20", "node": "c",
                                         "devices": [0, 1, 2, 3]}
    with pytest.raises(ConfigError, match="node 'c'.* only 2 H20"):
        Controller(job(plan=plan)).start()
    bigger = THREE_NODES | {"nodes": THREE_NODES["nodes"] + [{"name": "d", "device": "A100-80GB", "count": 8}]}
    with pytest.raises(ConfigError, match="node 'd' of the cluster file is not in the Ray cluster"):
        Controller(job(cluster=bigger)).start()


def test_unschedulable_workers_and_a_dead_worker_without_checkpoints(three_node_cluster):
    from ray.util.placement_group import placement_group, remove_placement_group
    hog = placement_group([{"GPU": 1}], bundle_label_selector=[{"autohet.io/node": "a"}])
    ray.get(hog.ready(), timeout=30)
    ctl = Controller(job(setup_timeout_s=15))
    start = time.perf_counter()
    try:
        with pytest.raises(ConfigError, match=r"did not start within 15 s: rank 2 \(pipeline 0 stage 1, H800 on "
                                              r"node a\)\. Ray could not place"):
            ctl.start()
    finally:
        ctl.close()
        remove_placement_group(hog)
    assert time.perf_counter() - start < 45

    ctl = Controller(job(collective_timeout_s=30))
    try:
        ctl.start()
        ctl.step()
        ray.kill(ctl.group.actors[2])
        with pytest.raises(RecoveryFailed, match=r"rank 2 \(pipeline 0 stage 1, H800 on node a\).*keeps no "
                                                 r"checkpoints"):
            ctl.step()
    finally:
        ctl.close()
    assert ctl.group is None and ctl.state == "closed"


def test_profiling_on_ray_once_per_gpu_type_cached_and_plannable(three_node_cluster, tmp_path):
    from autohet_ray.cluster.spec import cluster_from_dict
    from autohet_ray.orchestrate.profiling import profile_cluster
    from autohet_ray.planner import plan_with_baselines
    from autohet_ray.profile.db import load_profile
    found = discover(cluster_from_dict(THREE_NODES))
    db = profile_cluster(found, SPEC, 16, micro_batches=(1, 2), cache_dir=str(tmp_path))
    assert db.kind == "measured"
    assert sorted(db.entries) == [("H20", 1, 1), ("H20", 1, 2), ("H20", 2, 1), ("H20", 2, 2), ("H800", 1, 1),
                                  ("H800", 1, 2)]
    assert db.links["intra:H20"].bandwidth_Bps > 0                 # two H20s on node c: a gloo ping-pong
    assert db.links["intra:H20"].collective_overhead_s >= 0 and set(db.optimizer_s_per_param) == {"H800", "H20"}
    assert db.links["inter"].bandwidth_Bps > 0 and db.meta["inter_link"]["nodes"] == ["a", "b"]
    assert set(db.meta["types"]) == {"H800", "H20"} and not db.meta["types"]["H20"]["cached"]
    again = profile_cluster(found, SPEC, 16, micro_batches=(1, 2), cache_dir=str(tmp_path))
    assert all(info["cached"] for info in again.meta["types"].values()) and again.entries == db.entries
    db.save(str(tmp_path / "prof.json"))
    loaded = load_profile(str(tmp_path / "prof.json"))
    result, _ = plan_with_baselines(cluster=found.cluster, model=SPEC, profile=loaded,
                                    global_batch=4, seq_len=16, micro_batch=1, time_limit_s=5)
    assert result.plan.predicted.profile_kind == "measured"


def test_cli_profile_through_ray(three_node_cluster, tmp_path, capsys):
    from autohet_ray.cli import main
    from autohet_ray.profile.db import load_profile
    cluster_file = tmp_path / "cluster.yaml"
    import yaml
    cluster_file.write_text(yaml.safe_dump(THREE_NODES))
    out = tmp_path / "prof.json"
    assert main(["profile", "--cluster", str(cluster_file), "--model", "tiny-gpt", "--out", str(out)]) == 0
    assert "H20: node c" in capsys.readouterr().out
    db = load_profile(str(out))
    assert db.kind == "measured" and {d for d, _, _ in db.entries} == {"H800", "H20"}
    assert ray.is_initialized()          # the CLI reused this process's connection and left it open


def test_cli_prints_a_plan_error_on_one_line(three_node_cluster, tmp_path, capsys):
    import json

    import yaml

    from autohet_ray.cli import main
    plan = asymmetric_plan()
    plan["pipelines"][0]["stages"][0] = {"layers": [0, 2], "tp": 4, "device_type": "H20", "node": "c",
                                         "devices": [0, 1, 2, 3]}
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(THREE_NODES))
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    code = main(["train", "--cluster", str(tmp_path / "cluster.yaml"), "--model", "tiny-gpt", "--global-batch", "4",
                 "--steps", "1", "--plan", str(tmp_path / "plan.json"), "--storage", str(tmp_path / "job")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "node 'c'" in err and "only 2 H20" in err and "ray::" not in err


def test_any_plan_evaluate_accepts_trains_with_off_grid_micro_batches(three_node_cluster, tmp_path):
    """A plan whose pipelines use micro-batches of 3 and 1 (outside the profile's 1, 2, 4, 8 grid): `autohet
    evaluate` prices it, and it trains, paced to its emulated devices, with the reference's losses."""
    import torch

    from autohet_ray.cli import main
    from ray_helpers import stage
    plan = {"schema_version": 2, "model": "tiny-gpt", "global_batch": 6, "micro_batch": 1, "seq_len": 16,
            "pipelines": [{"num_microbatches": 1, "micro_batch": 3,
                           "stages": [stage((0, 2), 2, "H20", "c", (0, 1)), stage((2, 4), 1, "H800", "a", (0,))]},
                          {"num_microbatches": 3, "micro_batch": 1, "stages": [stage((0, 4), 1, "H800", "b", (0,))]}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    import yaml
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(THREE_NODES))
    assert main(["evaluate", "--plan", str(tmp_path / "plan.json"), "--cluster", str(tmp_path / "cluster.yaml")]) == 0
    ctl = Controller(job(plan=plan, global_batch=6, time_scale=1.0))
    try:
        ctl.start()
        losses = [ctl.step()["loss"] for _ in range(2)]
    finally:
        ctl.close()
    ref = Reference(model_spec=SPEC, dtype=torch.float64)
    expected = [ref.train_step(synthetic_batch(vocab_size=SPEC.vocab_size, global_batch=6, seq_len=16, seed=0,
                                               step=i))["loss"] for i in range(2)]
    assert losses == pytest.approx(expected, rel=1e-6)


@pytest.mark.slow
def test_cli_train_writes_speed_metrics_to_jsonl_and_tensorboard(three_node_cluster, tmp_path, capsys):
    """`autohet train --emulate --tensorboard DIR` on the module's cluster: every metrics.jsonl line carries
    tokens/s and MFU per GPU type on the emulated clock and CPU peak memory as None (not measured); the
    TensorBoard events hold loss, lr and tokens/s for both steps; the progress line shows tokens/s and MFU."""
    import yaml
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from autohet_ray.cli import main
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(THREE_NODES))
    (tmp_path / "plan.json").write_text(json.dumps(asymmetric_plan()))
    code = main(["train", "--cluster", str(tmp_path / "cluster.yaml"), "--model", "tiny-gpt", "--global-batch", "4",
                 "--steps", "2", "--plan", str(tmp_path / "plan.json"), "--emulate", "--time-scale", "1",
                 "--storage", str(tmp_path / "job"), "--tensorboard", str(tmp_path / "tb")])
    out = capsys.readouterr().out
    assert code == 0
    assert "step 2/2:" in out and "tok/s" in out and "MFU" in out and "H20" in out
    lines = read_metrics(storage_spec(str(tmp_path / "job")))
    assert [m["step"] for m in lines] == [1, 2]
    for m in lines:
        assert m["clock"] == "emulated" and m["mfu_peak_dtype"] == "float32"     # CPU workers compute fp32
        assert m["tokens_per_s"] == pytest.approx(4 * 16 / m["iteration_s"])
        assert set(m["mfu_by_device_type"]) == {"H20", "H800"}
        assert all(0 < v < 1 for v in (m["mfu"], *m["mfu_by_device_type"].values()))
        assert m["peak_memory_bytes_per_device"] == {"c:0": None, "c:1": None, "a:0": None, "b:0": None}
        assert m["lr"] > 0 and m["grad_norm"] > 0
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    for tag in ("loss", "lr", "tokens_per_s", "mfu/H20", "mfu/H800"):
        assert [e.step for e in events.Scalars(tag)] == [1, 2], tag
    assert [e.value for e in events.Scalars("loss")] == pytest.approx([m["loss"] for m in lines], rel=1e-6)


def test_cli_train_without_storage_leaves_a_model_in_a_directory_it_names(three_node_cluster, tmp_path, capsys,
                                                                         monkeypatch):
    """No --storage: the run commits its final step under ./autohet-runs/<time>, says where, and `autohet
    export` turns it into a Hugging Face directory."""
    import yaml

    from autohet_ray.cli import main
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(THREE_NODES))
    (tmp_path / "plan.json").write_text(json.dumps(asymmetric_plan()))
    assert main(["train", "--cluster", "cluster.yaml", "--model", "tiny-gpt", "--global-batch", "4", "--steps", "1",
                 "--plan", "plan.json", "--emulate", "--time-scale", "1"]) == 0
    out = capsys.readouterr().out
    [run] = list((tmp_path / "autohet-runs").iterdir())
    assert f"storage: {run}" in out and f"autohet export --storage {run}" in out
    assert main(["export", "--storage", str(run), "--out", str(tmp_path / "hf")]) == 0
    assert (tmp_path / "hf" / "config.json").exists()
