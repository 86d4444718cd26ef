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
