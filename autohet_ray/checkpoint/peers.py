"""Who replicates what where: peer-node choice for keeper replicas, and one writer per unique chunk.

Spot preemptions are correlated within an instance pool, so a shard's peer copy should live on another
node, preferably of another GPU type (another pool); among candidates the least-loaded one wins.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Hashable, TypeVar

from autohet_ray import ConfigError
from autohet_ray.layout import Chunk

K = TypeVar("K", bound=Hashable)


def choose_peers(shard_nodes: dict[K, str], node_gpu: dict[str, str], *, num_peers: int = 1,
                 shard_bytes: dict[K, int] | None = None) -> dict[K, list[str]]:
    """For each shard (key -> node holding it), `num_peers` other nodes for its replicas: another GPU
    type first, then the node with the fewest replica bytes so far, then the name (deterministic)."""
    if num_peers < 0:
        raise ConfigError(f"num_peers must be >= 0, got {num_peers}")
    unknown = sorted({n for n in shard_nodes.values() if n not in node_gpu})
    if unknown:
        raise ConfigError(f"shards live on nodes {unknown} missing from the node -> GPU type map "
                          f"(known: {sorted(node_gpu)})")
    if num_peers > len(node_gpu) - 1 and shard_nodes:
        raise ConfigError(f"num_peers={num_peers} needs at least {num_peers + 1} nodes, the cluster has "
                          f"{len(node_gpu)} ({sorted(node_gpu)})")
    load: Counter[str] = Counter()
    out: dict[K, list[str]] = {}
    order = sorted(shard_nodes, key=lambda k: (-(shard_bytes or {}).get(k, 1), repr(k)))   # big shards first
    for key in order:
        home = shard_nodes[key]
        candidates = [n for n in node_gpu if n != home]
        chosen = []
        for _ in range(num_peers):
            pick = min((n for n in candidates if n not in chosen),
                       key=lambda n: (node_gpu[n] == node_gpu[home], load[n], n))
            chosen.append(pick)
            load[pick] += (shard_bytes or {}).get(key, 1)
        out[key] = chosen
    return out


def _index(holdings: dict[int, list[tuple[str, Chunk, int]]]) -> tuple[dict, dict]:
    """(name, chunk) -> the ranks holding it, and -> its size in bytes (the largest reported)."""
    holders: dict[tuple[str, Chunk], list[int]] = {}
    size: dict[tuple[str, Chunk], int] = {}
    for rank, items in holdings.items():
        for name, chunk, nbytes in items:
            holders.setdefault((name, chunk), []).append(rank)
            size[(name, chunk)] = max(size.get((name, chunk), 0), nbytes)
    return holders, size


def assign_writers(holdings: dict[int, list[tuple[str, Chunk, int]]]) -> dict[int, set[tuple[str, Chunk]]]:
    """Pick one writer rank per unique (name, chunk) among the ranks holding it (TP-replicated tensors and
    data-parallel copies are held by several), balancing the bytes each rank writes.
    `holdings`: rank -> [(name, chunk, nbytes)]. Returns rank -> the (name, chunk)s it writes."""
    holders, size = _index(holdings)
    load: Counter[int] = Counter({rank: 0 for rank in holdings})
    out: dict[int, set[tuple[str, Chunk]]] = {rank: set() for rank in holdings}
    for item in sorted(holders, key=lambda i: (-size[i], i[0], i[1].offsets)):
        rank = min(holders[item], key=lambda r: (load[r], r))
        out[rank].add(item)
        load[rank] += size[item]
    return out


@dataclass
class CopyPlan:
    """Where each rank's snapshot goes. `local[r]`: items rank r writes to its own node's store; `push[r]`:
    peer node -> items rank r replicates there; `upload[r]`: items rank r uploads to the storage (each item
    exactly once across ranks)."""
    local: dict[int, set] = field(default_factory=dict)
    push: dict[int, dict[str, set]] = field(default_factory=dict)
    upload: dict[int, set] = field(default_factory=dict)


def place_copies(holdings: dict[int, list[tuple[str, Chunk, int]]], rank_nodes: dict[int, str],
                 node_gpu: dict[str, str], *, copies: int = 2) -> CopyPlan:
    """`copies` node-store copies of every unique (name, chunk) on distinct nodes: another GPU type first (a
    spot pool tends to vanish together), then a node whose ranks already hold the item (a data-parallel copy
    with the same chunk: written to that node's own store, no network), then the least-loaded node. Items
    with fewer holder nodes than chosen nodes are pushed there by the first writer. Load (bytes) is balanced
    over nodes and over the ranks of a node."""
    if copies < 1 or copies > len(node_gpu):
        raise ConfigError(f"copies={copies} must be between 1 and the number of nodes ({len(node_gpu)})")
    holders, size = _index(holdings)
    node_load: Counter[str] = Counter()
    rank_load: Counter[int] = Counter()
    plan = CopyPlan({r: set() for r in holdings}, {r: {} for r in holdings}, {r: set() for r in holdings})
    for item in sorted(holders, key=lambda i: (-size[i], i[0], i[1].offsets)):
        by_node: dict[str, list[int]] = {}
        for rank in holders[item]:
            by_node.setdefault(rank_nodes[rank], []).append(rank)
        chosen: list[str] = []
        for _ in range(copies):
            pool = [n for n in node_gpu if n not in chosen]
            node = min(pool, key=lambda n: (any(node_gpu[n] == node_gpu[c] for c in chosen), n not in by_node,
                                            node_load[n], n))
            chosen.append(node)
            node_load[node] += size[item]
        primary = min(by_node[chosen[0]], key=lambda r: (rank_load[r], r))
        plan.upload[primary].add(item)
        for node in chosen:
            if node in by_node:
                writer = min(by_node[node], key=lambda r: (rank_load[r], r))
                plan.local[writer].add(item)
                rank_load[writer] += size[item]
            else:
                plan.push[primary].setdefault(node, set()).add(item)
                rank_load[primary] += size[item]
    return plan
