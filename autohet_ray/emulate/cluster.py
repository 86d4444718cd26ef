"""Emulated heterogeneous clusters on one machine: one Ray node per cluster-file node, offering fake GPUs
(the `GPU` resource) labelled with the node's GPU type, so discovery, placement and stage actors take the
same path as on real GPU nodes. Only the stage actors' clock differs (see `pacer.py`).
"""
from __future__ import annotations

import contextlib

import ray
from ray.cluster_utils import Cluster as RayTestCluster

from autohet_ray.checkpoint.node_store import sweep_node_stores
from autohet_ray.cluster.labels import (ACCELERATOR_LABEL, EMULATED_LABEL, MARKET_LABEL, NODE_NAME_LABEL, ON_DEMAND_MARKET,
                                        SPOT_MARKET, gpu_resource, label_value)
from autohet_ray.cluster.spec import Cluster, Node

# Ray's test cluster gives each node a 150 MiB object store, far below a real node's; keepers hold
# checkpoint chunks there (and would spill to disk at every step), so emulated nodes get more.
EMULATED_OBJECT_STORE_BYTES = 768 << 20
# Ray's `_system_config` for clusters whose lost nodes must be declared dead fast: after 3 missed 1 s health
# checks (Ray's default takes much longer). The tests' and the benchmarks' emulated clusters use it.
FAST_HEALTH_CHECKS = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3,
                      "health_check_initial_delay_ms": 1000}


def node_args(node: Node, *, num_cpus: float = 0, cpus_per_gpu: float = 0) -> dict:
    """Ray test-cluster node options standing for `node`: fake GPUs, a per-type custom resource and labels (and
    logical CPUs, `cpus_per_gpu` per GPU, for frameworks such as Ray Train's CPU workers that ask for CPUs). An
    instance of a node type carries no node name, as an autoscaler's node does: discovery names it by its id."""
    return {"num_cpus": num_cpus + cpus_per_gpu * node.count, "num_gpus": node.count,
            "object_store_memory": EMULATED_OBJECT_STORE_BYTES, "resources": {gpu_resource(node.device): node.count},
            "labels": emulated_labels(node.device, spot=node.spot)
                      | ({NODE_NAME_LABEL: node.name} if node.node_type is None else {})}


def emulated_labels(device: str, *, spot: bool) -> dict[str, str]:
    """The labels of an emulated node of `device`: what discovery reads (cluster/live.py)."""
    return {ACCELERATOR_LABEL: label_value(device), MARKET_LABEL: SPOT_MARKET if spot else ON_DEMAND_MARKET,
            EMULATED_LABEL: "true"}


@contextlib.contextmanager
def emulated_cluster(cluster: Cluster, *, head_cpus: float = 1, cpus_per_gpu: float = 0, connect: bool = True,
                     system_config=None):
    """Start one local Ray node per node of `cluster` (the first is the head); yields the Ray test cluster
    (connected with `ray.init` when `connect`). Everything is shut down on exit."""
    first, *rest = cluster.nodes
    head = node_args(first, num_cpus=head_cpus, cpus_per_gpu=cpus_per_gpu) | {"include_dashboard": False}
    if system_config:
        head["_system_config"] = system_config
    test_cluster = RayTestCluster(initialize_head=True, head_node_args=head)
    try:
        for node in rest:
            test_cluster.add_node(**node_args(node, cpus_per_gpu=cpus_per_gpu))
        test_cluster.wait_for_nodes()
        if connect:
            ray.init(address=test_cluster.address)
        yield test_cluster
    finally:
        seen = [n["NodeID"] for n in ray.nodes()] if ray.is_initialized() else []
        if connect and ray.is_initialized():
            ray.shutdown()
        test_cluster.shutdown()
        sweep_node_stores(seen)          # stores of nodes that died without their keeper's close


def lose_node(test_cluster, node) -> None:
    """Lose `node` of a Ray test cluster as a real node is lost: its processes die at once, and with them its
    RAM, so its node stores go too (emulated nodes share this host's /dev/shm, where a dead node's stores
    would otherwise stay until the cluster is shut down: a benchmark losing a node again and again ran out of
    memory)."""
    test_cluster.remove_node(node, allow_graceful=False)
    sweep_node_stores([node.node_id])

