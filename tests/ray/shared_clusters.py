"""One emulated Ray cluster shared by consecutive test modules that ask for the same shape.

A module declares its cluster with `cluster = shared_cluster(THREE_NODES, ...)` instead of its own module-scoped
fixture. tests/ray/conftest.py runs the modules of one shape one after the other; each module gets a new driver
(so the last module's actors die with its job), and a fresh cluster whenever the one left by the previous module
is not as it started: a node removed, added or dead (a raylet paused past the health checks), a detached actor
left alive (such as a node keeper after a killed driver), or resources still held. The cluster is shut down once
no later module needs it.
"""
from __future__ import annotations

import json
import sys
import time

import pytest

# module name -> (shape key, whether its tests change the cluster's nodes); filled when the modules are imported
KEY_OF_MODULE: dict[str, tuple[str, bool]] = {}
# fixture name defined in a conftest -> shape key
KEY_OF_FIXTURE: dict[str, str] = {}
# module name -> the shape key of the cluster that any of its collected tests asks for
KEY_OF_COLLECTED: dict[str, str] = {}
SETTLE_S = 15.0          # how long a previous job's actors may take to release their resources
# Ray's own detached singleton that Ray Train (through Ray Data's autoscaling) creates on a first run and every later
# run reuses (get_if_exists); it holds no resources. Part of the cluster once made: waiting for it to go would
# cost every module after a Ray Train module SETTLE_S and a fresh cluster.
RAY_SINGLETONS = ({"namespace": "AutoscalingCoordinator", "name": "AutoscalingCoordinator"},)


def cluster_key(spec: dict, system_config, head_cpus: float, cpus_per_gpu: float) -> str:
    return json.dumps([spec, system_config, head_cpus, cpus_per_gpu], sort_keys=True)


def shared_cluster(spec: dict, *, system_config=None, head_cpus: float = 1, cpus_per_gpu: float = 0,
                   changes_nodes: bool = False, name: str = "cluster", module: str | None = None):
    """A module-scoped fixture yielding the emulated cluster of `spec` (a cluster-file dict), shared with the
    neighbouring modules of the same shape. `changes_nodes`: the module removes or adds nodes, so it runs last
    among them (its cluster is replaced after it either way). Call it at module level of a test module (or a
    conftest, then `name` must be the fixture's name), or name the test module as `module`."""
    key = cluster_key(spec, system_config, head_cpus, cpus_per_gpu)
    caller = module or sys._getframe(1).f_globals["__name__"]
    if caller.endswith("conftest"):
        KEY_OF_FIXTURE[name] = key
    else:
        KEY_OF_MODULE[caller] = (key, changes_nodes)

    def start():
        from autohet_ray.cluster.spec import cluster_from_dict
        from autohet_ray.emulate.cluster import emulated_cluster
        return emulated_cluster(cluster_from_dict(spec), head_cpus=head_cpus, cpus_per_gpu=cpus_per_gpu,
                                system_config=system_config)

    @pytest.fixture(scope="module", name=name)
    def fixture(request, shared_clusters):
        yield shared_clusters.get(key, start)
        if key_of_next_module(request) != key:
            shared_clusters.close()
    return fixture


def key_of_item(item) -> str | None:
    if item.module.__name__ in KEY_OF_MODULE:
        return KEY_OF_MODULE[item.module.__name__][0]
    keys = {KEY_OF_FIXTURE[name] for name in item.fixturenames if name in KEY_OF_FIXTURE}
    assert len(keys) <= 1, f"{item.nodeid} asks for several shared clusters"
    return keys.pop() if keys else None


def key_of_next_module(request) -> str | None:
    items = request.session.items
    last = max(i for i, item in enumerate(items) if item.module is request.module)
    return KEY_OF_COLLECTED.get(items[last + 1].module.__name__) if last + 1 < len(items) else None


def group_by_cluster(items: list) -> list:
    """`items` with the modules of one shared cluster run one after the other, at the place of the first of
    them; among them, the modules that change nodes last. Every other module keeps its place."""
    blocks: list[list] = []
    for item in items:
        if blocks and blocks[-1][0].module is item.module:
            blocks[-1].append(item)
        else:
            blocks.append([item])
    groups: dict[str, list[list]] = {}
    order: list = []
    for block in blocks:
        keys = {key_of_item(item) for item in block} - {None}
        assert len(keys) <= 1, f"{block[0].module.__name__} asks for several shared clusters"
        key = keys.pop() if keys else None
        if key is not None:
            KEY_OF_COLLECTED[block[0].module.__name__] = key
        if key is None:
            order.append(block)
        elif key in groups:
            groups[key].append(block)
        else:
            groups[key] = [block]
            order.append(key)
    out = []
    for entry in order:
        for block in (sorted(groups[entry], key=changes_nodes) if isinstance(entry, str) else [entry]):
            out.extend(block)
    return out


def changes_nodes(block: list) -> bool:
    return KEY_OF_MODULE.get(block[0].module.__name__, ("", False))[1]


class SharedClusters:
    """At most one live cluster (a driver connects to one cluster at a time)."""

    def __init__(self):
        self.key = None
        self.cluster = None
        self._context = None
        self._node_ids: list[str] = []

    def get(self, key: str, start):
        if self.key == key and self._reconnect_and_check():
            return self.cluster
        self.close()
        self._context = start()
        self.cluster = self._context.__enter__()
        self.key = key
        self._node_ids = sorted(node.node_id for node in self.cluster.list_all_nodes())
        return self.cluster

    def _reconnect_and_check(self) -> bool:
        """A new driver on the cluster; True when the cluster has its first nodes, all alive, and nothing else,
        once the old job's actors are gone and their resources free."""
        import ray
        ray.shutdown()
        ray.init(address=self.cluster.address)
        if not self._same_nodes():
            return False
        deadline = time.monotonic() + SETTLE_S
        while not self._idle():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.25)
        return self._same_nodes()

    def _same_nodes(self) -> bool:
        import ray
        nodes = ray.nodes()
        return (sorted(n["NodeID"] for n in nodes) == self._node_ids and all(n["Alive"] for n in nodes)
                and sorted(node.node_id for node in self.cluster.list_all_nodes()) == self._node_ids)

    @staticmethod
    def _idle() -> bool:
        """No named actor (a detached keeper outlives its driver) but Ray's own singletons, and every logical
        resource free."""
        import ray
        if any(actor not in RAY_SINGLETONS for actor in ray.util.list_named_actors(all_namespaces=True)):
            return False
        total, free = ray.cluster_resources(), ray.available_resources()
        return all(free.get(name, 0) == amount for name, amount in total.items()
                   if name not in ("memory", "object_store_memory"))

    def close(self) -> None:
        if self._context is not None:
            context, self._context, self.cluster, self.key = self._context, None, None, None
            context.__exit__(None, None, None)
