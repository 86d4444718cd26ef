"""Goodput accounting on one clock: the ideal, and what a system commits while a plan runs.

Ideal = the integral over the replay of the predicted samples/s of the best plan for the GPUs alive at that
moment (the planner's plan for the state, the same cost model). A system commits samples only while a plan
runs; work is counted in whole steps of global_batch samples where a step can be lost.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from autohet_ray.replay.planning import PlanCache, PlannedState
from autohet_ray.replay.timeline import Event, State, Timeline


def ideal_rate(state: State, plans: PlanCache) -> float:
    """The fastest plan known for `state`: the planner's for it, or one planned for another state whose nodes
    are all alive in `state` (the planner's time limit can leave a subset's plan faster)."""
    own = plans.get(state).samples_per_s
    return max([own] + [p.samples_per_s for p in plans.plans.values() if p.fits_in(state)])


def ideal_samples(timeline: Timeline, plans: PlanCache) -> float:
    for state in timeline.distinct_states():
        plans.get(state)
    return sum(ideal_rate(state, plans) * (end - start) for start, end, state in timeline.segments())


def steps_done(iteration_s: float, start: float, end: float) -> int:
    """Whole steps of `iteration_s` a plan running from `start` completes by `end`."""
    if end <= start:
        return 0
    return int(math.floor((end - start) / iteration_s + 1e-9))


def hits(plan: PlannedState | None, event: Event) -> bool:
    """Whether a removal takes a node the plan runs on. Victims are taken from the plan's nodes first (the
    worst case): any loss in a pool the plan uses hits it."""
    return plan is not None and any(r > 0 and u > 0 for r, u in zip(event.removed, plan.nodes_used))


@dataclass(kw_only=True)
class Ledger:
    """What one system did: committed samples, lost work, downtime, one record per event it acted on."""
    name: str
    global_batch: int
    committed_samples: float = 0.0
    lost_steps: int = 0
    lost_samples: float = 0.0      # work done and thrown away (samples the running plan had computed)
    down_s: float = 0.0            # time not stepping while some plan could run (recovery phases)
    wait_s: float = 0.0            # time waiting for nodes (no plan of this system can run)
    planning_charged_s: float = 0.0
    replans: int = 0
    records: list[dict] = field(default_factory=list)
    intervals: list[tuple[float, float, float]] = field(default_factory=list)   # (start, end, samples/s) runs
    held: list[tuple[float, float, tuple[int, ...]]] = field(default_factory=list)  # (start, end, nodes per pool)

    def run(self, rate: float, start: float, end: float, committed: float) -> None:
        """A plan stepped at `rate` samples/s over [start, end) and `committed` of its samples count."""
        if end <= start:
            return
        self.committed_samples += committed
        self.lost_samples += max(0.0, rate * (end - start) - committed)
        self.intervals.append((start, end, rate))

    def summary(self, ideal: float) -> dict:
        return {"goodput": self.committed_samples / ideal if ideal > 0 else 0.0,
                "committed_samples": round(self.committed_samples), "lost_steps": self.lost_steps,
                "lost_samples": round(self.lost_samples), "recovery_down_s": round(self.down_s, 1),
                "wait_s": round(self.wait_s, 1), "planning_charged_s": round(self.planning_charged_s, 1),
                "replans": self.replans}
