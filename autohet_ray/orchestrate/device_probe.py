"""Confirm each GPU node's type by asking the node: one pinned Ray task per node reads the device name.

On a real GPU node the task takes one GPU (`num_gpus=1`) and reports `torch.cuda.get_device_name(0)`, the
visible device count and the total memory; the name is mapped to a catalog type (`cluster.device_names`) and
must agree with the node's `ray.io/accelerator-type` label. Emulated nodes (`autohet.io/emulated=true`) offer
fake GPUs, so their task asks for no GPU and reports the type from the node's own labels, marked emulated.
Labels may be catalog names or the names Ray sets on its own ("A100", "GeForce-RTX-4090"); a confirmed node
carries the catalog type. A label that no catalog type answers to (a custom device of the cluster file) must
name the model as CUDA does: its tokens must all appear in the reported name ("A800" in "NVIDIA A800-SXM4-80GB").
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from autohet_ray import ConfigError
from autohet_ray.cluster.catalog import CATALOG
from autohet_ray.cluster.device_names import catalog_type, name_tokens
from autohet_ray.cluster.spec import Cluster
from autohet_ray.orchestrate.discovery import Discovered, LiveNode, describe, live_nodes
from autohet_ray.orchestrate.labels import ACCELERATOR_LABEL, EMULATED_LABEL, label_value

DEFAULT_TIMEOUT_S = 60.0
# Names Ray itself puts in ray.io/accelerator-type for catalog types whose names differ (see
# ray.util.accelerators and ray/_private/accelerators/nvidia_gpu.py).
RAY_ALIASES = {"A100-40GB": ("A100", "A100-40G"), "A100-80GB": ("A100", "A100-80G"),
               "RTX-4090": ("GeForce-RTX-4090",)}


@dataclass(frozen=True, kw_only=True)
class DeviceReport:
    """What the probe task on one node saw."""
    node_id: str
    emulated: bool
    name: str | None            # CUDA device name; the label's type on emulated nodes; None: no CUDA device
    count: int                  # CUDA devices visible to the task (the GPUs Ray gave it)
    total_memory: int | None    # bytes, device 0


def _probe() -> dict:
    context = ray.get_runtime_context()
    labels = context.get_node_labels()
    out = {"node_id": context.get_node_id(), "emulated": labels.get(EMULATED_LABEL) == "true"}
    if out["emulated"]:
        return out | {"name": labels.get(ACCELERATOR_LABEL), "count": 0, "total_memory": None}
    import torch
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


def _label_names(device: str) -> set[str]:
    return {device, label_value(device), *RAY_ALIASES.get(device, ())}


def _mismatch(node: LiveNode, report: DeviceReport, why: str) -> ConfigError:
    seen = f"{report.name!r}" + (" (emulated)" if report.emulated else "")
    return ConfigError(f"device check: node {node.name} (node id {node.node_id[:8]}) is labelled "
                       f"{ACCELERATOR_LABEL}={node.device_type!r} but its device reports {seen}: {why}; fix the "
                       f"node's label (ray start --labels) or the cluster file")


def _real_type(node: LiveNode, report: DeviceReport) -> str:
    if report.name is None or report.count < 1:
        raise ConfigError(f"device check: node {node.name} (node id {node.node_id[:8]}) offers {node.num_gpus} "
                          f"GPUs to Ray but the probe task given one of them sees no CUDA device")
    if not any(node.device_type in _label_names(d) for d in CATALOG):     # a custom device of the cluster file
        if set(name_tokens(node.device_type)) <= set(name_tokens(report.name)):
            return node.device_type
        raise _mismatch(node, report, "a custom device label must name the model as CUDA reports it")
    try:
        reported = catalog_type(report.name, report.total_memory)
    except ConfigError as e:
        raise _mismatch(node, report, str(e)) from e
    if node.device_type not in _label_names(reported):
        raise _mismatch(node, report, f"that is catalog type {reported}")
    return reported


def check_report(node: LiveNode, report: DeviceReport) -> LiveNode:
    """The node with its confirmed device type (a catalog name where the label was Ray's own name for it);
    ConfigError naming the node, its label and the reported device when they disagree."""
    if report.node_id != node.node_id:
        raise ConfigError(f"device check: the probe for node {node.name} ran on node id {report.node_id[:8]}, not "
                          f"{node.node_id[:8]}")
    if report.emulated != node.emulated:
        raise _mismatch(node, report, f"the node's {EMULATED_LABEL} label changed during discovery")
    if report.emulated:
        if report.name != node.device_type:
            raise _mismatch(node, report, "the node's labels changed during discovery")
        return node
    return replace(node, device_type=_real_type(node, report))


def confirm_nodes(nodes: list[LiveNode], timeout_s: float = DEFAULT_TIMEOUT_S) -> list[LiveNode]:
    """`nodes` with device types confirmed by a task on each node (see the module doc)."""
    reports = probe_nodes(nodes, timeout_s)
    return [check_report(n, reports[n.node_id]) for n in nodes]


def discover_confirmed(base: Cluster | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> Discovered:
    """`discovery.discover` with every GPU node's type confirmed by the device that answers on it."""
    return describe(base, confirm_nodes(live_nodes(), timeout_s))
