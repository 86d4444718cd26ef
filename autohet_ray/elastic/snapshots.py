"""Where each rank's snapshot chunks go: its node's store, peer node stores (another GPU type first) and the
durable storage; plain jobs without node stores write straight to the storage."""
from __future__ import annotations

from autohet_ray.checkpoint import place_copies
from autohet_ray.elastic.tiers import push_spec


def configure_snapshots(group, keeper_specs: dict[str, dict], storage: dict, *, node_gpu: dict[str, str],
                        num_peers: int, cloud_every: int) -> None:
    """Send every worker of `group` its snapshot routes. With `keeper_specs` (elastic): each chunk lands in
    1 + num_peers node stores (data-parallel copies written where they already are) and, every `cloud_every`
    steps, in `storage`. Without: in `storage` only, whenever a snapshot is taken."""
    holdings = dict(enumerate(group.call("holdings", timeout_s=60)))
    pipeline_of = {rank: slot["pipeline"] for rank, slot in enumerate(group.slots)}
    rank_nodes = {rank: slot["node"] for rank, slot in enumerate(group.slots)}
    copies = 1 + min(num_peers, len(node_gpu) - 1) if keeper_specs else 1
    placed = place_copies(tiling_holdings(holdings, pipeline_of), rank_nodes, node_gpu, copies=copies)
    cloud = storage if keeper_specs and cloud_every else None
    refs = []
    for rank, actor in enumerate(group.actors):
        local = keeper_specs[rank_nodes[rank]] if keeper_specs else storage
        peers = {p: push_spec(keeper_specs[p], local) for p in sorted(placed.push[rank])}
        routes = {local["name"]: placed.local[rank], **{peers[p]["name"]: placed.push[rank][p] for p in peers}}
        if cloud:
            routes[cloud["name"]] = placed.upload[rank]
        ordered = {tier: sorted(items, key=lambda i: (i[0], i[1].offsets)) for tier, items in routes.items()}
        refs.append(actor.configure_snapshots.remote(routes=ordered, local=local, peers=list(peers.values()),
                                                     cloud=cloud, cloud_every=cloud_every if cloud else 0))
    group.gather(refs, 60)


def tiling_holdings(holdings: dict[int, list], rank_pipeline: dict[int, int]) -> dict[int, list]:
    """Keep, per tensor, only the holdings of one pipeline: pipelines may shard a tensor differently (TP2 in
    one, whole in another), and a step's chunks must tile each tensor exactly. The pipeline with the most
    distinct chunks wins (writes spread over more ranks), then the lowest index; other pipelines' ranks keep
    the chunks identical to its tiles (data-parallel copies, which can be written where they already are)."""
    chunks: dict[str, dict[int, set]] = {}
    for rank, items in holdings.items():
        for name, chunk, _ in items:
            chunks.setdefault(name, {}).setdefault(rank_pipeline[rank], set()).add(chunk)
    chosen = {name: min(by_pipe, key=lambda k: (-len(by_pipe[k]), k)) for name, by_pipe in chunks.items()}
    tiles = {name: chunks[name][k] for name, k in chosen.items()}
    return {rank: [item for item in items if item[1] in tiles[item[0]]] for rank, items in holdings.items()}
