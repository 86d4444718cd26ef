"""The planner's answer (PlanResult), on its own so that the search and the passes it runs (recompute.py,
sharding.py) share it without importing each other."""
from __future__ import annotations

from dataclasses import dataclass

from autohet_ray.cost.evaluate import Evaluation
from autohet_ray.plan.schema import Plan


@dataclass(frozen=True, kw_only=True)
class PlanResult:
    plan: Plan
    evaluation: Evaluation
    solve_time_s: float
    num_templates: int
    hit_time_limit: bool
