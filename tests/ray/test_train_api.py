"""Ray Train: a CPU TorchTrainer on a 3-node emulated cluster runs an asymmetric plan through our API; each
worker takes the role of the node it landed on, and the losses equal the single-process reference."""
from __future__ import annotations

import json

import pytest

from autohet_ray import ConfigError
from autohet_ray.cluster.spec import cluster_from_dict
from autohet_ray.model.spec import load_model
from autohet_ray.orchestrate.data import synthetic_batch
from autohet_ray.plan.schema import plan_from_dict
from autohet_ray.runtime.reference import Reference
from ray_helpers import THREE_NODES, asymmetric_plan

pytestmark = pytest.mark.timeout(300)
SPEC = load_model("tiny-gpt")


def _loop(config: dict) -> None:
    import ray.train
    import torch
    import torch.distributed as dist

    from autohet_ray.orchestrate.train_api import engine_for_worker
    train_rank = dist.get_rank()
    plan = plan_from_dict(config["plan"])
    engine = engine_for_worker(plan, load_model("tiny-gpt"), dtype=torch.float64)
    losses = [engine.train_step(synthetic_batch(vocab_size=SPEC.vocab_size, global_batch=4, seq_len=16, seed=0,
                                                step=i))["loss"] for i in range(2)]
    labels = ray.get_runtime_context().get_node_labels()
    with open(f"{config['out']}/{engine.rank}.json", "w") as f:
        json.dump({"train_rank": train_rank, "node": labels["autohet.io/node"], "losses": losses,
                   "plan_node": engine.info.node}, f)
    ray.train.report({"loss": losses[-1]})


def test_torch_trainer_runs_a_plan_by_worker_location(tmp_path):
    import torch
    from ray.train import RunConfig
    from ray.train.torch import TorchTrainer

    from autohet_ray.orchestrate.emulation import emulated_cluster
    from autohet_ray.orchestrate.train_api import plan_scaling_config
    import sys

    from ray import cloudpickle
    cloudpickle.register_pickle_by_value(sys.modules[__name__])     # workers cannot import this test module
    plan = plan_from_dict(asymmetric_plan())
    scaling = plan_scaling_config(plan, use_gpu=False, resources_per_worker={"CPU": 1})
    assert [s["autohet.io/node"] for s in scaling.label_selector] == ["c", "c", "a", "b"]
    with emulated_cluster(cluster_from_dict(THREE_NODES), head_cpus=1, cpus_per_gpu=1):
        trainer = TorchTrainer(_loop, train_loop_config={"plan": asymmetric_plan(), "out": str(tmp_path)},
                               scaling_config=scaling, run_config=RunConfig(storage_path=str(tmp_path / "ray")))
        trainer.fit()
    workers = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(4)]
    assert all(w["node"] == w["plan_node"] for w in workers)
    ref = Reference(model_spec=SPEC, dtype=torch.float64)
    expected = [ref.train_step(synthetic_batch(vocab_size=SPEC.vocab_size, global_batch=4, seq_len=16, seed=0,
                                               step=i))["loss"] for i in range(2)]
    for w in workers:
        assert w["losses"] == pytest.approx(expected, rel=1e-4)


def test_assign_roles_by_location_and_mismatch():
    from autohet_ray.orchestrate.train_api import WorkerPlace, assign_roles
    plan = plan_from_dict(asymmetric_plan())
    places = [WorkerPlace(train_rank=0, node="a", device_type="H800", gpu="0", ip="x"),
              WorkerPlace(train_rank=1, node="b", device_type="H800", gpu="0", ip="x"),
              WorkerPlace(train_rank=2, node="c", device_type="H20", gpu="1", ip="x"),
              WorkerPlace(train_rank=3, node="c", device_type="H20", gpu="0", ip="x")]
    assert assign_roles(plan, places, 4) == [2, 3, 1, 0]
    wrong = places[:3] + [WorkerPlace(train_rank=3, node="a", device_type="H800", gpu="1", ip="x")]
    with pytest.raises(ConfigError, match="node 'a': the plan puts 1 ranks"):
        assign_roles(plan, wrong, 4)
