"""The live GPU nodes of a Ray cluster as plain data, from `ray.nodes()` entries, and the cluster they make.

GPU type per node: the `ray.io/accelerator-type` label, else an `accelerator_type:<type>` resource; GPUs per
node: the `GPU` resource; spot or on-demand: the `ray.io/market-type` label (no label: on-demand). Node names:
the `autohet.io/node` label when present (emulated or labelled clusters), else `node-<first 8 hex digits of the
node id>`. Link figures and custom device types come from a cluster file when one is given; the live cluster must
then hold every node the file names, and every other live node that matches one of the file's node types (same
GPU type, GPUs per node and market) is an instance of that type, named by its full Ray node id (an autoscaler's
nodes carry per-type labels only, and the fake provider's ids share their first 51 hex digits), up to the type's
`max` nodes (nodes the job already runs on first, then by id). Live nodes that match nothing are not the job's.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from autohet_ray import ConfigError
from autohet_ray.cluster.labels import (ACCELERATOR_LABEL, ACCELERATOR_RESOURCE_PREFIX, EMULATED_LABEL, MARKET_LABEL,
                                        NODE_NAME_LABEL, ON_DEMAND_MARKET, SPOT_MARKET, label_value)
from autohet_ray.cluster.spec import Cluster, Node, NodeType, type_instance

DEFAULT_INTER_NODE_GBPS = 100.0


@dataclass(frozen=True, kw_only=True)
class LiveNode:
    name: str
    node_id: str
    ip: str
    device_type: str | None     # None: no GPUs
    num_gpus: int
    emulated: bool
    spot: bool = False          # the ray.io/market-type label says spot


@dataclass(frozen=True, kw_only=True)
class Discovered:
    cluster: Cluster
    nodes: tuple[LiveNode, ...]     # GPU nodes only, in cluster order

    @property
    def node_ids(self) -> dict[str, str]:
        return {n.name: n.node_id for n in self.nodes}

    @property
    def emulated(self) -> bool:
        return any(n.emulated for n in self.nodes)

    @property
    def single_host(self) -> bool:
        return len({n.ip for n in self.nodes}) <= 1


def _device_type(raw: dict) -> str | None:
    label = (raw.get("Labels") or {}).get(ACCELERATOR_LABEL)
    if label:
        return label
    kinds = [k[len(ACCELERATOR_RESOURCE_PREFIX):] for k in raw.get("Resources", {})
             if k.startswith(ACCELERATOR_RESOURCE_PREFIX)]
    return kinds[0] if kinds else None


def gpu_nodes(raws: list[dict], dead: set[str] = frozenset()) -> list[LiveNode]:
    """The alive nodes with GPUs among `ray.nodes()` entries, less the node ids in `dead`, by name."""
    out = []
    for raw in raws:
        gpus = int(raw.get("Resources", {}).get("GPU", 0))
        if not raw.get("Alive") or gpus == 0 or raw["NodeID"] in dead:
            continue
        labels = raw.get("Labels") or {}
        device = _device_type(raw)
        if device is None:
            raise ConfigError(f"node {raw['NodeID'][:8]} ({raw.get('NodeManagerAddress')}) has {gpus} GPUs but no "
                              f"{ACCELERATOR_LABEL} label or accelerator_type resource; start it with "
                              f"--labels='{{\"{ACCELERATOR_LABEL}\": \"H100\"}}' (or the right type)")
        out.append(LiveNode(name=labels.get(NODE_NAME_LABEL, f"node-{raw['NodeID'][:8]}"), node_id=raw["NodeID"],
                            ip=raw.get("NodeManagerAddress", ""), device_type=device, num_gpus=gpus,
                            emulated=labels.get(EMULATED_LABEL) == "true",
                            spot=labels.get(MARKET_LABEL) == SPOT_MARKET))
    return sorted(out, key=lambda n: n.name)


def _describe_live(nodes: list[LiveNode]) -> str:
    return ", ".join(f"{n.name} ({n.num_gpus}x {n.device_type}{', spot' if n.spot else ''})" for n in nodes) or "none"


def _type_needs(node_type: NodeType) -> str:
    """A type and what its nodes carry, for messages."""
    market = SPOT_MARKET if node_type.spot else ON_DEMAND_MARKET
    return (f"{node_type.name!r} ({node_type.count}x {node_type.device}, {market}: nodes with "
            f"{ACCELERATOR_LABEL}={label_value(node_type.device)}, {MARKET_LABEL}={market} and {node_type.count} GPUs)")


def type_of(types: tuple[NodeType, ...], node: LiveNode) -> NodeType | None:
    """The first of `types` that `node` is an instance of: same GPU type, GPUs per node and market."""
    for node_type in types:
        if (label_value(node_type.device) == label_value(node.device_type) and node_type.count == node.num_gpus
                and node_type.spot == node.spot):
            return node_type
    return None


def type_members(types: tuple[NodeType, ...], nodes: list[LiveNode],
                 prefer: frozenset[str] = frozenset()) -> dict[str, list[LiveNode]]:
    """Per type name, the live nodes taken as its instances (at most its max; ids in `prefer` first)."""
    members: dict[str, list[LiveNode]] = {t.name: [] for t in types}
    for node in sorted(nodes, key=lambda n: (n.node_id not in prefer, n.node_id)):
        node_type = type_of(types, node)
        if node_type is not None and len(members[node_type.name]) < node_type.max_nodes:
            members[node_type.name].append(node)
    return members


def _match_file(base: Cluster, nodes: list[LiveNode], prefer: frozenset[str]) -> tuple[Cluster, tuple[LiveNode, ...]]:
    by_name = {n.name: n for n in nodes}
    named = [n for n in base.nodes if n.node_type is None]
    kept = []
    for node in named:
        live = by_name.get(node.name)
        if live is None:
            raise ConfigError(f"node {node.name!r} of the cluster file is not in the Ray cluster; live GPU nodes: "
                              f"{_describe_live(nodes)}")
        if live.device_type != node.device:
            raise ConfigError(f"node {node.name!r}: the cluster file says {node.device} but Ray reports "
                              f"{live.device_type}")
        kept.append(live)
    cluster_nodes = [replace(n, count=by_name[n.name].num_gpus) for n in named]
    rest = [n for n in nodes if n.name not in {m.name for m in named}]
    types = {t.name: t for t in base.types}
    for type_name, members in type_members(base.types, rest, prefer).items():
        for live in members:
            kept.append(replace(live, name=live.node_id))
            cluster_nodes.append(type_instance(types[type_name], live.node_id))
    if not cluster_nodes:
        raise ConfigError(f"no live Ray node matches a node type of the cluster file "
                          f"({'; '.join(_type_needs(t) for t in base.types)}); live GPU nodes: {_describe_live(nodes)}")
    return replace(base, nodes=tuple(cluster_nodes)), tuple(kept)


def check_types(found: Discovered, live: list[LiveNode], *, autoscaled: bool) -> None:
    """At a job's start: every node type has its `min` nodes, and (with no autoscaler to bring more) at least one;
    a ConfigError naming the type and the live nodes otherwise."""
    for node_type in found.cluster.types:
        have = sum(n.node_type == node_type.name for n in found.cluster.nodes)
        need = node_type.min_nodes if autoscaled else max(node_type.min_nodes, 1)
        if have < need:
            raise ConfigError(f"node type {_type_needs(node_type)} matches {have} live Ray node(s), needs {need}; "
                              f"live GPU nodes: {_describe_live(live)}")


def describe(base: Cluster | None, nodes: list[LiveNode], prefer: frozenset[str] = frozenset()) -> Discovered:
    """The cluster description of these live GPU nodes (and the cluster file `base`, when given; `prefer`: the
    node ids a type keeps first when more of its nodes are live than its max)."""
    if not nodes:
        raise ConfigError("the Ray cluster has no GPU nodes (no node offers a GPU resource); start nodes with "
                          "GPUs, or use --emulate to emulate the cluster file on this machine")
    if base is not None:
        cluster, kept = _match_file(base, nodes, prefer)
        return Discovered(cluster=cluster, nodes=kept)
    cluster = Cluster(name="ray", inter_node_gbps=DEFAULT_INTER_NODE_GBPS,
                      nodes=tuple(Node(name=n.name, device=n.device_type, count=n.num_gpus,
                                       nic_gbps=DEFAULT_INTER_NODE_GBPS, spot=n.spot) for n in nodes))
    for n in nodes:
        cluster.device(n.device_type)        # a ConfigError naming the known devices if unknown
    return Discovered(cluster=cluster, nodes=tuple(nodes))


def without_nodes(cluster: Cluster, lost: list[str]) -> Cluster:
    """The cluster minus the lost nodes (ConfigError when nothing is left)."""
    kept = tuple(n for n in cluster.nodes if n.name not in set(lost))
    if not kept:
        raise ConfigError(f"every node of cluster {cluster.name!r} is lost ({sorted(lost)}); nothing to re-plan on")
    return replace(cluster, nodes=kept)
