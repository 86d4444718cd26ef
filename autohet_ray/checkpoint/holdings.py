"""Where an elastic job's chunks go and who holds them: the snapshot routes of each rank (its node's store,
peer node stores, the durable storage), which holder uploads a node-store step to the storage, and which
chunks need a second node-store copy after a node loss or before a node leaves. Pure bookkeeping; the Ray
calls are in elastic/."""
from __future__ import annotations

from autohet_ray.checkpoint.peers import place_copies
from autohet_ray.checkpoint.reshard import plan_reads
from autohet_ray.checkpoint.tier_specs import push_spec
from autohet_ray.layout import overlap


def tiling_holdings(holdings: dict[int, list], rank_pipeline: dict[int, int]) -> dict[int, list]:
    """Keep, per tensor, holdings whose chunks tile it exactly once. When the distinct chunks held anywhere
    are pairwise disjoint, all of them: every pipeline's tiles when all pipelines shard the tensor alike, or
    the slices of sharded optimizer state, which only together (across pipelines) tile it. Otherwise the
    pipelines shard it differently (TP2 in one, whole in another): only one pipeline's tiles, the pipeline
    with the most distinct chunks (writes spread over more ranks), then the lowest index; other pipelines'
    ranks keep the chunks identical to its tiles (data-parallel copies, written where they already are)."""
    chunks: dict[str, dict[int, set]] = {}
    for rank, items in holdings.items():
        for name, chunk, _ in items:
            chunks.setdefault(name, {}).setdefault(rank_pipeline[rank], set()).add(chunk)
    tiles = {}
    for name, by_pipe in chunks.items():
        distinct = set().union(*by_pipe.values())
        chosen = min(by_pipe, key=lambda k: (-len(by_pipe[k]), k))
        tiles[name] = distinct if _disjoint(distinct) else by_pipe[chosen]
    return {rank: [item for item in items if item[1] in tiles[item[0]]] for rank, items in holdings.items()}


def _disjoint(chunks: set) -> bool:
    nonempty = sorted((c for c in chunks if c.numel), key=lambda c: c.offsets)
    return all(overlap(a, b) is None for i, a in enumerate(nonempty) for b in nonempty[i + 1:])


def snapshot_routes(holdings: dict[int, list], slots: list[dict], keeper_specs: dict[str, dict], storage: dict,
                    *, node_gpu: dict[str, str], num_peers: int, storage_every: int) -> list[dict]:
    """Per rank, the arguments of its worker's `configure_snapshots`. With `keeper_specs` (elastic): each chunk
    lands in 1 + num_peers node stores (data-parallel copies written where they already are) and, every
    `storage_every` steps, in `storage`. Without: in `storage` only, whenever a snapshot is taken."""
    pipeline_of = {rank: slot["pipeline"] for rank, slot in enumerate(slots)}
    rank_nodes = {rank: slot["node"] for rank, slot in enumerate(slots)}
    copies = 1 + min(num_peers, len(node_gpu) - 1) if keeper_specs else 1
    placed = place_copies(tiling_holdings(holdings, pipeline_of), rank_nodes, node_gpu, copies=copies)
    upload_to = storage if keeper_specs and storage_every else None
    out = []
    for rank in range(len(slots)):
        local = keeper_specs[rank_nodes[rank]] if keeper_specs else storage
        peers = {p: push_spec(keeper_specs[p], local) for p in sorted(placed.push[rank])}
        routes = {local["name"]: placed.local[rank], **{peers[p]["name"]: placed.push[rank][p] for p in peers}}
        if upload_to:
            routes[upload_to["name"]] = placed.upload[rank]
        ordered = {tier: sorted(items, key=lambda i: (i[0], i[1].offsets)) for tier, items in routes.items()}
        out.append({"routes": ordered, "local": local, "peers": list(peers.values()),
                    "storage": upload_to, "storage_every": storage_every if upload_to else 0})
    return out


def spread_uploads(records, node_of: dict[str, str], dead: set[str]) -> dict[str, list] | None:
    """node -> the records it uploads: each record by its least loaded live holder; None if one has none.
    `node_of`: store name -> node of the live stores."""
    load: dict[str, int] = {}
    batches: dict[str, list] = {}
    for record in records:
        holders = [node_of[r] for r in record.replicas if r in node_of and node_of[r] not in dead]
        if not holders:
            return None
        node = min(holders, key=lambda n: (load.get(n, 0), n))
        load[node] = load.get(node, 0) + record.nbytes
        batches.setdefault(node, []).append(record)
    return batches


def second_copies(records, node_of: dict[str, str], also_held: dict[str, set[str]]) -> dict[tuple, list[str]]:
    """(source node, target node) -> keys of the chunks only one live node store holds, each to be copied to
    another live store (targets taken in turn). `node_of`: store name -> node of the live stores;
    `also_held`: key -> nodes whose stores hold that chunk beyond what the records say."""
    live = sorted(node_of.values())
    copies: dict[tuple[str, str], list[str]] = {}
    for i, record in enumerate(records):
        extra = {n for n in also_held.get(record.key, ()) if n in live}
        holders = sorted({node_of[r] for r in record.replicas if r in node_of} | extra)
        if len(holders) == 1:
            others = [n for n in live if n != holders[0]]
            copies.setdefault((holders[0], others[i % len(others)]), []).append(record.key)
    return copies


def hand_over_copies(records, staying: dict[str, str], leaving: dict[str, str]) -> dict[tuple, list[str]]:
    """(source node, target node) -> keys: before the stores of nodes that leave on purpose (a spot notice, a
    drain) are dropped, each chunk that fewer than two `staying` stores hold is copied to staying stores until
    two hold it (one, with a single stayer), from a leaving holder when there is one (it trains no more), else
    from a staying one. `staying`, `leaving`: store name -> node."""
    stayers = sorted(set(staying.values()))
    copies: dict[tuple[str, str], list[str]] = {}
    for i, record in enumerate(records):
        held = sorted({staying[r] for r in record.replicas if r in staying})
        sources = sorted({leaving[r] for r in record.replicas if r in leaving}) or held
        free = [n for n in stayers if n not in held]
        need = min(2, len(stayers)) - len(held)
        if need <= 0 or not sources:
            continue
        start = i % len(free)
        for k, target in enumerate((free[start:] + free[:start])[:need]):
            copies.setdefault((sources[k % len(sources)], target), []).append(record.key)
    return copies


def stage_in_copies(manifest, needs_by_node: dict[str, list[dict]], node_of: dict[str, str]) -> dict[tuple, list[str]]:
    """(source node, target node) -> keys: the saved chunks of `manifest` that the ranks a next plan puts on
    each target node will read (`needs_by_node`: node -> its ranks' needs, name -> (global shape, chunk)) and
    that the target's store lacks, each from its least loaded live holder. Chunks no live store holds are
    left to the restore (it reads them from the storage). `node_of`: store name -> node of the live stores."""
    store_of = {node: store for store, node in node_of.items()}
    saved = manifest.tensors()
    load: dict[str, int] = {}
    copies: dict[tuple[str, str], list[str]] = {}
    for target in sorted(needs_by_node):
        records = {p.record.key: p.record for needs in needs_by_node[target]
                   for pieces in plan_reads(manifest, needs, saved).values() for p in pieces}
        for key in sorted(records):
            record = records[key]
            holders = sorted(node_of[r] for r in record.replicas if r in node_of)
            if not holders or store_of.get(target) in record.replicas:
                continue
            source = min(holders, key=lambda n: (load.get(n, 0), n))
            load[source] = load.get(source, 0) + record.nbytes
            copies.setdefault((source, target), []).append(key)
    return copies
