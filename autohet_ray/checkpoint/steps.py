"""Committing steps, finding the latest committed one, and collecting old steps safely.

Order of operations that keeps every committed step intact:
- commit: all chunks are written first; the manifest is written last, atomically, per tier;
- collect: only steps older than the newest committed one are removed, and a step's manifest is
  deleted before its chunks (a crash in between leaves orphan chunks, never a manifest without chunks).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from autohet_ray import ConfigError
from autohet_ray.checkpoint.errors import (CheckpointError, ChunkMissingError, IncompleteStepError,
                                           TierUnavailableError)
from autohet_ray.checkpoint.faults import NO_FAULTS, Faults
from autohet_ray.checkpoint.keys import manifest_key, step_of_key, step_prefix
from autohet_ray.checkpoint.manifest import Manifest, merge_records


def commit_step(step: int, records, tiers, *, faults: Faults = NO_FAULTS, extra: dict | None = None,
                on_unavailable=None) -> Manifest:
    """Merge every writer's records into one manifest and commit it to each tier in `tiers` (in order).
    Raises IncompleteStepError, without writing anything, unless the records make a usable step.
    `on_unavailable(tier, error)`: called for a tier that cannot be reached (the others still commit);
    without it that TierUnavailableError is raised."""
    if not tiers:
        raise ConfigError("commit_step needs at least one tier to hold the manifest")
    manifest = merge_records(step, records, extra=extra)
    body = manifest.to_json()
    faults.maybe_fail("before_manifest_commit")
    for tier in tiers:
        try:
            tier.put_manifest(step, body)
        except TierUnavailableError as err:
            if on_unavailable is None:
                raise
            on_unavailable(tier, err)
    faults.maybe_fail("after_manifest_commit")
    return manifest


def load_manifest(tier, step: int) -> Manifest:
    """The committed manifest of `step` in `tier`, checked (its own hash, coverage, single step)."""
    manifest = Manifest.from_json(tier.get_manifest(step), where=f"{manifest_key(step)} in tier {tier.name!r}")
    if manifest.step != step:
        raise CheckpointError(f"manifest of step {step} in tier {tier.name!r} says step {manifest.step}")
    problems = manifest.problems()
    if problems:
        raise IncompleteStepError(step, problems)
    return manifest


@dataclass
class ManifestScan:
    """What a search for committed steps saw, including what it had to skip (nothing is hidden)."""
    steps: dict[int, list[str]] = field(default_factory=dict)        # step -> tiers holding a valid manifest
    rejected: list[str] = field(default_factory=list)                # "tier step: reason"


def scan_manifests(tiers) -> ManifestScan:
    scan = ManifestScan()
    for tier in tiers:
        try:
            steps = tier.list_manifests()
        except TierUnavailableError as err:
            scan.rejected.append(f"{tier.name}: {err}")
            continue
        for step in steps:
            try:
                load_manifest(tier, step)
            except (CheckpointError, ChunkMissingError) as err:
                scan.rejected.append(f"{tier.name} step {step}: {err}")
                continue
            scan.steps.setdefault(step, []).append(tier.name)
    return scan


def latest_committed_step(tiers) -> int | None:
    """The newest step with a valid committed manifest in any tier; partial steps (chunks without a
    manifest) and damaged manifests are ignored."""
    steps = scan_manifests(tiers).steps
    return max(steps) if steps else None


def find_manifest(tiers, step: int) -> Manifest:
    """The manifest of `step` from the first tier holding a valid one."""
    reasons = []
    for tier in tiers:
        try:
            return load_manifest(tier, step)
        except (CheckpointError, ChunkMissingError) as err:
            reasons.append(str(err))
    raise CheckpointError(f"no tier holds a valid manifest of step {step}: " + "; ".join(reasons))


@dataclass
class CollectReport:
    kept_steps: list[int]
    deleted_steps: list[int]           # committed steps removed (manifest first, then chunks)
    deleted_partial_steps: list[int]   # chunk directories of steps that never committed
    deleted_chunks: int


def collect_garbage(tier, *, keep_last: int = 2, committed: list[int] | None = None,
                    in_use: frozenset = frozenset()) -> CollectReport:
    """Delete steps of `tier` older than its newest `keep_last` committed ones. `committed` defaults to
    the steps with a valid manifest in this tier (pass it when the manifests live in another tier).
    Nothing newer than the newest committed step is touched (it may be a step being written), nor any step in
    `in_use` (one still being copied from this tier, such as a storage upload in flight)."""
    if keep_last < 1:
        raise ConfigError(f"keep_last must be >= 1 (never delete the newest committed step), got {keep_last}")
    if committed is None:
        committed = sorted(scan_manifests([tier]).steps)
    committed = sorted(set(committed))
    if not committed:
        return CollectReport([], [], [], 0)
    keep = set(committed[-keep_last:]) | set(in_use)
    newest = committed[-1]
    on_tier = {s for s in (step_of_key(k) for k in tier.list("step-")) if s is not None}
    manifests = set(tier.list_manifests())
    doomed_committed = sorted(s for s in (set(committed) | manifests) if s < newest and s not in keep)
    doomed_partial = sorted(s for s in on_tier - set(committed) - manifests - keep if s < newest)
    deleted = 0
    for step in doomed_committed + doomed_partial:
        tier.delete_manifest(step)
        keys = tier.list(step_prefix(step))
        tier.delete_many(keys)
        deleted += len(keys)
    return CollectReport(sorted(keep), doomed_committed, doomed_partial, deleted)
