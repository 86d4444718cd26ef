"""Checkpoints for recovery from node loss: hashed chunks in tiers (node memory, peer node, the job's storage),
atomic per-step manifests, resharding restore, asynchronous snapshots. torch + boto3 only (no Ray).

Typical flow (one coordinator, many ranks):
    snap = AsyncSnapshotter(local=node_tier, peers=[peer_tier], storage=storage_tier, policy=SnapshotPolicy())
    handle = snap.snapshot(step, engine.state_dict(), owned=writers[rank])      # per rank
    commit_step(step, [r for h in handles for r in h.fast_result().records], tiers=[node_tier, ...])
    ...
    manifest = find_manifest(tiers, latest_committed_step(tiers))
    state, report = restore(manifest, needs, tiers=[node_tier, peer_tier, storage_tier])
"""
from autohet_ray.checkpoint.errors import (CheckpointError, ChunkMissingError, ChunkUnavailableError,
                                           CorruptChunkError, IncompleteStepError, InjectedFault,
                                           ManifestExistsError, TierUnavailableError)
from autohet_ray.checkpoint.faults import NO_FAULTS, POINTS, Faults
from autohet_ray.checkpoint.manifest import ChunkRecord, Manifest, merge_records
from autohet_ray.checkpoint.peers import CopyPlan, assign_writers, choose_peers, place_copies
from autohet_ray.checkpoint.reshard import (ChunkFetcher, LayoutMismatchError, Piece, RestoreReport, TierStats,
                                            choose_restorable_step, plan_reads, restore)
from autohet_ray.checkpoint.snapshot import AsyncSnapshotter, LaneResult, SnapshotHandle, SnapshotPolicy
from autohet_ray.checkpoint.steps import (CollectReport, collect_garbage, commit_step, find_manifest,
                                          latest_committed_step, load_manifest, scan_manifests)
from autohet_ray.checkpoint.tiers import LocalDirTier, MemoryTier, ThrottledTier, Tier, TokenBucket

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
