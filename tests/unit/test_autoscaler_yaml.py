"""jobs/aws-spot-cluster.yaml passes Ray's own autoscaler config validator (defaults filled as `ray up` does),
and both spot examples give every GPU worker type a catalog accelerator label and a spot market label."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from autohet_ray.cluster.catalog import CATALOG

JOBS = Path(__file__).resolve().parents[2] / "jobs"


def test_aws_spot_cluster_passes_ray_validator():
    pytest.importorskip("jsonschema")
    from ray.autoscaler._private.util import prepare_config, validate_config
    config = yaml.safe_load((JOBS / "aws-spot-cluster.yaml").read_text())
    validate_config(prepare_config(config))                      # raises on any schema or consistency error
    workers = {n: t for n, t in config["available_node_types"].items() if n != config["head_node_type"]}
    assert len(workers) >= 2
    types = set()
    for name, node_type in workers.items():
        labels = node_type["labels"]
        assert labels["ray.io/market-type"] == "spot", name
        assert labels["ray.io/accelerator-type"] in CATALOG, name
        assert node_type["node_config"]["InstanceMarketOptions"]["MarketType"] == "spot", name
        assert node_type["resources"]["GPU"] > 0, name
        types.add(labels["ray.io/accelerator-type"])
    assert len(types) == len(workers)                             # one spot node type per GPU type
    head = config["available_node_types"][config["head_node_type"]]
    assert "InstanceMarketOptions" not in head["node_config"]      # the controller's node is on-demand


def test_broken_aws_config_is_rejected_by_ray_validator():
    pytest.importorskip("jsonschema")
    import jsonschema
    from ray.autoscaler._private.util import prepare_config, validate_config
    config = yaml.safe_load((JOBS / "aws-spot-cluster.yaml").read_text())
    config["available_node_types"]["h100-spot"]["labels"]["ray.io/market-type"] = 1      # labels are strings
    with pytest.raises(jsonschema.ValidationError):
        validate_config(prepare_config(config))


def test_kuberay_spot_groups_are_labelled():
    cluster = yaml.safe_load((JOBS / "kuberay-spot.yaml").read_text())
    assert cluster["kind"] == "RayCluster" and cluster["apiVersion"] == "ray.io/v1"
    for group in cluster["spec"]["workerGroupSpecs"]:
        labels = dict(kv.split("=", 1) for kv in group["rayStartParams"]["labels"].split(","))
        assert labels["ray.io/market-type"] == "spot" and labels["ray.io/accelerator-type"] in CATALOG
        assert group["template"]["spec"]["nodeSelector"]["eks.amazonaws.com/capacityType"] == "SPOT"


def _node_entry(index: int, labels: dict, gpus: int) -> dict:
    """The `ray.nodes()` entry a node started from an autoscaler node type or a KubeRay group registers with."""
    return {"NodeID": f"{index:056x}", "Alive": True, "NodeManagerAddress": f"10.0.0.{index}",
            "Resources": {"GPU": gpus} if gpus else {"CPU": 4}, "Labels": labels}


def _discovered_types(entries: list[dict]) -> dict[str, str]:
    """Node id -> the node type of jobs/clusters/aws-spot-types.yaml that discovery maps it to."""
    from autohet_ray.cluster.live import describe, gpu_nodes
    from autohet_ray.cluster.spec import load_cluster
    found = describe(load_cluster(str(JOBS / "clusters" / "aws-spot-types.yaml")), gpu_nodes(entries))
    return {n.name: n.node_type for n in found.cluster.nodes}


def test_every_aws_worker_type_is_discovered_as_its_node_type():
    config = yaml.safe_load((JOBS / "aws-spot-cluster.yaml").read_text())
    entries, expected = [], {}
    for index, (name, node_type) in enumerate(config["available_node_types"].items()):
        entries.append(_node_entry(index, node_type.get("labels", {}), node_type["resources"].get("GPU", 0)))
        if name != config["head_node_type"]:
            expected[entries[-1]["NodeID"]] = name         # the autoscaler's type name is the file's type name
    assert _discovered_types(entries) == expected           # the head (no GPUs) is no node type's


def test_every_kuberay_group_is_discovered_as_its_node_type():
    cluster = yaml.safe_load((JOBS / "kuberay-spot.yaml").read_text())
    entries, expected = [], {}
    for index, group in enumerate(cluster["spec"]["workerGroupSpecs"]):
        labels = dict(kv.split("=", 1) for kv in group["rayStartParams"]["labels"].split(","))
        gpus = int(group["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
        entries.append(_node_entry(index, labels, gpus))      # KubeRay gives Ray the container's GPU limit
        expected[entries[-1]["NodeID"]] = group["groupName"]
    assert _discovered_types(entries) == expected
