"""Elastic recovery on a 3-node emulated Ray cluster: a node is removed mid-step (a real node loss), the
controller names it, re-plans on what is left, restores from the node and peer keepers (no cloud bytes) and
its next losses equal the uninterrupted single-process run's."""
from __future__ import annotations

import pytest
import torch

ray = pytest.importorskip("ray")

from autohet_ray.cluster.spec import cluster_from_dict  # noqa: E402
from autohet_ray.model.spec import load_model  # noqa: E402
from autohet_ray.orchestrate.data import synthetic_batch  # noqa: E402
from autohet_ray.orchestrate.elastic_config import ElasticJob  # noqa: E402
from autohet_ray.orchestrate.elastic_tiers import storage_spec  # noqa: E402
from autohet_ray.orchestrate.recovery import ElasticController  # noqa: E402
from autohet_ray.runtime.reference import Reference  # noqa: E402
from ray_helpers import asymmetric_plan  # noqa: E402

pytestmark = pytest.mark.timeout(300)
SPEC = load_model("tiny-gpt")
NODES = {"name": "three-node", "nodes": [{"name": "a", "device": "H800", "count": 1},
                                          {"name": "b", "device": "H800", "count": 1},
                                          {"name": "c", "device": "H20", "count": 2}]}
FAST_HEALTH_CHECKS = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3,
                      "health_check_initial_delay_ms": 1000}


@pytest.fixture(scope="module")
def cluster():
    from autohet_ray.orchestrate.emulation import emulated_cluster
    with emulated_cluster(cluster_from_dict(NODES), system_config=FAST_HEALTH_CHECKS) as test_cluster:
        yield test_cluster


def elastic_job(storage: str, **kw) -> ElasticJob:
    base = dict(model=SPEC.to_dict(), cluster=NODES, global_batch=4, storage=storage_spec(storage),
                dtype="float64", cloud_every=2, collective_timeout_s=30, detect_timeout_s=30,
                plan=asymmetric_plan())
    return ElasticJob(**(base | kw))


def reference_losses(steps: int) -> list[float]:
    ref = Reference(model_spec=SPEC, dtype=torch.float64)
    return [ref.train_step(synthetic_batch(vocab_size=SPEC.vocab_size, global_batch=4, seq_len=16, seed=0,
                                           step=i))["loss"] for i in range(steps)]


def node_handle(test_cluster, name: str):
    for node in test_cluster.list_all_nodes():
        raw = [n for n in ray.nodes() if n["NodeID"] == node.node_id and n["Alive"]]
        if raw and raw[0]["Labels"].get("autohet.io/node") == name:
            return node
    raise AssertionError(f"no live node {name}")


def test_node_loss_mid_step_recovers_from_keepers_and_matches_reference(cluster, tmp_path):
    ctl = ElasticController(elastic_job(str(tmp_path / "cloud")))
    try:
        ctl.start()
        before = [ctl.step()["loss"] for _ in range(3)]
        victim = node_handle(cluster, "b")

        def lose_node_b(controller):
            controller.mark_fault()
            cluster.remove_node(victim, allow_graceful=False)

        first = ctl.step(fault_hook=lose_node_b)
        rec = first["recovery"]
        after = [ctl.step()["loss"] for _ in range(2)]
    finally:
        ctl.close()
    assert rec["lost_nodes"] == ["b"] and "node b" in rec["message"]
    assert all("b:" not in stage for p in rec["plan"] for stage in p), rec["plan"]
    assert rec["bytes_by_tier"].get("cloud", 0) == 0                 # peer replicas cover a single-node loss
    assert rec["bytes_by_tier"].get("keeper-a", 0) + rec["bytes_by_tier"].get("keeper-c", 0) > 0
    assert rec["lost_steps"] <= 1 and rec["restored_step"] in (2, 3)
    for phase in ("detect_s", "replan_s", "restart_s", "fetch_s", "load_s", "first_step_s"):
        assert rec[phase] >= 0, phase
    assert rec["detect_s"] < 20
    ref = reference_losses(rec["restored_step"] + 3)
    assert before == pytest.approx(ref[:3], rel=1e-6)
    resumed = [first["loss"], *after]                                # steps restored+1 .. restored+3
    assert resumed == pytest.approx(ref[rec["restored_step"]:rec["restored_step"] + 3], rel=1e-6)
