"""Cluster files that describe node types: parsing and bounds, live nodes mapped to types by labels and resources
(named by their Ray node ids), the start's check, and what the job asks the autoscaler for."""
from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest

from autohet_ray import ConfigError
from autohet_ray.cluster.live import LiveNode, check_types, describe, gpu_nodes
from autohet_ray.cluster.spec import MAX_NODES, cluster_from_dict
from autohet_ray.job.fleet import fleet_bundles, next_counts
from autohet_ray.safe_names import plain_name

TYPES = {"name": "fleet", "types": [{"name": "h100-spot", "device": "H100", "count": 8, "spot": True, "max": 2},
                                    {"name": "a100", "device": "A100-80GB", "count": 8, "min": 1, "max": 1}]}
ID = "f" * 51 + "0000{}"                 # the fake provider's ids: they differ only in their last digits


def raw_node(index: int, device: str, market: str | None, gpus: int = 8, name: str | None = None) -> dict:
    labels = {"ray.io/accelerator-type": device} | ({"ray.io/market-type": market} if market else {})
    return {"NodeID": ID.format(index), "Alive": True, "NodeManagerAddress": "10.0.0.1",
            "Resources": {"GPU": gpus}, "Labels": labels | ({"autohet.io/node": name} if name else {})}


def test_a_types_file_stands_for_each_types_max_and_round_trips():
    cluster = cluster_from_dict(TYPES)
    assert [(n.name, n.node_type, n.spot) for n in cluster.nodes] == [
        ("h100-spot-0", "h100-spot", True), ("h100-spot-1", "h100-spot", True), ("a100-0", "a100", False)]
    assert cluster_from_dict(cluster.to_dict()) == cluster


def test_live_nodes_are_instances_of_their_type_named_by_node_id():
    raws = [raw_node(1, "H100", "spot"), raw_node(2, "A100-80GB", None), raw_node(3, "H100", "on-demand"),
            raw_node(4, "H100", "spot", gpus=4), raw_node(5, "H100", "spot"), raw_node(6, "H100", "spot")]
    found = describe(cluster_from_dict(TYPES), gpu_nodes(raws), prefer=frozenset({ID.format(6)}))
    # 3: on-demand H100s are no type's; 4: 4 GPUs, not 8; of the spot H100s 1, 5 and 6, the max of 2 keeps the
    # node the job runs on (6) and then the lowest id
    assert [(n.name, n.node_type) for n in found.cluster.nodes] == [
        (ID.format(6), "h100-spot"), (ID.format(1), "h100-spot"), (ID.format(2), "a100")]
    assert found.node_ids[ID.format(1)] == ID.format(1)
    for node in found.cluster.nodes:     # a node id is a plain name for node stores, keepers and manifests
        assert plain_name(node.name, where="test", field="node") == node.name
    assert found.cluster.device_types() == ["H100", "A100-80GB"]


def test_named_nodes_keep_working_beside_types():
    raw = {**TYPES, "nodes": [{"name": "head-gpus", "device": "L40S", "count": 4}]}
    found = describe(cluster_from_dict(raw), gpu_nodes([raw_node(1, "L40S", None, 4, name="head-gpus"),
                                                        raw_node(2, "A100-80GB", "on-demand")]))
    assert [n.name for n in found.cluster.nodes] == ["head-gpus", ID.format(2)]
    with pytest.raises(ConfigError, match="node 'head-gpus' of the cluster file is not in the Ray cluster"):
        describe(cluster_from_dict(raw), gpu_nodes([raw_node(2, "A100-80GB", None)]))


def test_a_type_that_matches_no_live_node_is_one_line():
    live = gpu_nodes([raw_node(2, "A100-80GB", None)])
    found = describe(cluster_from_dict(TYPES), live)
    with pytest.raises(ConfigError) as err:
        check_types(found, live, autoscaled=False)
    message = str(err.value)
    assert "node type 'h100-spot' (8x H100, spot: nodes with ray.io/accelerator-type=H100, " \
           "ray.io/market-type=spot and 8 GPUs) matches 0 live Ray node(s), needs 1" in message
    assert "\n" not in message
    check_types(found, live, autoscaled=True)         # the autoscaler may bring it: only min counts
    with pytest.raises(ConfigError, match="no live Ray node matches a node type"):
        describe(cluster_from_dict(TYPES), gpu_nodes([raw_node(3, "V100", None)]))


@pytest.mark.parametrize("entry, fragment", [
    ({"types": [{"name": "t", "device": "H100", "count": 8, "max": -1}]}, "types[0].max=-1 must be a whole number"),
    ({"types": [{"name": "t", "device": "H100", "count": 8, "max": float("nan")}]}, "types[0].max=nan must be"),
    ({"types": [{"name": "t", "device": "H100", "count": 8, "min": -2, "max": 1}]}, "types[0].min=-2 must be"),
    ({"types": [{"name": "t", "device": "H100", "count": 8, "min": 3, "max": 2}]}, "min=3, max=2"),
    ({"types": [{"name": "t", "device": "H100", "count": 8, "max": 10 ** 9}]},
     f"types[0].max=1000000000 is more nodes than the planner can hold (at most {MAX_NODES}"),
    ({"nodes": [{"name": "a", "device": "H100", "count": 8, "replicas": 10 ** 9}]},
     f"nodes[0].replicas=1000000000 is more nodes than the planner can hold (at most {MAX_NODES}"),
    ({"nodes": [{"name": "a", "device": "H100", "count": 8, "replicas": 600},
                {"name": "b", "device": "H100", "count": 8, "replicas": 600}]}, "add up to 1200 nodes"),
    ({"nodes": [{"name": "a", "device": "H100", "count": 8, "type": "x"}]}, "of type 'x', which is not in types"),
])
def test_bad_counts_are_one_line(entry, fragment):
    with pytest.raises(ConfigError, match=None) as err:
        cluster_from_dict({"name": "bad", **entry})
    assert fragment in str(err.value) and "\n" not in str(err.value)


@pytest.mark.cli
def test_a_billion_replicas_is_refused_by_plan_objective_cost_not_run_out_of_memory(tmp_path):
    (tmp_path / "huge.yaml").write_text("name: huge\nnodes: [{name: h800, device: H800, count: 8, "
                                        "replicas: 1000000000}]\n")
    out = subprocess.run([sys.executable, "-m", "autohet_ray.cli", "plan", "--cluster", str(tmp_path / "huge.yaml"),
                          "--model", "llama-13b", "--global-batch", "256", "--prices", "jobs/clusters/prices.yaml",
                          "--objective", "cost"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().count("\n") == 0 and "replicas=1000000000" in out.stderr and str(MAX_NODES) in out.stderr


def test_the_fleet_request_keeps_replacements_and_gives_back_idle_nodes():
    types = cluster_from_dict(TYPES).types
    asked = {"h100-spot": 2, "a100": 1}
    # a reclaimed spot node: one left, and the plan uses it: the replacement stays asked for
    assert next_counts(types, asked, Counter({"h100-spot": 1, "a100": 1}), Counter({"h100-spot": 1, "a100": 1})) == asked
    # the plan leaves a spot node idle: given back; never below a type's min (the A100 type needs 1)
    assert next_counts(types, asked, Counter({"h100-spot": 2, "a100": 1}), Counter({"h100-spot": 1})) == {
        "h100-spot": 1, "a100": 1}
    bundles, selectors = fleet_bundles(types, {"h100-spot": 2, "a100": 1})
    assert bundles == [{"GPU": 8}] * 3
    assert selectors == [{"ray.io/accelerator-type": "H100", "ray.io/market-type": "spot"}] * 2 + [
        {"ray.io/accelerator-type": "A100-80GB", "ray.io/market-type": "on-demand"}]
