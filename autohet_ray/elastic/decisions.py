"""What recovery decides (elastic/recovery.py), as plain data the controller carries out, and why a job stops."""
from __future__ import annotations

from dataclasses import dataclass, field


class RecoveryFailed(RuntimeError):
    """Recovery could not name the failure, or no committed step could be restored."""


class StepFailed(RuntimeError):
    """A step raised on a healthy cluster (every node and worker answers): an error, not a loss; the job ends
    (its committed steps kept) instead of recovering into the same error."""


@dataclass(frozen=True)
class Stop:
    """End the job: the controller raises `error` (its exit path secures the newest committed step)."""
    error: Exception


@dataclass(frozen=True)
class Salvage:
    """Nodes or workers were lost (`lost`: liveness.detect_failure's report): drop the lost nodes' stores, keep
    the survivors' processes (after they rewrote the chunks only they still hold), then relaunch."""
    lost: dict
    detect_s: float


@dataclass(frozen=True)
class Relaunch:
    """Rediscover the live nodes, plan on them (or run `plan`), restart reusing `reuse` (node name -> idle
    actors) and restore the newest committed step from `restore_from` ("local_first" or "cloud_only"; None:
    nothing was committed, so the job starts over from its seeded initialization)."""
    reason: str
    reuse: dict
    plan: dict | None = None
    restore_from: str | None = "local_first"


@dataclass(frozen=True)
class Drain:
    """Spot notices or Ray drains between steps: flush, acknowledge `ack` (notice-board node ids), then
    re-plan without `leaving` (node names; none: only nodes the job does not use were noticed)."""
    ack: list[str]
    leaving: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Grow:
    """Nodes of the cluster file joined since the last plan: re-plan onto them."""
    joined: list[str]
