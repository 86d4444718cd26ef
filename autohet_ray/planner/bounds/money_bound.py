"""The lower bound (planner/bounds/bound.py) for every goal of cost/money.py: the least $ per iteration of any plan,
the least iteration time of any plan within a budget, and whether a budget or a throughput floor can be met at
all. GPUs are priced per class (device type and price per GPU: a node's instance price over its GPUs), and the
relaxation chooses how many of each class to use (u, continuous, at most the class's GPUs).

Why it holds. Take any plan with iteration time T that uses u_c GPUs of class c. The proof of bound.py, with
the N_d devices of a type replaced by the u_c devices the plan uses of each class (each stage sits on one node,
so on one class), makes (its relaxation point, u, T) a feasible point of LP(T): the fluid program with
busy_c <= u_c T and held_c <= u_c capacity_c. The plan pays for whole nodes (cost/money.py), at least for the GPUs
it uses at their nodes' price per GPU, so its $/hour is at least C(T), the least sum p_c u_c of LP(T).
LP(T) only loosens as T grows, so C is non-increasing. For T in [t_k, t_k+1] of a grid starting at bound.py's
T_min: $ per iteration = $/hour x T >= C(t_k+1) t_k; for T >= t_K: >= C(inf) t_K, with C(inf) the memory-only
program. Within a budget X: C(T) <= X, so T is at least the least t with C(t) <= X (bisected; the lower end of
the bracket is kept). Above a floor of Y samples/s: T <= B / Y.
"""
from __future__ import annotations

import math

import cvxpy as cp

from autohet_ray.cost.money import Goal, node_usd_per_hour
from autohet_ray.planner.bounds.bound import SOLVER_SLACK, lower_bound_iteration_s, type_coefficients

GRID_RATIO = 1.02           # adjacent grid points differ by this factor: the bound is within 2% of the grid's
BISECTION_STEPS = 40


def _classes(cluster, goal: Goal, coeffs_of: dict) -> list[tuple[float, int, object]]:
    """(price per GPU-hour, GPUs, the device type's coefficients) per class of GPUs."""
    out: dict[tuple, int] = {}
    for n in cluster.nodes:
        if coeffs_of.get(n.device) is not None:
            key = (n.device, node_usd_per_hour(cluster, goal.prices, n.name) / n.count)
            out[key] = out.get(key, 0) + n.count
    return [(price, count, coeffs_of[device]) for (device, price), count in out.items()]


class _CostProgram:
    """LP(t): the least $/hour of GPUs that run the fluid plan in t seconds per iteration (t a parameter)."""

    def __init__(self, classes, batch: int, layers: int, with_time: bool = True):
        n = len(classes)
        self.t = cp.Parameter(nonneg=True)
        x, y, z = cp.Variable(n, nonneg=True), cp.Variable(n, nonneg=True), cp.Variable(n, nonneg=True)
        h, f, g = cp.Variable(n, nonneg=True), cp.Variable(n, nonneg=True), cp.Variable(n, nonneg=True)
        u, pipelines = cp.Variable(n, nonneg=True), cp.Variable()
        cons = [cp.sum(x) == 1, cp.sum(y) == 1, cp.sum(z) == 1, cp.sum(h) == pipelines * layers,
                cp.sum(f) == pipelines, cp.sum(g) == pipelines, pipelines >= 1]
        for i, (_, count, c) in enumerate(classes):
            busy = c.layer_s * batch * layers * x[i] + c.layer_opt_s * h[i]
            held = c.layer_bytes * h[i]
            cons += [layers * x[i] <= h[i], y[i] <= f[i], z[i] <= g[i], u[i] <= count]
            for share, holders, role in ((y, f, "embed"), (z, g, "head")):
                if math.isinf(getattr(c, f"{role}_s")):
                    cons += [holders[i] == 0]
                    continue
                busy = busy + getattr(c, f"{role}_s") * batch * share[i] + getattr(c, f"{role}_opt_s") * holders[i]
                held = held + getattr(c, f"{role}_bytes") * holders[i]
            cons += [held / c.capacity_bytes <= u[i]]
            if with_time:
                cons += [busy <= u[i] * self.t]
        self.problem = cp.Problem(cp.Minimize(sum(p * u[i] for i, (p, _, _) in enumerate(classes))), cons)

    def usd_per_hour(self, t: float) -> float:
        self.t.value = t
        self.problem.solve(solver=cp.CLARABEL)
        if self.problem.status == cp.INFEASIBLE:
            return math.inf
        assert self.problem.status == cp.OPTIMAL, self.problem.status
        return float(self.problem.value) * (1 - SOLVER_SLACK)


def goal_lower_bound(*, goal: Goal, cluster, model, profile, global_batch: int, seq_len: int, schedules,
                     recompute: str = "none", optimizer_sharding: str = "none") -> dict:
    """{"iteration_s": least seconds per iteration of a plan that meets the goal's limits, "usd_per_iteration":
    least $ per iteration of such a plan, "feasible": whether any plan can meet them, "needs": what the limits
    would need when none can}. See the module docstring."""
    t_min = lower_bound_iteration_s(cluster=cluster, model=model, profile=profile, global_batch=global_batch,
                                    seq_len=seq_len, schedules=schedules, recompute=recompute,
                                    optimizer_sharding=optimizer_sharding)
    out = {"iteration_s": t_min, "usd_per_iteration": None, "feasible": not math.isinf(t_min), "needs": None}
    if math.isinf(t_min) or goal.plain:
        return out
    coeffs_of = {d: type_coefficients(cluster, model, profile, seq_len, d, tuple(schedules), recompute,
                                      optimizer_sharding) for d in cluster.device_types()}
    classes = _classes(cluster, goal, coeffs_of)
    program = _CostProgram(classes, global_batch, model.num_layers)
    memory_only = _CostProgram(classes, global_batch, model.num_layers, with_time=False).usd_per_hour(1.0)
    lo, hi = t_min, (global_batch / goal.min_samples_per_s if goal.min_samples_per_s else math.inf)
    if hi < lo:
        out.update(feasible=False, needs=f"no plan can reach {goal.min_samples_per_s:g} samples/s: the bound "
                                         f"allows at most {global_batch / t_min:.1f}")
        return out
    if goal.max_usd_per_hour is not None:
        if memory_only > goal.max_usd_per_hour:
            out.update(feasible=False, needs=f"no plan can fit a budget of ${goal.max_usd_per_hour:g}/hour: "
                                             f"holding the model alone needs ${memory_only:.2f}/hour")
            return out
        lo = _least_time_within(program, lo, hi, goal.max_usd_per_hour)
        if lo is None:
            out.update(feasible=False, needs=f"no plan within ${goal.max_usd_per_hour:g}/hour reaches "
                                             f"{goal.min_samples_per_s:g} samples/s")
            return out
        out["iteration_s"] = lo
    out["usd_per_iteration"] = _least_usd_per_iteration(program, memory_only, lo, hi)
    return out


def _least_time_within(program: _CostProgram, lo: float, hi: float, budget: float) -> float | None:
    """The lower end of a bracket of the least t in [lo, hi] with C(t) <= budget; None if there is none."""
    top = hi if math.isfinite(hi) else lo * 2
    while program.usd_per_hour(top) > budget:
        if math.isfinite(hi) or top > lo * 1e6:
            return None
        top *= 2
    if program.usd_per_hour(lo) <= budget:
        return lo
    for _ in range(BISECTION_STEPS):
        mid = (lo + top) / 2
        lo, top = (lo, mid) if program.usd_per_hour(mid) <= budget else (mid, top)
    return lo


def _least_usd_per_iteration(program: _CostProgram, memory_only: float, lo: float, hi: float) -> float:
    """min over t in [lo, hi] of C(t) t / 3600, bounded from below on a geometric grid (module docstring)."""
    best, t = math.inf, lo
    while t < hi:
        upper = min(t * GRID_RATIO, hi)
        best = min(best, t * program.usd_per_hour(upper) / 3600)
        if t * memory_only / 3600 >= best:        # every later t costs more than the best already
            return best
        t = upper
    return best
