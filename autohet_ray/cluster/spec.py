"""Cluster description: nodes (one GPU type each), GPUs per node, links. Loaded from the portable YAML shape.

A file names its nodes (`nodes:`), describes node types (`types:`: device, GPUs per node, NIC, spot, the least
and most nodes of each; an autoscaler starts identical nodes per type, known by their Ray node ids), or both. A
type stands for its `max` nodes (`<type>-0`, `<type>-1`, ...) until discovery (cluster/live.py) puts the live
nodes of that type in their place; a node that is an instance of a type says so (`type:`), and a type with
instances listed is not expanded again (so `to_dict` round-trips).
"""
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
    node_type: str | None = None   # the type this node is an instance of (None: a named node)


@dataclass(frozen=True, kw_only=True)
class NodeType:
    name: str
    device: str          # device type name (catalog or custom)
    count: int           # GPUs per node
    nic_gbps: float      # each node's inter-node NIC, Gb/s
    spot: bool = False   # spot capacity (ray.io/market-type=spot), billed at the spot price
    min_nodes: int = 0   # the least nodes of this type the job needs
    max_nodes: int = 1   # the most nodes of this type the job may use (and ask the autoscaler for)

    def to_dict(self) -> dict:
        return {"name": self.name, "device": self.device, "count": self.count, "nic_gbps": self.nic_gbps,
                "spot": self.spot, "min": self.min_nodes, "max": self.max_nodes}


@dataclass(frozen=True, kw_only=True)
class Cluster:
    name: str
    nodes: tuple[Node, ...]
    inter_node_gbps: float
    custom_devices: dict[str, DeviceType] = field(default_factory=dict)
    types: tuple[NodeType, ...] = ()

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
                      | ({"spot": True} if n.spot else {}) | ({"type": n.node_type} if n.node_type else {})
                      for n in self.nodes],
            **({"types": [t.to_dict() for t in self.types]} if self.types else {}),
            "network": {"inter_node_gbps": self.inter_node_gbps},
            "devices": {k: {f: v for f, v in d.to_dict().items() if f != "name"}
                        for k, d in self.custom_devices.items()},
        }


# What the planner can hold: a cluster beyond these (`replicas: 1000000000`) is refused before it is expanded.
MAX_NODES = 1024
MAX_GPUS = 8192


def _positive_int(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{what}={value!r} must be a positive integer")
    return value


def _node_count(value, what: str) -> int:
    """A count of nodes: a whole number from 0 to MAX_NODES (NaN, negative and huge counts are refused)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{what}={value!r} must be a whole number of nodes, 0 or more")
    if value > MAX_NODES:
        raise ConfigError(f"{what}={value} is more nodes than the planner can hold (at most {MAX_NODES} nodes "
                          f"in a cluster)")
    return value


def _positive_number(value, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ConfigError(f"{what}={value!r} must be a positive finite number")
    return float(value)


def _spot(raw: dict, where: str) -> bool:
    spot = raw.get("spot", False)
    if not isinstance(spot, bool):
        raise ConfigError(f"{where}.spot={spot!r} must be true or false")
    return spot


def _check_keys(raw, where: str, keys: set[str], required: tuple[str, ...], example: str) -> None:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a mapping like {example}")
    unknown = sorted(set(raw) - keys)
    if unknown:
        raise ConfigError(f"{where} has unknown keys {unknown}; valid: {sorted(keys)}")
    for key in required:
        if key not in raw:
            raise ConfigError(f"{where} is missing {key!r}")


_NODE_KEYS = {"name", "device", "count", "replicas", "nic_gbps", "spot", "type"}
_TYPE_KEYS = {"name", "device", "count", "nic_gbps", "spot", "min", "max"}


def _expand_node(raw, index: int, inter_gbps: float, custom: dict) -> list[Node]:
    where = f"nodes[{index}]"
    _check_keys(raw, where, _NODE_KEYS, ("name", "device", "count"), "{name: a100, device: A100-80GB, count: 8}")
    name = text_field(raw["name"], f"{where}.name")
    device = lookup(text_field(raw["device"], f"{where}.device"), custom)
    count = _positive_int(raw["count"], f"{where}.count")
    replicas = _positive_int(raw.get("replicas", 1), f"{where}.replicas")
    nic = _positive_number(raw.get("nic_gbps", inter_gbps), f"{where}.nic_gbps")
    node_type = text_field(raw["type"], f"{where}.type") if "type" in raw else None
    names = [name] if replicas == 1 else [f"{name}-{i}" for i in range(replicas)]
    return [Node(name=n, device=device.name, count=count, nic_gbps=nic, spot=_spot(raw, where), node_type=node_type)
            for n in names]


def _node_type(raw, index: int, inter_gbps: float, custom: dict) -> NodeType:
    where = f"types[{index}]"
    _check_keys(raw, where, _TYPE_KEYS, ("name", "device", "count", "max"),
                "{name: h100-spot, device: H100, count: 8, spot: true, max: 4}")
    low, high = _node_count(raw.get("min", 0), f"{where}.min"), _node_count(raw["max"], f"{where}.max")
    if high < 1 or low > high:
        raise ConfigError(f"{where}: min={low}, max={high}; max must be at least 1 and at least min")
    return NodeType(name=text_field(raw["name"], f"{where}.name"),
                    device=lookup(text_field(raw["device"], f"{where}.device"), custom).name,
                    count=_positive_int(raw["count"], f"{where}.count"),
                    nic_gbps=_positive_number(raw.get("nic_gbps", inter_gbps), f"{where}.nic_gbps"),
                    spot=_spot(raw, where), min_nodes=low, max_nodes=high)


def type_instance(node_type: NodeType, name: str, count: int | None = None) -> Node:
    """A node of `node_type` named `name` (a live node: its Ray node id), with `count` GPUs (default the type's)."""
    return Node(name=name, device=node_type.device, count=count or node_type.count, nic_gbps=node_type.nic_gbps,
                spot=node_type.spot, node_type=node_type.name)


def _check_size(nodes: list[Node], source: str) -> None:
    gpus = sum(n.count for n in nodes)
    if len(nodes) > MAX_NODES or gpus > MAX_GPUS:
        raise ConfigError(f"{source}: {len(nodes)} nodes with {gpus} GPUs is more than the planner can hold (at "
                          f"most {MAX_NODES} nodes and {MAX_GPUS} GPUs)")


def cluster_from_dict(raw, source: str = "<cluster>") -> Cluster:
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: a cluster file must be a mapping with 'name' and 'nodes' (or 'types')")
    unknown = sorted(set(raw) - {"name", "nodes", "types", "network", "devices"})
    if unknown:
        raise ConfigError(f"{source}: unknown top-level keys {unknown}; valid: name, nodes, types, network, devices")
    custom = {str(k): device_from_dict(str(k), mapping(v, f"devices.{k}"))
              for k, v in mapping(raw.get("devices"), "devices").items()}
    network = mapping(raw.get("network"), "network")
    inter = _positive_number(network.get("inter_node_gbps", 100), "network.inter_node_gbps")
    nodes_raw, types_raw = raw.get("nodes") or [], raw.get("types") or []
    if not isinstance(nodes_raw, list) or not isinstance(types_raw, list) or not (nodes_raw or types_raw):
        raise ConfigError(f"{source}: the cluster has no nodes; add e.g. "
                          "nodes: [{name: a100, device: A100-80GB, count: 8}] or "
                          "types: [{name: h100-spot, device: H100, count: 8, spot: true, max: 4}]")
    replicas = [_node_count(_positive_int(r.get("replicas", 1), f"nodes[{i}].replicas"), f"nodes[{i}].replicas")
                if isinstance(r, dict) else 1 for i, r in enumerate(nodes_raw)]
    if sum(replicas) > MAX_NODES:        # checked before expanding: each name is an object
        raise ConfigError(f"{source}: the node entries add up to {sum(replicas)} nodes, more than the planner can "
                          f"hold (at most {MAX_NODES} nodes in a cluster)")
    types = tuple(_node_type(r, i, inter, custom) for i, r in enumerate(types_raw))
    nodes = [n for i, r in enumerate(nodes_raw) for n in _expand_node(r, i, inter, custom)]
    by_type = {t.name: t for t in types}
    if len(by_type) != len(types):
        raise ConfigError(f"{source}: a type name appears twice in types: {[t.name for t in types]}")
    for node in nodes:
        if node.node_type is not None and node.node_type not in by_type:
            raise ConfigError(f"{source}: node {node.name!r} is of type {node.node_type!r}, which is not in types "
                              f"({', '.join(by_type) or 'none'})")
    listed = {n.node_type for n in nodes}
    nodes += [type_instance(t, f"{t.name}-{i}") for t in types if t.name not in listed for i in range(t.max_nodes)]
    _check_size(nodes, source)
    seen = set()
    for node in nodes:
        if node.name in seen:
            raise ConfigError(f"{source}: node name {node.name!r} appears twice; node names must be unique")
        seen.add(node.name)
    return Cluster(name=text_field(raw.get("name", "cluster"), "name"), nodes=tuple(nodes), inter_node_gbps=inter,
                   custom_devices=custom, types=types)


def load_cluster(path: str) -> Cluster:
    return cluster_from_dict(read_structured(path, "cluster"), source=path)
