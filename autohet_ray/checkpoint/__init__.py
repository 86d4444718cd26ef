"""Checkpoints for recovery from node loss: hashed chunks in tiers (node memory, peer node, cloud),
atomic per-step manifests, resharding restore, asynchronous snapshots. torch + boto3 only (no Ray).

Typical flow (one coordinator, many ranks):
    snap = AsyncSnapshotter(local=node_tier, peers=[peer_tier], cloud=cloud_tier, policy=SnapshotPolicy())
    handle = snap.snapshot(step, engine.state_dict(), owned=writers[rank])      # per rank
    commit_step(step, [r for h in handles for r in h.fast_result().records], tiers=[node_tier, ...])
    ...
    manifest = find_manifest(tiers, latest_committed_step(tiers))
    state, report = restore(manifest, needs, tiers=[node_tier, peer_tier, cloud_tier])
"""
import importlib

# Each public name and the module that defines it, imported on first use (PEP 562): a process that needs
# only the torch-free parts (a node keeper: node_store, copy_check, chunk_hash) does not import torch.
_MODULE_OF = {
    "errors": ["CheckpointError", "ChunkMissingError", "ChunkUnavailableError", "CorruptChunkError",
               "IncompleteStepError", "InjectedFault", "ManifestExistsError", "TierUnavailableError"],
    "faults": ["NO_FAULTS", "POINTS", "Faults"],
    "manifest": ["ChunkRecord", "Manifest", "merge_records"],
    "peers": ["CopyPlan", "assign_writers", "choose_peers", "place_copies"],
    "reshard": ["ChunkFetcher", "LayoutMismatchError", "Piece", "RestoreReport", "TierStats",
                "choose_restorable_step", "plan_reads", "restore"],
    "snapshot": ["AsyncSnapshotter", "LaneResult", "SnapshotHandle", "SnapshotPolicy"],
    "steps": ["CollectReport", "collect_garbage", "commit_step", "find_manifest", "latest_committed_step",
              "load_manifest", "scan_manifests"],
    "tiers": ["LocalDirTier", "MemoryTier", "ThrottledTier", "Tier", "TokenBucket"],
}
_NAMES = {name: module for module, names in _MODULE_OF.items() for name in names}


def __getattr__(name: str):
    if name not in _NAMES:
        raise AttributeError(f"module 'autohet_ray.checkpoint' has no attribute {name!r}")
    return getattr(importlib.import_module(f"autohet_ray.checkpoint.{_NAMES[name]}"), name)


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
