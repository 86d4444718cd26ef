"""What recovery decides (recovery/policy.py), as plain data the controller carries out, and why a job stops."""
from __future__ import annotations

from dataclasses import dataclass, field


class RecoveryFailed(RuntimeError):
    """Recovery could not name the failure, or no committed step could be restored."""


class StepFailed(RuntimeError):
    """A step raised on a healthy cluster (every node and worker answers): an error, not a loss; the job ends
    (its committed steps kept) instead of recovering into the same error."""


@dataclass(frozen=True)
class Stop:
    """End the job: raise `error` (the exit path then secures the newest committed step)."""
    error: Exception


@dataclass(frozen=True)
class Salvage:
    """`lost` (liveness.detect_failure's report) is gone: drop its stores, keep the survivors' processes."""
    lost: dict
    detect_s: float


@dataclass(frozen=True)
class Relaunch:
    """Rediscover, plan (or run `plan`), restart reusing `reuse` (node name -> idle actors), restore from
    `restore_from` ("local_first", "cloud_only"; None: nothing was committed, start from the seeded init)."""
    reason: str
    reuse: dict
    plan: dict | None = None
    restore_from: str | None = "local_first"


@dataclass(frozen=True)
class Drain:
    """Notices or drains: flush, acknowledge `ack` (node ids), re-plan without `leaving` (node names), if any."""
    ack: list[str]
    leaving: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Grow:
    """Nodes of the cluster file joined: re-plan onto them."""
    joined: list[str]


def named_failure(group, lost_nodes: list[str], dead: list[int], failure: Exception) -> dict:
    """What a failed call of `group` (a WorkerGroup: its slots, describe) lost: `lost_nodes` (those of the plan
    and store-only ones) or, when none, the `dead` ranks. {"lost_nodes", "dead_ranks", "message"}."""
    ranks = [r for r, s in enumerate(group.slots) if s["node"] in lost_nodes] or dead
    stores_only = sorted(set(lost_nodes) - {s["node"] for s in group.slots})
    named = "; ".join([group.describe(r) for r in ranks] +
                      [f"node {node} (its node store only, no worker)" for node in stores_only])
    what = f"lost node(s) {lost_nodes}" if lost_nodes else "dead worker(s)"
    return {"lost_nodes": lost_nodes, "dead_ranks": ranks, "message": f"{what}: {named} (first error: {failure})"}
