"""Restoring a committed step into a live group of workers: the newest step some tier still holds, each rank
reading every chunk from the cheapest tier that has a valid copy. A step with a chunk no tier holds validly is
skipped (and every such chunk named: step, tensor, tier and object); a worker or node lost during the restore
is not a reason to skip a step: it is raised, for recovery to handle like any other loss."""
from __future__ import annotations

from autohet_ray.checkpoint import find_manifest
from autohet_ray.checkpoint.restore_report import (NothingToRestore, describe_skipped, merge_restores,
                                                   skipped_chunk, tier_order)
from autohet_ray.recovery.report import report_failure


def restore_newest(group, committer, keeper_specs: dict[str, dict], storage: dict, mode: str,
                   timeout_s: float) -> dict:
    """Load the newest committed step whose chunks some tier still holds into every rank of `group`.
    Returns the restore report: restored_step, phase seconds, bytes per tier, and `skipped_chunks`."""
    steps = committer.committed_steps(mode)
    if not steps:
        raise NothingToRestore(f"no committed step in the {mode} tiers; nothing to resume from")
    rank_nodes = [slot["node"] for slot in group.slots]
    specs = {spec["name"]: spec for spec in [*keeper_specs.values(), storage]}
    skipped: list[dict] = []
    for step in steps:
        manifest = find_manifest(committer.manifest_tiers(mode), step)
        body = manifest.to_json()
        refs = [actor.restore.remote(manifest_json=body,
                                     tiers=tier_order(rank_nodes[r], keeper_specs, storage, mode))
                for r, actor in enumerate(group.actors)]
        outs = group.gather(refs, timeout_s)         # a lost worker raises GroupFailure: recovery's business
        missing = [out["unavailable"] for out in outs if out.get("unavailable")]
        if missing:
            unique = {m["key"]: m for m in missing}.values()
            for entry in (skipped_chunk(m, specs) for m in unique):
                skipped.append(entry)
                report_failure(step, f"tensor {entry['tensor']} chunk {entry['chunk']} skipped on restore",
                               ", ".join(t["tier"] for t in entry["tiers"]) or "none",
                               "; ".join(f"{t['tier']}: {t['reason']}" for t in entry["tiers"]) or "no tier holds it")
            continue
        own = [keeper_specs[node]["name"] if node in keeper_specs else None for node in rank_nodes]
        return {"restored_step": step, "mode": mode, "skipped_chunks": skipped, "recorded": manifest.extra,
                **merge_restores(outs, own, {spec["name"] for spec in keeper_specs.values()})}
    raise NothingToRestore("no committed step could be restored: " +
                           "; ".join(describe_skipped(s) for s in skipped))
