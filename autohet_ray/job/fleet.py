"""What a job asks the autoscaler for (pure; orchestrate/fleet.py sends it through Ray's autoscaler SDK).

The request is a count of nodes per node type of the cluster file. At the start each type's max. After each
plan: a type whose live nodes the plan leaves idle is lowered to the nodes the plan uses (they no longer pay
under the job's objective: the planner left them out), never below the type's min; a type whose live nodes the
plan all uses keeps its count, so a reclaimed node stays asked for and the autoscaler brings its replacement
while the job trains on what is left. Each node is one bundle of its GPUs, with a label selector for its GPU type
and market (the labels discovery reads, cluster/live.py).
"""
from __future__ import annotations

from collections import Counter

from autohet_ray.cluster.labels import ACCELERATOR_LABEL, MARKET_LABEL, ON_DEMAND_MARKET, SPOT_MARKET, label_value
from autohet_ray.cluster.spec import Cluster, NodeType


def initial_counts(types: tuple[NodeType, ...]) -> dict[str, int]:
    return {t.name: t.max_nodes for t in types}


def nodes_by_type(cluster: Cluster, names=None) -> Counter:
    """Nodes of each type in `cluster` (only those named in `names`, when given)."""
    return Counter(n.node_type for n in cluster.nodes if n.node_type is not None and (names is None or n.name in names))


def next_counts(types: tuple[NodeType, ...], asked: dict[str, int], live: Counter, used: Counter) -> dict[str, int]:
    """The request after a plan: `asked` (the request so far), `live` and `used` (per type, the live nodes and
    those the plan runs on)."""
    return {t.name: max(used[t.name], t.min_nodes) if live[t.name] > used[t.name] else asked[t.name] for t in types}


def fleet_bundles(types: tuple[NodeType, ...], counts: dict[str, int]) -> tuple[list[dict], list[dict]]:
    """(bundles, bundle_label_selectors) for `request_resources`: one bundle per node."""
    bundles, selectors = [], []
    for node_type in types:
        for _ in range(counts[node_type.name]):
            bundles.append({"GPU": node_type.count})
            selectors.append({ACCELERATOR_LABEL: label_value(node_type.device),
                              MARKET_LABEL: SPOT_MARKET if node_type.spot else ON_DEMAND_MARKET})
    return bundles, selectors


def fleet_ready(types: tuple[NodeType, ...], counts: dict[str, int], live: Counter) -> bool:
    """Whether every type has the nodes asked for."""
    return all(live[t.name] >= counts[t.name] for t in types)
