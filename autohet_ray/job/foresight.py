"""Plan-ahead without Ray: which availability states a running job can foresee, and a plan cache that serves
a state from the plan of an equivalent one.

Two states are equivalent when their nodes differ only by name: the same GPU type, GPU count, NIC and spot
flag, node for node in the file's order within each kind (the planner sees only those). A plan made for one
serves the other with its nodes renamed, so the states one node loss away cost one planning per kind of node,
not one per node (4 plannings for 128 nodes of 4 types).

The controller foresees, in this order: the state with the nodes that joined (they idle until the switch), the
state after the nodes a spot notice names leave, then each single-node loss of the state it runs.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from autohet_ray.cluster.live import without_nodes
from autohet_ray.cluster.spec import Cluster


def node_kind(node: dict) -> str:
    """What the planner sees of a node: everything but its name."""
    return json.dumps({k: v for k, v in node.items() if k != "name"}, sort_keys=True)


def canonical_key(cluster_dict: dict) -> str:
    """Equal for states whose nodes differ only by name (the node kinds as a multiset, the rest as is)."""
    rest = {k: v for k, v in cluster_dict.items() if k not in ("nodes", "name")}
    kinds = sorted(node_kind(n) for n in cluster_dict["nodes"])
    return json.dumps({"kinds": kinds, **rest}, sort_keys=True)


def node_renaming(source: dict, target: dict) -> dict[str, str]:
    """Source node -> target node of the same kind (the i-th of a kind to the i-th, in file order); the two
    must be equivalent (canonical_key)."""
    assert canonical_key(source) == canonical_key(target), "states are not equivalent"
    by_kind: dict[str, list[str]] = {}
    for node in target["nodes"]:
        by_kind.setdefault(node_kind(node), []).append(node["name"])
    taken: dict[str, int] = {}
    renaming = {}
    for node in source["nodes"]:
        kind = node_kind(node)
        renaming[node["name"]] = by_kind[kind][taken.get(kind, 0)]
        taken[kind] = taken.get(kind, 0) + 1
    return renaming


def renamed_plan(plan: dict, renaming: dict[str, str]) -> dict:
    """The plan (Plan.to_dict) with every stage's node renamed."""
    pipelines = [{**p, "stages": [{**s, "node": renaming[s["node"]]} for s in p["stages"]]} for p in plan["pipelines"]]
    return {**plan, "pipelines": pipelines}


def cached_entry(cache: dict[str, dict], key: str) -> dict | None:
    """The cache entry of state `key` (a state_key: the cluster's JSON): its own, else an equivalent state's
    with the plan's nodes renamed onto this state's (stored under `key`, flagged "ahead" as the source was)."""
    entry = cache.get(key)
    if entry is not None:
        return entry
    target = json.loads(key)
    wanted = canonical_key(target)
    for other_key, other in list(cache.items()):
        source = json.loads(other_key)
        if canonical_key(source) == wanted:
            entry = {**other, "plan": renamed_plan(other["plan"], node_renaming(source, target)),
                     "renamed_from": sorted(n["name"] for n in source["nodes"])}
            cache[key] = entry
            return entry
    return None


def one_loss_states(cluster: Cluster) -> list[Cluster]:
    """One state per kind of node one loss away (losing any node of a kind gives equivalent states)."""
    if len(cluster.nodes) < 2:
        return []
    states, seen = [], set()
    for node in cluster.nodes:
        state = without_nodes(cluster, [node.name])
        key = canonical_key(state.to_dict())
        if key not in seen:
            seen.add(key)
            states.append(state)
    return states


def foreseen_states(current: Cluster, *, joined: Cluster | None = None, leaving: list[str] = ()) -> list[Cluster]:
    """The states to plan ahead, first needed first: with the joined nodes (`joined`: the live cluster with
    them), without the noticed ones (`leaving`), then each single-node loss of the current state."""
    states = [joined] if joined is not None else []
    if leaving:
        states.append(without_nodes(current, list(leaving)))
    states += one_loss_states(current)
    unique, seen = [], set()
    for state in states:
        key = json.dumps(state.to_dict(), sort_keys=True)
        if key not in seen:
            seen.add(key)
            unique.append(state)
    return unique


@dataclass
class Joining:
    """A join being prepared while the current plan trains: the state with the joined nodes (its cache key,
    planned in the background) and the workers started on them (node name -> handles, and their first calls)."""
    joined: list[str]
    key: str
    base: str                  # the state it was prepared from: a loss meanwhile makes it stale
    actors: dict
    started: list = field(default_factory=list)
    node_ids: dict = field(default_factory=dict)
    standby: object = None     # orchestrate/switch_ahead.Standby: the next plan's groups, built ahead
    since: float = field(default_factory=time.perf_counter)

    def plan(self, cache: dict[str, dict]) -> dict | None:
        entry = cached_entry(cache, self.key)
        return None if entry is None else entry["plan"]
