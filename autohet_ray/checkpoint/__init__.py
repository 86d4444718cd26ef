"""Checkpoints for recovery from node loss: hashed chunks in tiers (node memory, peer node, the job's storage),
atomic per-step manifests, resharding restore, asynchronous snapshots. torch + boto3 only (no Ray).

Typical flow (one coordinator, many ranks):
    snap = AsyncSnapshotter(local=node_tier, peers=[peer_tier], storage=storage_tier, policy=SnapshotPolicy())
    handle = snap.snapshot(step, engine.snapshot_state(), owned=writers[rank])  # per rank (no collective)
    commit_step(step, [r for h in handles for r in h.fast_result().records], tiers=[node_tier, ...])
    ...
    manifest = find_manifest(tiers, latest_committed_step(tiers))
    state, report = restore(manifest, needs, tiers=[node_tier, peer_tier, storage_tier])

The names below load their submodule on first use, so the torch-free parts (errors, keys, faults, tiers,
tier specs) import without torch: storage/ and the CLI use them.
"""
import importlib

_HOME = {    # name -> the submodule that defines it
    "CheckpointError": "errors", "ChunkMissingError": "errors", "ChunkUnavailableError": "errors",
    "CorruptChunkError": "errors", "IncompleteStepError": "errors", "InjectedFault": "errors",
    "ManifestExistsError": "errors", "TierUnavailableError": "errors",
    "Faults": "faults", "NO_FAULTS": "faults", "POINTS": "faults",
    "ChunkRecord": "manifest", "Manifest": "manifest", "merge_records": "manifest",
    "assign_writers": "peers", "choose_peers": "peers", "CopyPlan": "peers", "place_copies": "peers",
    "choose_restorable_step": "reshard", "ChunkFetcher": "reshard", "LayoutMismatchError": "reshard",
    "Piece": "reshard", "plan_reads": "reshard", "restore": "reshard", "RestoreReport": "reshard",
    "TierStats": "reshard",
    "AsyncSnapshotter": "snapshot", "LaneResult": "snapshot", "SnapshotHandle": "snapshot",
    "SnapshotPolicy": "snapshot",
    "collect_garbage": "steps", "CollectReport": "steps", "commit_step": "steps", "find_manifest": "steps",
    "latest_committed_step": "steps", "load_manifest": "steps", "scan_manifests": "steps",
    "LocalDirTier": "tiers", "MemoryTier": "tiers", "ThrottledTier": "tiers", "Tier": "tiers", "TokenBucket": "tiers",
}

__all__ = [
    "CopyPlan", "place_copies",
    "AsyncSnapshotter", "CheckpointError", "ChunkFetcher", "ChunkMissingError", "ChunkRecord",
    "ChunkUnavailableError", "CollectReport", "CorruptChunkError", "Faults", "IncompleteStepError",
    "InjectedFault", "LaneResult", "LayoutMismatchError", "LocalDirTier", "Manifest", "ManifestExistsError",
    "MemoryTier", "NO_FAULTS", "POINTS", "Piece", "RestoreReport", "SnapshotHandle", "SnapshotPolicy",
    "ThrottledTier", "Tier", "TierStats", "TierUnavailableError", "TokenBucket", "assign_writers",
    "choose_peers", "choose_restorable_step", "collect_garbage", "commit_step", "find_manifest",
    "latest_committed_step", "load_manifest", "merge_records", "plan_reads", "restore", "scan_manifests",
]


def __getattr__(name: str):
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'autohet_ray.checkpoint' has no attribute {name!r}")
    return getattr(importlib.import_module(f"autohet_ray.checkpoint.{home}"), name)   # torch only where needed
