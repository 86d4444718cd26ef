"""What a search keeps while it runs: the best plans so far for the goal
(cost/money.py), the plans that fit but break the goal's limits (for the message that says what the goal would
need), and the clock of the time limit."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from autohet_ray.cluster.spec import Cluster
from autohet_ray.cost.evaluate import Evaluation
from autohet_ray.cost.money import THROUGHPUT, Goal
from autohet_ray.cost.terms import GroupCostTable
from autohet_ray.plan.schema import Plan
from autohet_ray.planner.candidates.floor import iteration_floor_s


@dataclass(kw_only=True)
class _Best:
    plan: Plan | None = None
    evaluation: Evaluation | None = None
    templates: int = 0
    keep: int = 1                # how many of the best plans `top` holds
    top: list[tuple[Plan, Evaluation]] = field(default_factory=list)     # best first
    goal: Goal = THROUGHPUT      # what "best" means (cost/money.py): seconds, or $, per iteration
    cluster: Cluster | None = None
    fastest_unmet: tuple | None = None      # plans that fit but break the goal's budget or floor
    cheapest_unmet: tuple | None = None

    def key(self, plan: Plan, ev: Evaluation) -> float:
        return self.goal.key(plan, self.cluster, ev.iteration_time_s)

    def beats(self, plan: Plan, cluster: Cluster, table: GroupCostTable, schedules: tuple[str, ...]) -> bool:
        """Whether the `keep` plans kept are all no worse than `plan` can be (from its time's floor): then
        pricing it is moot."""
        return len(self.top) >= self.keep and self.goal.key(plan, cluster, iteration_floor_s(
            plan, cluster, table.model, table.profile, table, schedules)) >= self.key(*self.top[-1])

    def offer(self, plan: Plan, ev: Evaluation) -> None:
        if not ev.feasible or any(p == plan for p, _ in self.top):
            return
        key = self.key(plan, ev)
        if key == float("inf"):
            self._unmet(plan, ev)
            return
        if self.evaluation is None or key < self.key(self.plan, self.evaluation):
            self.plan, self.evaluation = plan, ev
        self.top.append((plan, ev))
        self.top.sort(key=lambda entry: self.key(*entry))
        del self.top[self.keep:]

    def _unmet(self, plan: Plan, ev: Evaluation) -> None:
        if self.fastest_unmet is None or ev.iteration_time_s < self.fastest_unmet[1].iteration_time_s:
            self.fastest_unmet = (plan, ev)
        usd = lambda entry: self.goal.usd_per_hour(entry[0], self.cluster)  # noqa: E731
        if self.cheapest_unmet is None or usd((plan, ev)) < usd(self.cheapest_unmet):
            self.cheapest_unmet = (plan, ev)

    def merge_unmet(self, other: "_Best") -> None:
        for entry in (other.fastest_unmet, other.cheapest_unmet):
            if entry is not None:
                self._unmet(*entry)


@dataclass
class _Deadline:
    start: float
    limit_s: float
    hit: bool = field(default=False)

    def left(self) -> float:
        return self.limit_s - (time.perf_counter() - self.start)

    def over(self) -> bool:
        self.hit = self.hit or self.left() <= 0
        return self.hit
