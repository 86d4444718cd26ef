"""Names Ray uses for GPU types and nodes (plain strings; no Ray import).

A GPU node says its GPU type with the `ray.io/accelerator-type` label (set by Ray on real GPU nodes), its market
with `ray.io/market-type` (`spot` or `on-demand`; Ray does not set it: the autoscaler's node types and KubeRay's
groups do) and, on emulated or labelled clusters, its cluster-file node name with `autohet.io/node`. Every node
has `ray.io/node-id`; placement pins bundles with it.
"""
from __future__ import annotations

import re

ACCELERATOR_LABEL = "ray.io/accelerator-type"
NODE_ID_LABEL = "ray.io/node-id"
MARKET_LABEL = "ray.io/market-type"
SPOT_MARKET, ON_DEMAND_MARKET = "spot", "on-demand"
NODE_NAME_LABEL = "autohet.io/node"
EMULATED_LABEL = "autohet.io/emulated"
ACCELERATOR_RESOURCE_PREFIX = "accelerator_type:"


def gpu_resource(device_type: str) -> str:
    """The custom resource an emulated node offers per GPU of `device_type`, e.g. gpu_A100_80GB."""
    return "gpu_" + re.sub(r"[^A-Za-z0-9]", "_", device_type)


def label_value(device_type: str) -> str:
    """Device type as a label value (labels allow letters, digits, '-', '_', '.')."""
    value = re.sub(r"[^A-Za-z0-9_.-]", "_", device_type)
    assert value and len(value) <= 63, device_type
    return value
