"""Shared data for the Ray tests: a 3-node cluster file and an asymmetric tiny-gpt plan on it."""
from __future__ import annotations

import sys

from autohet_ray.emulate.cluster import FAST_HEALTH_CHECKS  # noqa: F401  (the Ray tests import it from here)

THREE_NODES = {"name": "three-node", "nodes": [{"name": "a", "device": "H800", "count": 1},
                                                {"name": "b", "device": "H800", "count": 1},
                                                {"name": "c", "device": "H20", "count": 2}]}


def stage(layers, tp, device, node, devices) -> dict:
    return {"layers": list(layers), "tp": tp, "device_type": device, "node": node, "devices": list(devices)}


def asymmetric_plan(global_batch: int = 4) -> dict:
    """Pipeline 0: H20 TP2 [0,2) -> H800 [2,4); pipeline 1: one H800 stage [0,4). tiny-gpt, seq 16."""
    return {"schema_version": 1, "model": "tiny-gpt", "global_batch": global_batch, "micro_batch": 1, "seq_len": 16,
            "pipelines": [{"num_microbatches": global_batch // 2,
                           "stages": [stage((0, 2), 2, "H20", "c", (0, 1)), stage((2, 4), 1, "H800", "a", (0,))]},
                          {"num_microbatches": global_batch // 2, "stages": [stage((0, 4), 1, "H800", "b", (0,))]}]}

def two_stage_plan() -> dict:
    """One pipeline: H20 TP2 [0,3) -> H800 on node a [3,4); node b unused (as after losing it). No layer has
    data-parallel holders, so nothing can be sharded."""
    return {"schema_version": 1, "model": "tiny-gpt", "global_batch": 4, "micro_batch": 1, "seq_len": 16,
            "pipelines": [{"num_microbatches": 4,
                           "stages": [stage((0, 3), 2, "H20", "c", (0, 1)), stage((3, 4), 1, "H800", "a", (0,))]}]}


def sharded_plan() -> dict:
    """`asymmetric_plan` with every stage sharding its optimizer state across its layers' holders."""
    plan = asymmetric_plan()
    for pipeline in plan["pipelines"]:
        for s in pipeline["stages"]:
            s["shard_optimizer"] = True
    return plan


def train_cluster_for(test_module: str):
    """The fixture `train_cluster`: the shared 3-node emulated cluster with a logical CPU per GPU for Ray Train's
    workers; `test_module`'s functions are pickled by value (the workers cannot import a test module)."""
    from ray import cloudpickle

    from shared_clusters import shared_cluster
    cloudpickle.register_pickle_by_value(sys.modules[test_module])
    return shared_cluster(THREE_NODES, cpus_per_gpu=1, name="train_cluster", module=test_module)




def reference_losses(steps: int, dtype=None) -> list[float]:
    """The uninterrupted single-process run (float64 unless `dtype`) of tiny-gpt on the synthetic batches the
    Ray tests train on (global batch 4 x 16 tokens, seed 0): the loss of each of the first `steps` steps."""
    import torch

    from autohet_ray.data.synthetic import synthetic_batch
    from autohet_ray.model.spec import load_model
    from autohet_ray.runtime.reference import Reference
    spec = load_model("tiny-gpt")
    ref = Reference(model_spec=spec, dtype=dtype or torch.float64)
    return [ref.train_step(synthetic_batch(vocab_size=spec.vocab_size, global_batch=4, seq_len=16, seed=0,
                                           step=i))["loss"] for i in range(steps)]


def prepare_stdlib_dataset(tmp_path_factory, num_files: int, *extra_args: str) -> str:
    """`autohet data prepare` (on the connected Ray cluster) of `num_files` small files of the Python standard
    library's own source, with a 512-token BPE trained on them and a 10% validation split: its directory."""
    import os
    import shutil
    import sysconfig

    from autohet_ray.cli import main
    corpus = tmp_path_factory.mktemp("corpus")
    stdlib = sorted((p for p in os.scandir(sysconfig.get_paths()["stdlib"]) if p.name.endswith(".py")),
                    key=lambda p: p.name)
    for entry in [e for e in stdlib if 2_000 < e.stat().st_size < 20_000][:num_files]:
        shutil.copy(entry.path, corpus / entry.name)
    out = str(tmp_path_factory.mktemp("data") / "stdlib")
    assert main(["data", "prepare", "--input", str(corpus), "--train-tokenizer", "512", "--out", out,
                 "--val-fraction", "0.1", *extra_args]) == 0
    return out


def wait_until_alive(node_ids, timeout_s: float = 60.0) -> None:
    """Wait until Ray lists each of these nodes alive. Not `cluster.wait_for_nodes()`: it also counts nodes
    that drained for a spot notice and then exited once idle (their keeper stopped), so it would time out."""
    import time

    import ray
    deadline = time.monotonic() + timeout_s
    while not all(any(n["NodeID"] == node_id and n["Alive"] for n in ray.nodes()) for node_id in node_ids):
        assert time.monotonic() < deadline, f"nodes {node_ids} not alive after {timeout_s} s"
        time.sleep(0.2)


def actors_alive(actors) -> list[bool]:
    """Per actor, whether it still answers (each must have a `where` method)."""
    import ray
    from ray.exceptions import RayActorError
    out = []
    for actor in actors:
        try:
            ray.get(actor.where.remote(), timeout=30)
            out.append(True)
        except RayActorError:
            out.append(False)
    return out
