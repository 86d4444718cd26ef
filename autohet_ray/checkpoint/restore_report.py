"""Pure parts of restoring a committed step into a live group (elastic/restore.py): each rank's tier read
order, the chunks a restore could not use, and one report over the ranks."""
from __future__ import annotations

from autohet_ray import ConfigError
from autohet_ray.checkpoint.tier_specs import location

RESTORE_MODES = ("local_first", "cloud_only")


class NothingToRestore(ConfigError):
    """No committed step could be restored from any tier (a user error when resuming: wrong storage)."""


def tier_order(rank_node: str, keeper_specs: dict[str, dict], storage: dict, mode: str) -> list[dict]:
    """Read order for one rank, cheapest first: its node's keeper, the other keepers, then the storage."""
    if mode not in RESTORE_MODES:
        raise ConfigError(f"restore mode {mode!r}; valid: {', '.join(RESTORE_MODES)}")
    if mode == "cloud_only":
        return [storage]
    own = [keeper_specs[rank_node]] if rank_node in keeper_specs else []
    return own + [spec for node, spec in sorted(keeper_specs.items()) if node != rank_node] + [storage]


def skipped_chunk(missing: dict, specs: dict[str, dict]) -> dict:
    """One chunk a restore could not use: its step, tensor, and per tier the object and why."""
    key = missing["key"]
    tiers = [{"tier": name, "object": location(specs[name], key) if name in specs else key,
              "reason": reason} for name, reason in missing["attempts"]]
    return {"step": missing["step"], "tensor": key.split("/")[1], "chunk": key, "tiers": tiers}


def describe_skipped(entry: dict) -> str:
    where = "; ".join(f"{t['tier']} {t['object']}: {t['reason']}" for t in entry["tiers"]) or "no tier"
    return f"step {entry['step']}: tensor {entry['tensor']} chunk {entry['chunk']} ({where})"


def merge_restores(outs: list[dict], own_stores: list[str | None], node_stores: set[str]) -> dict:
    """One figure per phase over the ranks (they fetch in parallel: the slowest rank counts), and the bytes
    ranks read from node stores (`node_stores`) of nodes other than their own (`own_stores`, per rank)."""
    by_tier: dict[str, int] = {}
    span: dict[str, float] = {}
    other_nodes = 0
    for out, own in zip(outs, own_stores, strict=True):
        for tier, nbytes in out["bytes_by_tier"].items():
            by_tier[tier] = by_tier.get(tier, 0) + nbytes
            other_nodes += nbytes if tier in node_stores and tier != own else 0
        for tier, seconds in out["tier_read_s"].items():
            span[tier] = max(span.get(tier, 0.0), seconds)
    return {"fetch_s": max(o["fetch_s"] for o in outs), "load_s": max(o["load_s"] for o in outs),
            "bytes_by_tier": by_tier, "bytes_from_other_nodes": other_nodes, "fetch_s_by_tier": span,
            "fallbacks": [f for o in outs for f in o["fallbacks"]][:10]}
