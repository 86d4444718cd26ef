"""Acting on a spot notice ahead, without Ray: a notice names a node and when it goes (AWS: about 2 minutes).
The job prepares the state without the noticed nodes while the current plan trains (its plan from the
plan-ahead cache, the next plan's workers and process groups built in the background) and switches at the
first step boundary where that is ready. When the deadline is too close (or unknown), it acts at once: flush
and re-plan, as before plan-ahead. A loss meanwhile drops the preparation; the next check prepares again.

The deadline the switch is planned against is the earlier of the notice's and the watcher's: a watcher waits
`flush_timeout_s` for the job's acknowledgement and then drains its node, however far the preparation got (its
notice says when: "flush_by_s"). A preparation that cannot finish before it (by what earlier preparations took)
is given up for acting at once.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from autohet_ray.cloud.notices import NOTICE_MARGIN_S
from autohet_ray.job.foresight import Joining, cached_entry, foreseen_states
from autohet_ray.job.plan_ahead import start_planning_ahead
from autohet_ray.job.plan_choice import state_key
from autohet_ray.recovery.report import report_failure

STANDBY_TRIES = 3          # failed standby groups for one switch before it is made without standby workers


def earliest_deadline(notices: dict[str, dict], drains: dict[str, int], node_ids: set[str]) -> float | None:
    """The earliest deadline (seconds since the epoch) that the notices (node id -> notice with "deadline_s")
    or Ray drains (node id -> deadline in ms, 0: none) of `node_ids` state; None when none states one."""
    times = [notices[i].get("deadline_s") for i in node_ids if i in notices]
    times += [drains[i] / 1000.0 for i in node_ids if drains.get(i)]
    known = [float(t) for t in times if t]
    return min(known) if known else None


def switch_deadline(deadline_s: float | None, flush_by_s: list[float]) -> float | None:
    """When a prepared switch must be done: the notices' deadline (None: unknown, act at once) or, earlier,
    when the watchers that posted them stop waiting for the flush (`flush_by_s`, elastic/spot.py) and drain
    their nodes."""
    if deadline_s is None:
        return None
    return min([deadline_s, *flush_by_s])


def preparation_left_s(prepared_s: list[float], elapsed_s: float) -> float:
    """How much longer the preparation in progress (`elapsed_s` old) should take: the longest an earlier one of
    this job took (`prepared_s`) less what it ran already (0 before any was measured)."""
    return max(max(prepared_s, default=0.0) - elapsed_s, 0.0)


def act_at_once(deadline_s: float | None, now_s: float, margin_s: float = NOTICE_MARGIN_S, *,
                prepare_left_s: float = 0.0) -> bool:
    """True when a noticed removal cannot wait for a preparation: no deadline known, or no more than `margin_s`
    left once the preparation (`prepare_left_s` more) is done."""
    return deadline_s is None or deadline_s - now_s - prepare_left_s <= margin_s


def switch_now(ctl, deadline_s: float | None, notices: dict[str, dict], leaving: set[str], now_s: float) -> bool:
    """Whether the controller must act on the noticed removal of `leaving` (node ids) at once: too little time
    left before the notices' deadline or its watchers' flush timeout, for what a preparation takes."""
    by = switch_deadline(deadline_s, [notices[i]["flush_by_s"] for i in leaving if "flush_by_s" in notices.get(i, {})])
    prepared = [r["prepared_s"] for r in ctl.recovery.recoveries if r.get("groups_built_ahead")]
    elapsed = time.perf_counter() - ctl.leaving.since if ctl.leaving is not None else 0.0
    return act_at_once(by, now_s, prepare_left_s=preparation_left_s(prepared, elapsed))


def hand_over_wait_s(deadline_s: float | None, notices: dict[str, dict], leaving: set[str], now_s: float,
                     cap_s: float) -> float:
    """How long a switch waits for the copies that keep the newest committed step on two staying node stores
    (elastic/commit.py `hand_over_stores`) before acknowledging the notice: until 10 s before the notices' deadline or
    its watchers' flush timeout, at most `cap_s`, at least 1 s (the copies go on after that)."""
    by = switch_deadline(deadline_s, [notices[i]["flush_by_s"] for i in leaving if "flush_by_s" in notices.get(i, {})])
    return cap_s if by is None else max(1.0, min(cap_s, by - now_s - 10.0))


@dataclass
class Leaving:
    """A noticed removal being prepared: the state without the `leaving` nodes (its cache key, planned in the
    background), the state it was prepared from (a loss meanwhile makes it stale) and the standby workers."""
    leaving: list[str]
    key: str
    base: str
    deadline_s: float | None
    standby: object = None          # orchestrate/switch_ahead.Standby once the plan is known
    since: float = field(default_factory=time.perf_counter)

    def plan(self, cache: dict[str, dict]) -> dict | None:
        entry = cached_entry(cache, self.key)
        return None if entry is None else entry["plan"]

    def stale(self, leaving: list[str], base: str) -> bool:
        return self.leaving != leaving or self.base != base


def notice_ahead(ctl, leaving: list[str], deadline_s: float | None) -> dict | None:
    """Prepare the state without the noticed `leaving` nodes (or go on preparing it); the switch's report once
    it is ready, else None."""
    base = state_key(ctl.found.cluster)
    if ctl.leaving is not None and ctl.leaving.stale(leaving, base):
        ctl.switch_side.drop_preparations(ctl)
    if ctl.leaving is None:
        found = ctl.discover()             # the noticed nodes count as draining: the state without them
        restart_planning(ctl, foreseen_states(ctl.found.cluster, leaving=leaving), found)
        ctl.leaving = Leaving(leaving=leaving, key=state_key(found.cluster), base=base, deadline_s=deadline_s)
    report = switch_when_ready(ctl, ctl.leaving, f"spot notice: node(s) {leaving} will be preempted")
    if report is not None:
        ctl.leaving = None
    return report


def switch_when_ready(ctl, prep, reason: str, reuse: dict | None = None) -> dict | None:
    """Switch onto `prep` (a Joining or a Leaving) once its plan is cached and (ctl.groups_ahead) its standby
    group is set up; None while not (the job trains on; a standby whose setup failed is built again)."""
    plan = prep.plan(ctl.plan_cache)
    if plan is None or (prep.standby is not None and not prep.standby.ready()):
        return None
    side = ctl.switch_side                    # the Ray side: orchestrate/switch_ahead.py
    if prep.standby is not None and prep.standby.error:     # prepared again from the next step boundary
        standby_failed(ctl, prep, reason)
        return None
    if ctl.groups_ahead and prep.standby is None and standby_tries_left(ctl.recovery.standby_failures, reason):
        prep.standby = side.Standby(ctl, plan, {n: list(a) for n, a in (reuse or {}).items()})
        return None
    extra = {"plan_source": "planned ahead", "prepared_s": time.perf_counter() - prep.since}
    if prep.standby is None:                 # workers start after the flush (replan flushes first)
        hand_over(prep)
        start = time.perf_counter()
        ctl.flush()
        extra["flush_s"] = time.perf_counter() - start
        return ctl.replan(reason=reason, plan=plan, extra=reuse) | extra
    return side.switch_to_standby(ctl, prep, reason) | extra


def hand_over(prep) -> None:
    """The preparation's workers become the job's (its standby group, a join's workers): dropping the
    preparation later (a loss during the switch) must not kill them."""
    prep.standby = None
    if isinstance(prep, Joining):
        prep.actors = {}


def standby_tries_left(failures: list[str], reason: str) -> bool:
    """Whether the switch for `reason` may build standby workers again: fewer than STANDBY_TRIES of its
    standby groups failed (`failures`: the printed lines of every failure). After that the switch is made
    without them, the way an unprepared one is: its workers start after the flush, and if they fail too
    the job recovers as from any failed start."""
    return sum(f"({reason})" in line for line in failures) < STANDBY_TRIES


def standby_failed(ctl, prep, reason: str) -> None:
    """A standby group whose setup failed: printed with its cause, counted (the run summary's
    `standby_failures`), and only its own preparation dropped (prepared again from the next check, at most
    STANDBY_TRIES times for one switch)."""
    name = "joining" if isinstance(prep, Joining) else "leaving"
    tries = sum(f"({reason})" in line for line in ctl.recovery.standby_failures) + 1   # this one included
    then = "preparing it again" if tries < STANDBY_TRIES else "switching without standby workers from now on"
    what = f"the standby workers for the switch ({reason}) failed ({tries} of {STANDBY_TRIES} tries); {then}"
    ctl.recovery.standby_failures.append(report_failure(ctl.step_index, what, None, prep.standby.error))
    ctl.switch_side.drop_preparations(ctl, (name,))


def restart_planning(ctl, states: list, found) -> None:
    """Plan `states` ahead (first needed first) from the live state `found`, instead of what was planned ahead."""
    if ctl.planning_ahead is not None:
        ctl.planning_ahead.stop()
    ctl.planning_ahead = start_planning_ahead(ctl.job, found=found, profile=ctl.profile, priced_model=ctl.priced_model,
                                              seq_len=ctl.priced_seq_len, cache=ctl.plan_cache, states=states)
