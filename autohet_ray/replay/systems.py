"""The three systems replayed on one clock: ours (local-first recovery, re-plan at every change), checkpoint-
restart (cloud checkpoints every N s, restart from the newest on every loss; a join does what its JOIN_POLICIES
entry says), and no re-planning.

Rules shared by all three (stated in the replay's output):
- A removal hits a plan when it takes a node of a pool the plan uses (victims: the plan's nodes first).
  A removal of idle nodes changes nothing for a running job.
- Ours re-plans at every join and moves onto the new plan (the controller's check_joins does; with plan-ahead,
  once the new plan's workers and process groups are built in the background); no-replan ignores joins.
- Ours with a spot notice (notice_s before a removal) and plan-ahead: builds the next plan while training and
  switches once it is built (a prepared switch, charged switch_s), if that leaves NOTICE_MARGIN_S before the node
  goes; otherwise it acts at once, NOTICE_MARGIN_S before (or at the notice): a planned restart, as the controller
  does (job/notice_ahead.py). A removal without a notice is a loss: detect + restart.
- Events during a recovery: a removal that hits the plan being restored restarts the recovery; a join is taken
  at the end of the recovery (the first step boundary).
- The job's launch at t = 0 pays planning, worker start and warm-up, with nothing to restore.
"""
from __future__ import annotations

from dataclasses import dataclass

from autohet_ray.cloud.notices import NOTICE_MARGIN_S
from autohet_ray.replay.accounting import Ledger, hits, steps_done
from autohet_ray.replay.phases import GB, PhaseModel
from autohet_ray.replay.planning import PlanCache, PlannedState
from autohet_ray.replay.timeline import Event, State, Timeline


@dataclass(frozen=True, kw_only=True)
class ReplayConfig:
    global_batch: int
    phases: PhaseModel
    plan_cache: bool = False           # a state planned before reuses its plan: no planning time charged
    notice_s: float = 0.0              # ours: a spot notice this long precedes every removal
    checkpoint_every_s: float = 1800.0  # checkpoint-restart: cloud checkpoint period
    snapshot_overhead: float = 0.0     # ours: step time added by the per-step node-store snapshot (fraction)
    join_policy: str = "ignore"        # checkpoint-restart on a join: see JOIN_POLICIES
    plan_ahead: bool = False           # ours: a join's plan and workers are built while the current plan trains
    snapshot_every_steps: int = 1      # ours: node-store snapshot period (the runtime snapshots every step: 1)
    # ours, instead of snapshot_overhead: the overhead per GB/s that the busiest GPU snapshots (each plan's
    # PlannedState.snapshot_bytes_per_gpu / iteration), so each plan pays for its own snapshot rate
    snapshot_overhead_per_gb_s: float | None = None


# What checkpoint-restart does when nodes join while it runs. "ignore" (the default) models the common practice:
# a job of fixed size keeps running and takes what is alive at its next restart, after a loss.
JOIN_POLICIES = {
    "ignore": "joins are taken at the next restart after a loss (a fixed-size job; the default)",
    "save_then_restart": "a join stops the job, writes a checkpoint to the cloud (the upload stalls it), restarts "
                         "on the best plan for what is alive and restores from that checkpoint: nothing is lost",
    "restart_unsaved": "a join restarts the job from its newest periodic checkpoint without saving first "
                       "(work since that checkpoint is lost; the replay's behaviour before issue 34)",
}


class System:
    name = "system"
    tier = "local"

    def __init__(self, timeline: Timeline, plans: PlanCache, config: ReplayConfig):
        self.timeline, self.plans, self.config = timeline, plans, config
        self.ledger = Ledger(name=self.name, global_batch=config.global_batch)
        self.state: State = timeline.initial
        self.plan: PlannedState | None = None
        self.up_at = 0.0                      # when self.plan starts (or started) stepping
        self.pending_join = False
        self.waiting_since: float | None = None
        self.planned_states: set[State] = set()
        self.holding: tuple[float, tuple[int, ...]] | None = None   # since when, which nodes the job holds

    # --- driver ---
    def replay(self) -> Ledger:
        self.launch()
        for event in self.timeline.events:
            self.catch_up(event.time_s)
            self.state = event.after
            self.on_event(event)
        self.catch_up(self.timeline.window_s)
        self.finish(self.timeline.window_s)
        return self.ledger

    def launch(self) -> None:
        self.recover(0.0, detect=False, restore=False, event=None)

    def finish(self, end: float) -> None:
        if self.plan is not None and self.up_at < end:
            self.stop(end, how="end")
        if self.waiting_since is not None:
            self.ledger.wait_s += end - self.waiting_since
        self.hold(end, None)
        run = sum(b - a for a, b, _ in self.ledger.intervals)
        self.ledger.down_s = end - run - self.ledger.wait_s

    def catch_up(self, t: float) -> None:
        """A join seen during a recovery is taken when the recovery ends."""
        if self.pending_join and self.plan is not None and self.up_at <= t:
            self.pending_join = False
            self.recover(self.up_at, detect=False, event=None)

    def running(self, t: float) -> bool:
        return self.plan is not None and self.up_at <= t

    # --- policy ---
    def on_event(self, event: Event) -> None:
        t = event.time_s
        if hits(self.plan, event):
            if self.running(t):
                self.stop(t, how="lost")
            self.recover(t, detect=True, event=event)
        elif any(event.added):
            if self.plan is None:
                self.recover(t, detect=False, event=event)
            elif self.running(t):
                self.stop(t, how="planned")
                self.recover(t, detect=False, event=event)
            else:
                self.pending_join = True

    def rate(self, plan: PlannedState) -> float:
        return plan.samples_per_s

    def stop(self, t: float, how: str) -> None:
        """The running plan stops at t: `lost` (unannounced), `planned` (a switch) or `end`."""
        rate, start = self.rate(self.plan), self.up_at
        if how == "lost":
            steps = steps_done(self.config.global_batch / rate, start, t)
            committed = steps * self.config.global_batch
            self.ledger.lost_steps += 1 if rate * (t - start) > committed else 0
        else:
            committed = rate * (t - start)      # a planned switch waits for the step in flight
        self.ledger.run(rate, start, t, committed)

    def recover(self, t: float, *, detect: bool, event: Event | None, restore: bool = True,
                prepared: bool = False) -> None:
        """Move onto the plan for what is alive at t; `prepared`: planned and its workers built beforehand,
        while the old plan trained (plan-ahead), so only the switch is paid here."""
        target = self.plans.get(self.state)
        planning = 0.0 if prepared else self.charge_planning(target)
        self.ledger.replans += 1
        if target.samples_per_s <= 0:
            self.wait_from(t, event)
            return
        phases = self.config.phases.phases(detect=detect, replan_s=planning,
                                           bytes_per_node=target.bytes_per_node if restore else 0.0,
                                           tier=self.tier, iteration_s=target.iteration_time_s, restart=not prepared)
        if prepared:
            phases["switch_s"] = self.config.phases.switch
            phases["total_s"] += phases["switch_s"]
        self.end_wait(t)
        self.hold(t, target.nodes_used)
        self.plan, self.up_at, self.pending_join = target, t + phases["total_s"], False
        action = "recover" if detect else "prepared switch" if prepared else "switch"
        self.record(t, event, action, phases, planning_cached=planning == 0)

    def charge_planning(self, target: PlannedState) -> float:
        seen = target.state in self.planned_states
        self.planned_states.add(target.state)
        charged = 0.0 if seen and self.config.plan_cache else target.planning_s
        self.ledger.planning_charged_s += charged
        return charged

    # --- bookkeeping ---
    def hold(self, t: float, nodes: tuple[int, ...] | None) -> None:
        """From t the job holds `nodes` per pool (restoring onto them or running on them; None: nothing)."""
        if self.holding is not None and t > self.holding[0]:
            self.ledger.held.append((self.holding[0], t, self.holding[1]))
        self.holding = None if nodes is None else (t, nodes)

    def wait_from(self, t: float, event: Event | None) -> None:
        self.plan = None
        self.hold(t, None)
        if self.waiting_since is None:
            self.waiting_since = t
        self.record(t, event, "wait", None)

    def end_wait(self, t: float) -> None:
        if self.waiting_since is not None:
            self.ledger.wait_s += t - self.waiting_since
            self.waiting_since = None

    def record(self, t: float, event: Event | None, action: str, phases: dict | None, **extra) -> None:
        row = {"event": None if event is None else event.index, "t_s": round(t, 1), "action": action,
               "state": list(self.state)}
        if phases is not None:
            row["phases_s"] = {k: round(v, 3) for k, v in phases.items()}
        self.ledger.records.append(row | extra)


class Ours(System):
    """Local-first recovery: every step is committed to node stores and a peer, so an unannounced loss costs
    the step in flight; with a notice the job re-plans before the node goes and loses nothing."""
    name = "ours"

    def rate(self, plan: PlannedState) -> float:
        return plan.samples_per_s / (1.0 + snapshot_overhead(plan, self.config) / self.config.snapshot_every_steps)

    def recover(self, t: float, **kw) -> None:
        self.now, self.foreseen_from = t, self.plan      # plan-ahead: the running plan's foreseen states
        super().recover(t, **kw)

    def charge_planning(self, target: PlannedState) -> float:
        """With plan-ahead a state one node loss away from the running plan's (one planning per pool: nodes of a
        pool are interchangeable, job/foresight.py) costs nothing once the background planned it."""
        before = getattr(self, "foreseen_from", None)
        if self.config.plan_ahead and before is not None and target.state not in self.planned_states:
            ready = self.foreseen_ready_at(before)
            if target.state in ready and ready[target.state] <= self.now:
                self.planned_states.add(target.state)
                return 0.0
        return super().charge_planning(target)

    def foreseen_ready_at(self, before: PlannedState) -> dict:
        """State -> when the background has planned it: the single-node losses of `before`'s state, pool by
        pool, one after another from when `before` started (states planned before cost nothing; a state the
        replay never visits is not planned here: it costs the mean measured planning time)."""
        known = [p.planning_s for p in self.plans.plans.values()]
        mean = sum(known) / len(known)
        ready, at = {}, self.up_at
        for i, nodes in enumerate(before.state):
            if nodes == 0:
                continue
            state = tuple(n - 1 if j == i else n for j, n in enumerate(before.state))
            planned = self.plans.plans.get(state)
            at += 0.0 if state in self.planned_states else planned.planning_s if planned else mean
            ready[state] = at
        return ready

    def stop(self, t: float, how: str) -> None:
        every = self.config.snapshot_every_steps
        if how != "lost" or every == 1:
            super().stop(t, how)
            return
        rate, start = self.rate(self.plan), self.up_at       # snapshots every `every` steps: back to the newest
        steps = steps_done(self.config.global_batch / rate, start, t)
        kept = steps // every * every
        self.ledger.lost_steps += steps - kept + (1 if rate * (t - start) > steps * self.config.global_batch else 0)
        self.ledger.run(rate, start, t, kept * self.config.global_batch)

    switch_at: float | None = None      # plan-ahead: when the plan being built in the background is ready

    def on_event(self, event: Event) -> None:
        notice, t = self.config.notice_s, event.time_s
        if notice > 0 and hits(self.plan, event) and self.running(t):
            self.switch_at = None
            act = max(self.up_at, t - notice)     # the notice arrives
            if self.config.plan_ahead and t - act > NOTICE_MARGIN_S:     # build while training, then switch
                ready = self.build_ready_at(act)
                if ready <= t - NOTICE_MARGIN_S:      # switch once prepared, as the controller does
                    self.stop(ready, how="planned")
                    self.recover(ready, detect=False, event=event, prepared=True)
                    return
                act = t - NOTICE_MARGIN_S         # not ready with the margin left: act at once (the controller)
            self.stop(act, how="planned")
            self.recover(act, detect=False, event=event)
            return
        if self.config.plan_ahead and self.running(t) and not hits(self.plan, event) \
                and (any(event.added) or self.switch_at is not None):
            self.prepare(t, event)                # a join (or a change while building): build the next plan
            return
        if hits(self.plan, event):
            self.switch_at = None
        super().on_event(event)

    def prepare(self, t: float, event: Event | None) -> None:
        """Plan-ahead: plan the new state and start its workers and process groups while the current plan
        trains; the switch happens once they are ready (a change meanwhile starts the build again)."""
        self.switch_at = self.build_ready_at(t)
        self.record(t, event, "prepare", None, ready_at_s=round(self.switch_at, 1))

    def build_ready_at(self, t: float) -> float:
        """When the plan for the current state, planned and started from t in the background, is ready."""
        target = self.plans.get(self.state)
        cached = target.state in self.planned_states and self.config.plan_cache
        self.planned_states.add(target.state)
        return t + (0.0 if cached else target.planning_s) + self.config.phases.restart_s

    def catch_up(self, t: float) -> None:
        if self.config.plan_ahead and self.pending_join and self.running(t):
            self.pending_join = False                 # a join seen during a recovery: build once it is over
            self.prepare(self.up_at, None)
        if self.switch_at is not None and self.switch_at <= t and self.running(self.switch_at):
            at, self.switch_at = self.switch_at, None
            self.stop(at, how="planned")
            self.recover(at, detect=False, event=None, prepared=True)
        super().catch_up(t)


def snapshot_overhead(plan: PlannedState, config: ReplayConfig) -> float:
    """Ours' per-step snapshot overhead under `plan`: fixed, or priced by the plan's own snapshot rate."""
    if config.snapshot_overhead_per_gb_s is None:
        return config.snapshot_overhead
    assert plan.snapshot_bytes_per_gpu is not None, f"state {plan.state}: no snapshot bytes to price"
    return config.snapshot_overhead_per_gb_s * plan.snapshot_bytes_per_gpu / GB / plan.iteration_time_s


class CheckpointRestart(System):
    """Cloud checkpoints every N s (uploaded in the background: no stall, durable once uploaded); every change
    that hits the plan or adds nodes restarts from the newest durable checkpoint on the best plan for what is
    alive, restoring everything from the cloud."""
    name = "checkpoint_restart"
    tier = "cloud"

    def on_event(self, event: Event) -> None:
        policy = self.config.join_policy
        assert policy in JOIN_POLICIES, policy
        if self.plan is None or hits(self.plan, event) or policy == "restart_unsaved":
            super().on_event(event)
        elif policy == "save_then_restart" and any(event.added):
            if self.running(event.time_s):
                self.save_then_restart(event)
            else:
                self.pending_join = True

    def catch_up(self, t: float) -> None:
        if self.config.join_policy != "save_then_restart":
            super().catch_up(t)
        elif self.pending_join and self.plan is not None and self.up_at <= t:
            self.pending_join = False
            self.save_then_restart(None, at=self.up_at)

    def save_then_restart(self, event: Event | None, at: float | None = None) -> None:
        """A voluntary restart: the step in flight ends, a checkpoint is uploaded (the job stalls), then the job
        restarts on the plan for what is alive, restoring that checkpoint from the cloud."""
        t = event.time_s if at is None else at
        upload = self.plan.bytes_per_node / self.config.phases.cloud_upload_Bps
        self.stop(t, how="saved")
        self.recover(t + upload, detect=False, event=event)
        self.ledger.records[-1]["save_s"] = round(upload, 3)

    def stop(self, t: float, how: str) -> None:
        rate, start = self.rate(self.plan), self.up_at
        if how in ("end", "saved"):               # a normal end or a save before a restart keeps all work
            self.ledger.run(rate, start, t, rate * (t - start))
            return
        period = self.config.checkpoint_every_s
        upload = self.plan.bytes_per_node / self.config.phases.cloud_upload_Bps
        durable = int((t - start - upload) // period) if t - start >= period + upload else 0
        iteration = self.config.global_batch / rate
        saved = steps_done(iteration, start, start + durable * period)
        done = steps_done(iteration, start, t)
        self.ledger.lost_steps += done - saved + (1 if rate * (t - start) > done * self.config.global_batch else 0)
        self.ledger.run(rate, start, t, saved * self.config.global_batch)


class NoReplan(System):
    """The job keeps its first plan: it runs while that plan's nodes (or same-type replacements) are all alive
    and waits otherwise; recovery is local-first as ours, without planning."""
    name = "no_replan"

    def launch(self) -> None:
        super().launch()
        self.fixed = self.plan

    def on_event(self, event: Event) -> None:
        t, fixed = event.time_s, self.fixed
        if fixed is None:
            return
        if hits(self.plan or fixed, event):
            if self.running(t):
                self.stop(t, how="lost")
            self.resume_or_wait(t, event, detect=True)
        elif self.plan is None and fixed.fits_in(self.state):
            self.resume_or_wait(t, event, detect=False)

    def resume_or_wait(self, t: float, event: Event, detect: bool) -> None:
        if not self.fixed.fits_in(self.state):
            self.wait_from(t, event)
            return
        phases = self.config.phases.phases(detect=detect, replan_s=0.0, bytes_per_node=self.fixed.bytes_per_node,
                                           tier="local", iteration_s=self.fixed.iteration_time_s)
        self.end_wait(t)
        self.hold(t, self.fixed.nodes_used)
        self.plan, self.up_at = self.fixed, t + phases["total_s"]
        self.record(t, event, "resume", phases)


SYSTEMS = (Ours, CheckpointRestart, NoReplan)
