"""Find the GPU nodes of the live Ray cluster (`cluster/live.py` reads Ray's node entries), and confirm each
node's type by asking the node: one pinned Ray task per node reads the device name.

On a real GPU node the task takes one GPU (`num_gpus=1`) and reports `torch.cuda.get_device_name(0)`, the
visible device count and the total memory. Emulated nodes (`autohet.io/emulated=true`) offer fake GPUs, so
their task asks for no GPU and reports the type from the node's own labels, marked emulated.
`cluster.device_check` checks each report against the node's labels.
"""
from __future__ import annotations

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from autohet_ray import ConfigError
from autohet_ray.cluster.device_check import DeviceReport, check_report
from autohet_ray.cluster.labels import ACCELERATOR_LABEL, EMULATED_LABEL
from autohet_ray.cluster.live import Discovered, LiveNode, describe, gpu_nodes
from autohet_ray.cluster.spec import Cluster
from autohet_ray.elastic.liveness import refused_raylets

DEFAULT_TIMEOUT_S = 60.0


def live_nodes(raw_nodes: list[dict] | None = None) -> list[LiveNode]:
    """Alive nodes with GPUs, from `ray.nodes()` (or the given list of its entries). A node Ray still lists
    as alive whose raylet refuses connections has died (Ray's health checks have not noticed yet): left out."""
    if raw_nodes is not None:
        return gpu_nodes(raw_nodes)
    raws = ray.nodes()
    return gpu_nodes(raws, refused_raylets(raws))


def discover(base: Cluster | None = None, raw_nodes: list[dict] | None = None,
             prefer: frozenset[str] = frozenset()) -> Discovered:
    """The live cluster from labels and resources; with `base` (a cluster file), its links and custom devices,
    checked against Ray, and its node types' live instances (`prefer`: node ids a type keeps first).
    `discover_confirmed` also asks each node's device."""
    return describe(base, live_nodes(raw_nodes), prefer)


def _probe() -> dict:
    context = ray.get_runtime_context()
    labels = context.get_node_labels()
    out = {"node_id": context.get_node_id(), "emulated": labels.get(EMULATED_LABEL) == "true"}
    if out["emulated"]:
        return out | {"name": labels.get(ACCELERATOR_LABEL), "count": 0, "total_memory": None}
    import torch  # lazy: torch, on the probed node only
    if not torch.cuda.is_available():
        return out | {"name": None, "count": 0, "total_memory": None}
    return out | {"name": torch.cuda.get_device_name(0), "count": torch.cuda.device_count(),
                  "total_memory": torch.cuda.get_device_properties(0).total_memory}


_probe_task = ray.remote(_probe)


def _submit(node: LiveNode):
    return _probe_task.options(
        num_cpus=0, num_gpus=0 if node.emulated else 1, max_retries=0, name=f"autohet-device-probe-{node.name}",
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node.node_id, soft=False)).remote()


def probe_nodes(nodes: list[LiveNode], timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[str, DeviceReport]:
    """Run the probe on every node at once; reports by node id. ConfigError naming the nodes that did not
    answer within `timeout_s`, or the node whose probe failed."""
    refs = {_submit(n): n for n in nodes}
    ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
    if pending:
        for ref in pending:
            ray.cancel(ref, force=True)
        late = ", ".join(f"{refs[r].name} (node id {refs[r].node_id[:8]}, {refs[r].num_gpus}x "
                         f"{refs[r].device_type})" for r in pending)
        raise ConfigError(f"device check: no answer within {timeout_s:g} s from node(s) {late}; the probe task "
                          f"needs one free GPU there (GPUs busy with another job, or the node unreachable?)")
    reports = {}
    for ref in ready:
        node = refs[ref]
        try:
            reports[node.node_id] = DeviceReport(**ray.get(ref))
        except ray.exceptions.RayError as e:
            raise ConfigError(f"device check: the probe task on node {node.name} failed: {e}") from e
    return reports


def confirm_nodes(nodes: list[LiveNode], timeout_s: float = DEFAULT_TIMEOUT_S) -> list[LiveNode]:
    """`nodes` with device types confirmed by a task on each node (see the module doc)."""
    reports = probe_nodes(nodes, timeout_s)
    return [check_report(n, reports[n.node_id]) for n in nodes]


def discover_confirmed(base: Cluster | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> Discovered:
    """`discover` with every GPU node's type confirmed by the device that answers on it."""
    return describe(base, confirm_nodes(live_nodes(), timeout_s))
