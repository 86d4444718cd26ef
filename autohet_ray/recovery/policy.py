"""Recovery and re-planning of a running job: the controller's elastic half, an object that owns its own state
and returns decisions (recovery/decisions.py) for the controller to carry out. Pure: the events come in as
data, and elastic/recovery.py (LiveRecovery) adds what asks Ray (usable nodes, stage-in copies).

A failed step is handled in rounds: detect (name the lost node or dead worker; Stop when the cluster is healthy,
nothing can be named, or the job keeps no checkpoints) -> Salvage (drop the lost stores, stop the survivors'
step, keep their processes) -> Relaunch (rediscover, plan on what is left, restart, restore the newest committed
step from the cheapest copies). A loss while relaunching starts the next round, as does a loss during the first
step after it (the controller's loop); RecoveryBudget bounds a failure that comes back on every step. Planned
changes between steps (Drain: a spot notice or a Ray drain; Grow: nodes that joined) flush first, so they lose
no step.
"""
from __future__ import annotations

import time

from autohet_ray.recovery.budget import RecoveryBudget, RecoveryExhausted
from autohet_ray.recovery.decisions import Drain, Grow, Relaunch, RecoveryFailed, Salvage, StepFailed, Stop

MAX_RECOVERIES_IN_A_ROW = 5


class Recovery:
    def __init__(self, *, max_recoveries: int, window_steps: int, mode: str = "local_first"):
        self.mode = mode                     # how a recovery restores ("cloud_only": the baseline)
        self.budget = RecoveryBudget(max_recoveries, window_steps)
        self.draining: set[str] = set()      # ids of nodes with a spot notice or a Ray drain: planned around
        self.gone: set[str] = set()          # ids of nodes confirmed lost before Ray's health checks said so
        self.staging: list = []              # copies toward the next plan's nodes, started at a loss
        self.fault_at: float | None = None   # when a test or benchmark injected a failure (detection is timed from it)
        self.recoveries: list[dict] = []     # the report of every recovery and planned re-plan
        self.standby_failures: list[str] = []   # prepared switches whose standby setup failed (and why)
        self.rounds: list[dict] = []         # the failed rounds of the recovery in progress
        self.started_at = self.round_at = 0.0
        self.completed = 0                   # the steps completed when the recovery in progress began

    # -- a failed step -----------------------------------------------------------------------------------------
    def on_failure(self, failure, *, completed: int) -> Stop | None:
        """A step failed after `completed` steps: Stop when the budget is spent, else a recovery begins."""
        try:
            self.budget.charge(failure, completed + 1)
        except RecoveryExhausted as err:
            return Stop(err)
        self.started_at = time.perf_counter()
        self.round_at = self.fault_at or self.started_at
        self.completed, self.rounds = completed, []
        return None

    def diagnose(self, failure, *, healthy, detect, keeps_checkpoints: bool,
                 node_ids: dict[str, str]) -> Stop | Salvage:
        """What `failure` lost, in this round. `healthy()`: whether every node and worker answers; `detect()`:
        liveness.detect_failure's report (RuntimeError when it names nothing); node_ids: node name -> Ray id."""
        if not getattr(failure, "dead", True) and healthy():
            return Stop(StepFailed(f"a step failed with every node and worker alive: {failure}"))
        try:
            lost = detect()
        except RuntimeError as err:
            return Stop(RecoveryFailed(str(err)))
        detect_s = time.perf_counter() - self.round_at
        if not keeps_checkpoints:                  # the group stays whole: closing the job stops every worker
            return Stop(RecoveryFailed(f"{lost['message']}; the job keeps no checkpoints (give it a storage), so "
                                       f"it cannot continue"))
        self.gone |= {node_ids[node] for node in lost["lost_nodes"]}
        return Salvage(lost, detect_s)

    def relaunch(self, reason: str, reuse: dict, *, nothing_committed: bool, plan: dict | None = None,
                 planned: bool = False) -> Relaunch:
        """Relaunch after a loss (restoring as `mode` says) or a planned change (from the flushed step, local
        first). A loss before the first commit (and no step restored at the start) starts over from the seeded
        initialization, which is what a restore of "step 0" would give."""
        return Relaunch(reason, reuse, plan, None if nothing_committed else "local_first" if planned else self.mode)

    def lost_again(self, failure, report: dict) -> Stop | None:
        """A loss while relaunching, after the phases in `report`: the next round starts now, or Stop after
        MAX_RECOVERIES_IN_A_ROW rounds without a completed launch."""
        self.rounds.append(report)
        if len(self.rounds) >= MAX_RECOVERIES_IN_A_ROW:
            return Stop(RecoveryFailed(f"{MAX_RECOVERIES_IN_A_ROW} losses in a row while recovering; last: "
                                       f"{failure}"))
        self.round_at = time.perf_counter()
        return None

    def recovered(self, report: dict) -> dict:
        """The report of a completed recovery (the controller adds its first step)."""
        report |= {"started_at": self.fault_at or self.started_at, "rounds": len(self.rounds) + 1,
                   "earlier_rounds": self.rounds, "completed_step": self.completed,
                   "lost_steps": self.completed - report["restored_step"]}
        self.fault_at = None
        self.recoveries.append(report)
        return report

    def replanned(self, report: dict, completed: int) -> dict:
        """The report of a planned re-plan made after `completed` steps."""
        report["lost_steps"] = completed - report["restored_step"]
        self.recoveries.append(report)
        return report

    def mark_fault(self) -> None:
        self.fault_at = time.perf_counter()

    def progressed(self, step: int) -> None:
        self.budget.progressed(step)

    # -- between steps -----------------------------------------------------------------------------------------
    def on_notices(self, pending: set[str], drains: set[str], names: dict[str, str]) -> Drain | None:
        """Spot notices (`pending`: the notice board's node ids) and Ray drains (`drains`: node ids) between
        steps; `names`: node id -> name of the job's live nodes. None when nothing is pending."""
        noticed = sorted({names[i] for i in pending | drains if i in names})
        if not noticed and not pending:
            return None
        self.draining |= pending     # also a noticed node not planned onto yet (it joined): never plan onto it
        self.draining |= {i for i, name in names.items() if name in noticed}
        return Drain(sorted(pending), noticed)

    @staticmethod
    def on_joins(current: set[str], available: set[str]) -> Grow | None:
        """Nodes the job may use now (`available`: named nodes of the cluster file and live instances of its node
        types, whatever their ids) that the last plan (`current`) did not have; None when none."""
        joined = sorted(available - current)
        return Grow(joined) if joined else None

    # -- what the next plan may use --------------------------------------------------------------------------
    def drained(self, node_ids) -> None:
        """Ray drains seen at the start: never plan onto those nodes."""
        self.draining |= set(node_ids)

    def dead_nodes(self, cluster, usable: list[dict]) -> list[str]:
        """Named nodes of `cluster` (the cluster file) with no usable live Ray node (`usable`: the `ray.nodes()`
        entries of live nodes the job may use). A node type's instances are whichever live nodes match it."""
        names = {(raw.get("Labels") or {}).get("autohet.io/node") for raw in usable}
        return [n.name for n in cluster.nodes if n.node_type is None and n.name not in names]


def store_only_nodes(stores, slots: list[dict]) -> tuple[str, ...]:
    """Nodes whose store (keeper) takes this job's copies (`stores`: their names) but that run none of its
    workers (`slots`): their loss fails the next snapshot that pushes there, and is a node loss like any other."""
    return tuple(sorted(set(stores) - {s["node"] for s in slots}))
