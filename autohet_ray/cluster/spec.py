"""Cluster description: nodes (one GPU type each), GPUs per node, links. Loaded from the portable YAML shape."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property


from autohet_ray import ConfigError
from autohet_ray.config_io import mapping, read_structured, text_field
from autohet_ray.cluster.catalog import DeviceType, device_from_dict, lookup


@dataclass(frozen=True, kw_only=True)
class Node:
    name: str
    device: str          # device type name (catalog or custom)
    count: int           # GPUs on this node
    nic_gbps: float      # this node's inter-node NIC, Gb/s
    spot: bool = False   # billed at the spot price (cost/money.py)


@dataclass(frozen=True, kw_only=True)
class Cluster:
    name: str
    nodes: tuple[Node, ...]
    inter_node_gbps: float
    custom_devices: dict[str, DeviceType] = field(default_factory=dict)

    def device(self, name: str) -> DeviceType:
        return lookup(name, self.custom_devices)

    @cached_property
    def _by_name(self) -> dict[str, Node]:
        return {n.name: n for n in self.nodes}

    def node(self, name: str) -> Node:
        if name in self._by_name:
            return self._by_name[name]
        raise ConfigError(f"unknown node {name!r}; nodes: {', '.join(n.name for n in self.nodes)}")

    @property
    def num_gpus(self) -> int:
        return sum(n.count for n in self.nodes)

    def device_types(self) -> list[str]:
        """Device type names present, in first-appearance order."""
        return list(dict.fromkeys(n.device for n in self.nodes))

    def gpus_of(self, device: str) -> int:
        return sum(n.count for n in self.nodes if n.device == device)

    def nic_bytes_per_s(self, node_name: str) -> float:
        """A node's inter-node bandwidth in bytes/s (the slower of its NIC and the fabric)."""
        return min(self.node(node_name).nic_gbps, self.inter_node_gbps) * 1e9 / 8

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "nodes": [{"name": n.name, "device": n.device, "count": n.count, "nic_gbps": n.nic_gbps}
                      | ({"spot": True} if n.spot else {}) for n in self.nodes],
            "network": {"inter_node_gbps": self.inter_node_gbps},
            "devices": {k: {f: v for f, v in d.to_dict().items() if f != "name"}
                        for k, d in self.custom_devices.items()},
        }


def _positive_int(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{what}={value!r} must be a positive integer")
    return value


def _positive_number(value, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ConfigError(f"{what}={value!r} must be a positive finite number")
    return float(value)


_NODE_KEYS = {"name", "device", "count", "replicas", "nic_gbps", "spot"}


def _expand_node(raw, index: int, inter_gbps: float, custom: dict) -> list[Node]:
    if not isinstance(raw, dict):
        raise ConfigError(f"nodes[{index}] must be a mapping like {{name: a100, device: A100-80GB, count: 8}}")
    unknown = sorted(set(raw) - _NODE_KEYS)
    if unknown:
        raise ConfigError(f"nodes[{index}] has unknown keys {unknown}; valid: {sorted(_NODE_KEYS)}")
    for key in ("name", "device", "count"):
        if key not in raw:
            raise ConfigError(f"nodes[{index}] is missing {key!r}")
    name = text_field(raw["name"], f"nodes[{index}].name")
    device = lookup(text_field(raw["device"], f"nodes[{index}].device"), custom)
    count = _positive_int(raw["count"], f"nodes[{index}].count")
    replicas = _positive_int(raw.get("replicas", 1), f"nodes[{index}].replicas")
    nic = _positive_number(raw.get("nic_gbps", inter_gbps), f"nodes[{index}].nic_gbps")
    spot = raw.get("spot", False)
    if not isinstance(spot, bool):
        raise ConfigError(f"nodes[{index}].spot={spot!r} must be true or false")
    names = [name] if replicas == 1 else [f"{name}-{i}" for i in range(replicas)]
    return [Node(name=n, device=device.name, count=count, nic_gbps=nic, spot=spot) for n in names]


def cluster_from_dict(raw, source: str = "<cluster>") -> Cluster:
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: a cluster file must be a mapping with 'name' and 'nodes'")
    unknown = sorted(set(raw) - {"name", "nodes", "network", "devices"})
    if unknown:
        raise ConfigError(f"{source}: unknown top-level keys {unknown}; valid: name, nodes, network, devices")
    custom = {str(k): device_from_dict(str(k), mapping(v, f"devices.{k}"))
              for k, v in mapping(raw.get("devices"), "devices").items()}
    network = mapping(raw.get("network"), "network")
    inter = _positive_number(network.get("inter_node_gbps", 100), "network.inter_node_gbps")
    nodes_raw = raw.get("nodes") or []
    if not isinstance(nodes_raw, list) or not nodes_raw:
        raise ConfigError(f"{source}: the cluster has no nodes; add e.g. "
                          "nodes: [{name: a100, device: A100-80GB, count: 8}]")
    nodes = [n for i, r in enumerate(nodes_raw) for n in _expand_node(r, i, inter, custom)]
    seen = set()
    for node in nodes:
        if node.name in seen:
            raise ConfigError(f"{source}: node name {node.name!r} appears twice; node names must be unique")
        seen.add(node.name)
    return Cluster(name=text_field(raw.get("name", "cluster"), "name"), nodes=tuple(nodes), inter_node_gbps=inter,
                   custom_devices=custom)


def load_cluster(path: str) -> Cluster:
    return cluster_from_dict(read_structured(path, "cluster"), source=path)
