"""Real data through the one controller: a corpus (the Python standard library's own source) prepared with
`autohet data prepare` on the Ray cluster, trained by an elastic job. A node lost mid-run, and a run stopped
with SIGINT then resumed, each read exactly the samples the uninterrupted run reads (the sample ids every
pipeline's first stage reports, per step), with its losses (rel 1e-5). The validation loss, forward only on the
asymmetric plan, equals the single-process model's."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import torch
import yaml

ray = pytest.importorskip("ray")

from autohet_ray.cli import main  # noqa: E402
from autohet_ray.cluster.spec import cluster_from_dict  # noqa: E402
from autohet_ray.data import Dataset  # noqa: E402
from autohet_ray.storage.job_files import read_metrics  # noqa: E402
from autohet_ray.storage.spec import storage_spec  # noqa: E402
from autohet_ray.model.spec import model_from_dict  # noqa: E402
from autohet_ray.orchestrate.controller import Controller  # noqa: E402
from autohet_ray.job.config import TrainJob  # noqa: E402
from autohet_ray.runtime.reference import Reference  # noqa: E402
from ray_helpers import FAST_HEALTH_CHECKS, THREE_NODES, asymmetric_plan, prepare_stdlib_dataset  # noqa: E402
from shared_clusters import shared_cluster  # noqa: E402

pytestmark = pytest.mark.timeout(400)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = {"name": "data-gpt", "family": "gpt", "num_layers": 4, "hidden": 32, "num_heads": 4, "num_kv_heads": 4,
         "ffn_hidden": 128, "vocab_size": 512, "max_seq_len": 16}
STEPS = 5


cluster = shared_cluster(THREE_NODES, system_config=FAST_HEALTH_CHECKS, changes_nodes=True)


@pytest.fixture(scope="module")
def dataset(cluster, tmp_path_factory):
    return prepare_stdlib_dataset(tmp_path_factory, 12, "--shard-mb", "0.05")


def job(storage: str, data: str, **kw) -> TrainJob:
    plan = asymmetric_plan() | {"model": "data-gpt"}
    base = dict(model=MODEL, cluster=THREE_NODES, global_batch=4, storage=storage_spec(storage), elastic=True,
                data=data, dtype="float64", checkpoint_every=2, collective_timeout_s=30, detect_timeout_s=30,
                plan=plan, baselines=False)
    return TrainJob(**(base | kw))


def record(history: list[dict]) -> dict[int, list[int]]:
    """Step -> the sample ids its pipelines consumed; a step run again after a restore replaces its record."""
    return {m["step"]: m["sample_ids"] for m in history}


@pytest.fixture(scope="module")
def uninterrupted(cluster, dataset, tmp_path_factory):
    ctl = Controller(job(str(tmp_path_factory.mktemp("whole")), dataset, eval_every=2, eval_batches=2))
    try:
        ctl.start()
        history = [ctl.step() for _ in range(STEPS)]
    finally:
        ctl.close()
    return history


def test_uninterrupted_run_matches_the_reference_on_real_text(dataset, uninterrupted):
    data = Dataset.open(dataset)
    ref = Reference(model_spec=model_from_dict(MODEL), dtype=torch.float64)
    expected, val = [], {}
    for i in range(STEPS):
        expected.append(ref.train_step(data.global_batch(i, 4, 16, 0))["loss"])
        if (i + 1) % 2 == 0:                                            # --eval-every 2 --eval-batches 2
            with torch.no_grad():
                val[i + 1] = sum(float(ref.loss(b)) for b in data.val_batches(2, 4, 16)) / 2
    assert [m["loss"] for m in uninterrupted] == pytest.approx(expected, rel=1e-6)
    measured = {m["step"]: m["val_loss"] for m in uninterrupted if "val_loss" in m}
    assert measured.keys() == val.keys() and list(measured.values()) == pytest.approx(list(val.values()), rel=1e-6)
    ids = [i for m in uninterrupted for i in m["sample_ids"]]
    assert len(ids) == len(set(ids)) == 4 * STEPS                       # every sample once in the epoch
    assert record(uninterrupted) == {i + 1: sorted(data.sample_ids(i, 4, 16, 0).tolist()) for i in range(STEPS)}


def test_a_lost_node_reads_each_sample_exactly_once(cluster, dataset, uninterrupted, tmp_path):
    ctl = Controller(job(str(tmp_path / "storage"), dataset))
    try:
        ctl.start()
        history = [ctl.step() for _ in range(2)]
        victim = next(n for n in cluster.list_all_nodes() if n.node_id == ctl.found.node_ids["b"])

        def lose_b(controller):
            controller.mark_fault()
            cluster.remove_node(victim, allow_graceful=False)
        history.append(ctl.step(fault_hook=lose_b))
        while ctl.step_index < STEPS:
            history.append(ctl.step())
    finally:
        ctl.close()
    assert history[2]["recovery"]["lost_nodes"] == ["b"]                 # re-planned onto fewer GPUs
    assert record(history) == record(uninterrupted)
    by_step = {m["step"]: m["loss"] for m in history}
    assert [by_step[s] for s in range(1, STEPS + 1)] == pytest.approx([m["loss"] for m in uninterrupted],
                                                                       rel=1e-5)


def test_sigint_then_resume_reads_each_sample_exactly_once(cluster, dataset, uninterrupted, tmp_path, capsys):
    from autohet_ray.emulate.cluster import node_args
    from autohet_ray.orchestrate.discovery import live_nodes
    if "b" not in {n.name for n in live_nodes()}:
        from ray_helpers import wait_until_alive
        wait_until_alive([cluster.add_node(**node_args(cluster_from_dict(THREE_NODES).node("b"))).node_id])
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(THREE_NODES))
    (tmp_path / "model.yaml").write_text(yaml.safe_dump(MODEL))
    (tmp_path / "plan.json").write_text(json.dumps(asymmetric_plan() | {"model": "data-gpt"}))
    storage = tmp_path / "storage"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.Popen([sys.executable, "-m", "autohet_ray.cli", "train", "--elastic", "--cluster",
                             str(tmp_path / "cluster.yaml"), "--model", str(tmp_path / "model.yaml"), "--data", dataset,
                             "--global-batch", "4", "--steps", "20", "--checkpoint-every", "2", "--plan",
                             str(tmp_path / "plan.json"), "--storage", str(storage), "--address", cluster.address,
                             "--dtype", "float64", "--emulate", "--iteration-wall-s", "1.0"],
                            cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    for line in proc.stdout:
        if "step 2/20:" in line:
            proc.send_signal(signal.SIGINT)
            break
    output = line + proc.communicate(timeout=120)[0]
    assert proc.returncode == 130, output[-3000:]
    capsys.readouterr()
    assert main(["resume", "--storage", str(storage), "--steps", str(STEPS), "--json"]) == 0
    history = read_metrics(storage_spec(str(storage)))
    assert record(history) == record(uninterrupted)                      # metrics.jsonl: every step, appended
    by_step = {m["step"]: m["loss"] for m in history}
    assert [by_step[s] for s in range(1, STEPS + 1)] == pytest.approx([m["loss"] for m in uninterrupted],
                                                                       rel=1e-5)


def test_bert_trains_by_masked_language_modelling_on_the_asymmetric_plan(cluster, dataset, tmp_path):
    """BERT is bidirectional: it trains on the dataset's batches masked 15% (80/10/10, seeded by step, chosen
    on the whole global batch), and the asymmetric plan's losses equal the single-process model's on the same
    masked batches."""
    from autohet_ray.data import mask_tokens
    bert = MODEL | {"name": "data-bert", "family": "bert"}
    ctl = Controller(job(str(tmp_path / "storage"), dataset, model=bert, elastic=False,
                         plan=asymmetric_plan() | {"model": "data-bert"}))
    try:
        ctl.start()
        losses = [ctl.step()["loss"] for _ in range(3)]
    finally:
        ctl.close()
    data = Dataset.open(dataset)
    index = data.index
    ref = Reference(model_spec=model_from_dict(bert), dtype=torch.float64)
    expected = []
    for i in range(3):
        batch = mask_tokens(data.global_batch(i, 4, 16, 0), mask_id=index.mask_id, vocab_size=index.vocab_size,
                            seed=0, step=i, special_ids=(index.eos_id,))
        labelled = batch["labels"] != -100
        assert 0.1 < float(labelled.float().mean()) < 0.2                  # 15% of the tokens are targets
        expected.append(ref.train_step(batch)["loss"])
    assert losses == pytest.approx(expected, rel=1e-6)
