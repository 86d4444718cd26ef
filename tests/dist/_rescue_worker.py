"""Worker side of the lost-slice rescue test: a sharded run snapshots its step into per-node directory stores
(each chunk on two nodes, as in _slice_worker) and the storage; then the stores of `lost` nodes are wiped
while every rank lives on, and the survivors rewrite the chunks no store holds any more from what they hold
live (the controller's rescue: orchestrate.worker.Worker.write_live_chunks) into their node's store."""
from __future__ import annotations

import os
import shutil

import torch.distributed as dist

from _harness import make_batch
from _sharded_worker import ShardCase, _engine
from _slice_worker import _snapshotter, node_tier, storage_tier
from autohet_ray.checkpoint import AsyncSnapshotter, commit_step, find_manifest, restore
from autohet_ray.runtime.optim import needs_of_layout


def _everyones(item) -> list:
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, item)
    return gathered


def _orphans(fast_records: list, lost_names: set[str]) -> dict[str, dict]:
    """key -> what write_live_chunks is asked for, of every chunk whose node-store copies were all on `lost`."""
    replicas: dict[str, set] = {}
    for r in fast_records:
        replicas.setdefault(r.key, set()).update(r.replicas)
    first = {r.key: r for r in reversed(fast_records)}
    return {key: {"key": key, "name": first[key].name, "offsets": list(first[key].chunk.offsets),
                  "sizes": list(first[key].chunk.sizes), "digest": first[key].digest}
            for key, where in replicas.items() if where <= lost_names}


def _storage_bytes(engine, root: str, step: int) -> int:
    """Bytes this rank's restore of `step` (its own plan) reads from the storage, node stores first."""
    tiers = [*(node_tier(root, n) for n in "abc"), storage_tier(root)]
    _, report = restore(find_manifest(tiers, step), needs_of_layout(engine.layout), tiers)
    return report.bytes_by_tier().get("storage", 0)


def rescue_lost_slices(rank: int, world_size: int, case: ShardCase, root: str, rank_nodes: dict[int, str],
                       lost: tuple[str, ...]) -> dict:
    from autohet_ray.orchestrate.worker import Worker       # imports Ray (not started)
    engine = _engine(case, rank, None)
    snap, routes = _snapshotter(engine, root, rank_nodes)
    for step in range(case.steps):
        engine.train_step(make_batch(case.spec, case.plan, step))
    handle = snap.snapshot(engine.step, engine.snapshot_state(), owned=set().union(*routes.values()), routes=routes)
    fast, stored = handle.fast_result().records, handle.storage_result().records
    snap.close()
    fast = [r for rs in _everyones(fast) for r in rs]
    if rank == 0:
        commit_step(engine.step, fast + [r for rs in _everyones(stored) for r in rs],
                    [*(node_tier(root, n) for n in "abc"), storage_tier(root)])
        for node in lost:
            shutil.rmtree(os.path.join(root, node))
    else:
        _everyones(stored)
    dist.barrier()
    orphans = _orphans(fast, {node_tier(root, n).name for n in lost})
    before = _storage_bytes(engine, root, engine.step)
    dist.barrier()                       # every rank has read before any rewrites
    worker = Worker(rank)
    worker.engine, worker.snapshotter = engine, AsyncSnapshotter(local=node_tier(root, rank_nodes[rank]))
    written = worker.write_live_chunks(engine.step, list(orphans.values()))
    worker.close_snapshots()
    dist.barrier()
    return {"orphans": sorted(orphans), "orphan_names": sorted({o["name"] for o in orphans.values()}),
            "written": written, "storage_bytes_before": before,
            "storage_bytes_after": _storage_bytes(engine, root, engine.step)}
