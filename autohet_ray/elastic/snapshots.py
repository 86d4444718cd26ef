"""Sending each rank its snapshot routes (checkpoint/holdings.py: snapshot_routes)."""
from __future__ import annotations

from autohet_ray.checkpoint.holdings import snapshot_routes


def configure_snapshots(group, keeper_specs: dict[str, dict], storage: dict, *, node_gpu: dict[str, str],
                        num_peers: int, storage_every: int) -> None:
    """Send every worker of `group` where its snapshot chunks go (node store, peers, storage)."""
    holdings = dict(enumerate(group.call("holdings", timeout_s=60)))
    routes = snapshot_routes(holdings, group.slots, keeper_specs, storage, node_gpu=node_gpu, num_peers=num_peers,
                             storage_every=storage_every)
    group.gather([actor.configure_snapshots.remote(**kw) for actor, kw in zip(group.actors, routes)], 60)
