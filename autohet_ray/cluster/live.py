"""The live GPU nodes of a Ray cluster as plain data, from `ray.nodes()` entries, and the cluster they make.

GPU type per node: the `ray.io/accelerator-type` label, else an `accelerator_type:<type>` resource; GPUs per
node: the `GPU` resource. Node names: the `autohet.io/node` label when present (emulated or labelled
clusters), else `node-<first 8 hex digits of the node id>`. Link figures and custom device types come from a
cluster file when one is given; the live cluster must then hold every node the file names.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from autohet_ray import ConfigError
from autohet_ray.cluster.labels import ACCELERATOR_LABEL, ACCELERATOR_RESOURCE_PREFIX, EMULATED_LABEL, NODE_NAME_LABEL
from autohet_ray.cluster.spec import Cluster, Node

DEFAULT_INTER_NODE_GBPS = 100.0


@dataclass(frozen=True, kw_only=True)
class LiveNode:
    name: str
    node_id: str
    ip: str
    device_type: str | None     # None: no GPUs
    num_gpus: int
    emulated: bool


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
                            emulated=labels.get(EMULATED_LABEL) == "true"))
    return sorted(out, key=lambda n: n.name)


def _match_file(base: Cluster, nodes: list[LiveNode]) -> tuple[Cluster, tuple[LiveNode, ...]]:
    by_name = {n.name: n for n in nodes}
    kept = []
    for node in base.nodes:
        live = by_name.get(node.name)
        if live is None:
            raise ConfigError(f"node {node.name!r} of the cluster file is not in the Ray cluster; live GPU nodes: "
                              f"{', '.join(f'{n.name} ({n.num_gpus}x {n.device_type})' for n in nodes) or 'none'}")
        if live.device_type != node.device:
            raise ConfigError(f"node {node.name!r}: the cluster file says {node.device} but Ray reports "
                              f"{live.device_type}")
        kept.append(live)
    cluster = replace(base, nodes=tuple(replace(n, count=by_name[n.name].num_gpus) for n in base.nodes))
    return cluster, tuple(kept)


def describe(base: Cluster | None, nodes: list[LiveNode]) -> Discovered:
    """The cluster description of these live GPU nodes (and the cluster file `base`, when given)."""
    if not nodes:
        raise ConfigError("the Ray cluster has no GPU nodes (no node offers a GPU resource); start nodes with "
                          "GPUs, or use --emulate to emulate the cluster file on this machine")
    if base is not None:
        cluster, kept = _match_file(base, nodes)
        return Discovered(cluster=cluster, nodes=kept)
    cluster = Cluster(name="ray", inter_node_gbps=DEFAULT_INTER_NODE_GBPS,
                      nodes=tuple(Node(name=n.name, device=n.device_type, count=n.num_gpus,
                                       nic_gbps=DEFAULT_INTER_NODE_GBPS) for n in nodes))
    for n in nodes:
        cluster.device(n.device_type)        # a ConfigError naming the known devices if unknown
    return Discovered(cluster=cluster, nodes=tuple(nodes))


def without_nodes(cluster: Cluster, lost: list[str]) -> Cluster:
    """The cluster minus the lost nodes (ConfigError when nothing is left)."""
    kept = tuple(n for n in cluster.nodes if n.name not in set(lost))
    if not kept:
        raise ConfigError(f"every node of cluster {cluster.name!r} is lost ({sorted(lost)}); nothing to re-plan on")
    return replace(cluster, nodes=kept)
