"""Check what a node's device probe reported against the node's labels (pure: no Ray, no torch).

A real GPU's CUDA name is mapped to a catalog type (`cluster.device_names`) and must agree with the node's
`ray.io/accelerator-type` label. Emulated nodes report the type from their own labels. Labels may be catalog
names or the names Ray sets on its own ("A100", "GeForce-RTX-4090"); a confirmed node carries the catalog
type. A label that no catalog type answers to (a custom device of the cluster file) must name the model as
CUDA does: its tokens must all appear in the reported name ("A800" in "NVIDIA A800-SXM4-80GB").
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from autohet_ray import ConfigError
from autohet_ray.cluster.catalog import CATALOG
from autohet_ray.cluster.device_names import catalog_type, name_tokens
from autohet_ray.cluster.labels import ACCELERATOR_LABEL, EMULATED_LABEL, label_value
from autohet_ray.cluster.live import LiveNode

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
