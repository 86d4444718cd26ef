"""Worker side of the slice-stored checkpoint tests: a sharded run snapshots each step with the real
snapshotter into per-node directory stores (each chunk on two nodes, checkpoint.peers.place_copies) and a
storage directory; a later world restores from the stores that survive and trains on."""
from __future__ import annotations

import os

import torch.distributed as dist

from _harness import make_batch
from _sharded_worker import ShardCase, _engine, train_then_state
from autohet_ray.checkpoint import (AsyncSnapshotter, LocalDirTier, MemoryTier, SnapshotPolicy, assign_writers,
                                    commit_step, place_copies)
from autohet_ray.checkpoint.holdings import tiling_holdings

NODE_GPU = {"a": "A100", "b": "L40S", "c": "V100"}


def node_tier(root: str, node: str) -> LocalDirTier:
    return LocalDirTier(os.path.join(root, node), name=f"node-{node}", fsync=False)


def storage_tier(root: str) -> LocalDirTier:
    return LocalDirTier(os.path.join(root, "storage"), name="storage", fsync=False)


def written_bytes(engine) -> int:
    """Bytes one snapshot of everything this rank stores writes to a tier (serialized chunks)."""
    snap = AsyncSnapshotter(local=MemoryTier("probe"))
    try:
        return snap.snapshot(engine.step, engine.snapshot_state()).fast_result().bytes_written["probe"]
    finally:
        snap.close()


def _snapshotter(engine, root: str, rank_nodes: dict[int, str]) -> tuple[AsyncSnapshotter, dict]:
    """This rank's snapshotter and routes: its node's store, peer stores, the storage (every step)."""
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (engine.info.pipeline, engine.snapshot_holdings()))
    holdings = {rank: items for rank, (_, items) in enumerate(gathered)}
    pipelines = {rank: pipeline for rank, (pipeline, _) in enumerate(gathered)}
    placed = place_copies(tiling_holdings(holdings, pipelines), rank_nodes, NODE_GPU, copies=2)
    me = engine.rank
    local = node_tier(root, rank_nodes[me])
    peers = {node: node_tier(root, node) for node in placed.push[me]}
    routes = {local.name: placed.local[me], "storage": placed.upload[me],
              **{peers[n].name: items for n, items in placed.push[me].items()}}
    snap = AsyncSnapshotter(local=local, peers=list(peers.values()), storage=storage_tier(root),
                            policy=SnapshotPolicy(storage_every=1))
    return snap, routes


def train_with_snapshots(rank: int, world_size: int, case: ShardCase, root: str, rank_nodes: dict[int, str],
                         snapshot_steps: tuple[int, ...]) -> dict:
    """The unsharded engine's snapshot bytes after one step; then the sharded run of `case.steps` steps,
    snapshotting after each step in `snapshot_steps`: its losses, records and snapshot bytes."""
    unsharded = _engine(case, rank, "none")
    unsharded.train_step(make_batch(case.spec, case.plan, 0))
    out = {"unsharded_bytes": written_bytes(unsharded), "losses": [], "records": {}}
    engine = _engine(case, rank, None)
    snap, routes = _snapshotter(engine, root, rank_nodes)
    owned = set().union(*routes.values())
    for step in range(case.steps):
        out["losses"].append(engine.train_step(make_batch(case.spec, case.plan, step))["loss"])
        if step == 0:
            out["sharded_bytes"] = written_bytes(engine)
        if engine.step in snapshot_steps:
            handle = snap.snapshot(engine.step, engine.snapshot_state(), owned=owned, routes=routes)
            out["records"][engine.step] = handle.fast_result().records + handle.storage_result().records
    snap.close()
    out["holdings"] = engine.snapshot_holdings()
    live = engine.live_state(gather=False)              # no collective, no wait for the last all-gathers
    out["live"] = {name: (t.clone(), shape, chunk) for name, (t, shape, chunk) in live.items()}
    out["slices"] = {key: (t.clone(), shape, chunk) for key, (t, shape, chunk) in engine.snapshot_state().items()}
    out["state"] = engine.state_dict()
    return out


def restore_from_stores(rank: int, world_size: int, case: ShardCase, root: str, nodes: tuple[str, ...],
                        steps: range) -> dict:
    """Restore the newest step committed in the stores of `nodes` (then the storage) onto `case`'s plan and
    train `steps`: losses and bytes read per tier."""
    from autohet_ray.checkpoint import find_manifest, latest_committed_step, restore
    from autohet_ray.runtime.optim import needs_of_layout
    engine = _engine(case, rank, None)
    tiers = [*(node_tier(root, n) for n in nodes), storage_tier(root)]
    step = latest_committed_step(tiers[:-1])
    state, report = restore(find_manifest(tiers, step), needs_of_layout(engine.layout), tiers)
    engine.load_state_dict(state)
    losses = [engine.train_step(make_batch(case.spec, case.plan, s))["loss"] for s in steps]
    return {"step": step, "losses": losses, "bytes_by_tier": report.bytes_by_tier(),
            "sharded_ops": sum(o.sharded for o in engine.grad_sync.ops)}


def write_checkpoint(ranks: list[dict], tier, step: int) -> None:
    """Write what each rank's snapshot stores (train_then_state's "state" and "holdings") into `tier` with the
    real snapshotter, one writer per chunk of one tiling per tensor (checkpoint/holdings.py, as the elastic job
    picks them), and commit the step."""
    holdings = {rank: r["holdings"] for rank, r in enumerate(ranks)}
    owned = assign_writers(tiling_holdings(holdings, {rank: r["pipeline"] for rank, r in enumerate(ranks)}))
    records = []
    for rank, r in enumerate(ranks):
        snap = AsyncSnapshotter(local=tier)
        records += snap.snapshot(step, r["state"], owned=owned[rank]).fast_result().records
        snap.close()
    commit_step(step, records, tiers=[tier])


def train_both(rank: int, world_size: int, case: ShardCase, steps: int) -> dict:
    """`steps` steps of `case` unsharded, then sharded (train_then_state each)."""
    return {mode: train_then_state(rank, world_size, case, steps, sharding)
            for mode, sharding in (("none", "none"), ("sharded", None))}
