"""Discovery from `ray.nodes()` entries (no cluster needed): labels, accelerator_type resources, clear errors."""
from __future__ import annotations

import pytest

from autohet_ray import ConfigError
from autohet_ray.cluster.spec import cluster_from_dict
from autohet_ray.job.plan_choice import check_plan_fits
from autohet_ray.orchestrate.discovery import discover
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


# -- device confirmation: a task on each node reads its device ---------------------------------------------------

def _live(name="b", device="H800", emulated=False, node_id="bb" * 28, gpus=1):
    from autohet_ray.cluster.live import LiveNode
    return LiveNode(name=name, node_id=node_id, ip="10.0.0.1", device_type=device, num_gpus=gpus, emulated=emulated)


def _report(name, memory_gib=None, node_id="bb" * 28, emulated=False, count=1):
    from autohet_ray.cluster.device_check import DeviceReport
    return DeviceReport(node_id=node_id, emulated=emulated, name=name, count=count,
                        total_memory=None if memory_gib is None else int(memory_gib * 1024 ** 3))


def test_probe_runs_on_every_node_and_confirms_the_labels(three_node_cluster):
    from autohet_ray.orchestrate.discovery import discover_confirmed, probe_nodes
    from autohet_ray.orchestrate.discovery import live_nodes
    nodes = live_nodes()
    reports = probe_nodes(nodes, timeout_s=60)
    assert {n.node_id: (reports[n.node_id].node_id, reports[n.node_id].emulated, reports[n.node_id].name)
            for n in nodes} == {n.node_id: (n.node_id, True, n.device_type) for n in nodes}
    found = discover_confirmed(cluster_from_dict(THREE_NODES), timeout_s=60)
    assert [(n.name, n.device_type, n.num_gpus) for n in found.nodes] == [("a", "H800", 1), ("b", "H800", 1),
                                                                         ("c", "H20", 2)]
    assert found == discover(cluster_from_dict(THREE_NODES))


def test_a_node_that_does_not_answer_in_time_is_named(three_node_cluster):
    from autohet_ray.orchestrate.discovery import probe_nodes
    from autohet_ray.orchestrate.discovery import live_nodes
    with pytest.raises(ConfigError, match=r"no answer within 0 s from node\(s\) a \(node id \w{8}, 1x H800\)"):
        probe_nodes([n for n in live_nodes() if n.name == "a"], timeout_s=0)


def test_label_and_answering_device_must_agree():
    from autohet_ray.cluster.device_check import check_report
    with pytest.raises(ConfigError, match=r"node b \(node id bbbbbbbb\) is labelled ray.io/accelerator-type='H800' "
                                          r"but its device reports 'NVIDIA H20': that is catalog type H20"):
        check_report(_live(), _report("NVIDIA H20", 95.6))
    with pytest.raises(ConfigError, match=r"labelled .*'A100-40GB' but its device reports 'NVIDIA A100-SXM4-80GB'"):
        check_report(_live(device="A100-40GB"), _report("NVIDIA A100-SXM4-80GB", 79.3))
    with pytest.raises(ConfigError, match=r"'H800' but its device reports 'NVIDIA A800-SXM4-80GB': .*unknown model"):
        check_report(_live(), _report("NVIDIA A800-SXM4-80GB"))
    with pytest.raises(ConfigError, match="offers 1 GPUs to Ray but the probe task given one of them sees no CUDA"):
        check_report(_live(), _report(None, count=0))
    with pytest.raises(ConfigError, match="custom device label must name the model as CUDA reports it"):
        check_report(_live(device="MyGPU"), _report("NVIDIA A800-SXM4-80GB"))
    with pytest.raises(ConfigError, match=r"reports 'H20' \(emulated\): the node's labels changed"):
        check_report(_live(emulated=True), _report("H20", emulated=True))


def test_ray_names_and_custom_labels_resolve_to_the_confirmed_type():
    from autohet_ray.cluster.device_check import check_report
    assert check_report(_live(device="A100"), _report("NVIDIA A100-SXM4-80GB", 79.3)).device_type == "A100-80GB"
    assert check_report(_live(device="GeForce-RTX-4090"), _report("NVIDIA GeForce RTX 4090")).device_type == "RTX-4090"
    assert check_report(_live(device="H800"), _report("NVIDIA H800", 79.3)).device_type == "H800"
    assert check_report(_live(device="A800"), _report("NVIDIA A800-SXM4-80GB")).device_type == "A800"
    assert check_report(_live(emulated=True), _report("H800", emulated=True)).device_type == "H800"
