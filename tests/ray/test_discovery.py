"""Discovery from `ray.nodes()` entries (no cluster needed): labels, accelerator_type resources, clear errors."""
from __future__ import annotations

import pytest

from autohet_ray import ConfigError
from autohet_ray.cluster.spec import cluster_from_dict
from autohet_ray.orchestrate.discovery import check_plan_fits, discover
from autohet_ray.plan.schema import plan_from_dict
from ray_helpers import THREE_NODES, asymmetric_plan


def _node(node_id: str, gpus: int, labels: dict | None = None, resources: dict | None = None, alive=True) -> dict:
    return {"NodeID": node_id, "Alive": alive, "NodeManagerAddress": "10.0.0.1", "Labels": labels or {},
            "Resources": {"CPU": 8.0, "GPU": float(gpus), **(resources or {})}}


def test_gpu_type_from_label_or_resource_and_node_names():
    raw = [_node("aa" * 28, 8, {"ray.io/accelerator-type": "H100"}),
           _node("bb" * 28, 4, resources={"accelerator_type:A100-80GB": 1.0}),
           _node("cc" * 28, 0), _node("dd" * 28, 8, {"ray.io/accelerator-type": "H20"}, alive=False)]
    found = discover(raw_nodes=raw)
    assert [(n.name, n.device_type, n.num_gpus) for n in found.nodes] == [("node-aaaaaaaa", "H100", 8),
                                                                         ("node-bbbbbbbb", "A100-80GB", 4)]
    assert found.cluster.num_gpus == 12 and not found.emulated and found.single_host


def test_errors_name_what_is_wrong():
    with pytest.raises(ConfigError, match="has 8 GPUs but no ray.io/accelerator-type label"):
        discover(raw_nodes=[_node("ee" * 28, 8)])
    with pytest.raises(ConfigError, match="no GPU nodes"):
        discover(raw_nodes=[_node("ff" * 28, 0)])
    labelled = [_node(c * 56, n, {"ray.io/accelerator-type": d, "autohet.io/node": name})
                for c, (name, d, n) in zip("abc", [("a", "H800", 1), ("b", "H20", 1), ("c", "H20", 2)])]
    with pytest.raises(ConfigError, match="node 'b': the cluster file says H800 but Ray reports H20"):
        discover(cluster_from_dict(THREE_NODES), raw_nodes=labelled)


def test_plan_needing_more_gpus_than_a_node_has():
    labelled = [_node(c * 56, n, {"ray.io/accelerator-type": d, "autohet.io/node": name})
                for c, (name, d, n) in zip("abc", [("a", "H800", 1), ("b", "H800", 1), ("c", "H20", 1)])]
    found = discover(cluster_from_dict(THREE_NODES), raw_nodes=labelled)
    with pytest.raises(ConfigError, match="needs GPU 1 of node 'c' for pipeline 0 stage 0, but that node has only 1"):
        check_plan_fits(plan_from_dict(asymmetric_plan()), found)
