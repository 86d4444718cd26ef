"""The lower bound (planner/bounds/bound.py) solved in a child process while the search runs on this one: importing
cvxpy alone takes about 2 s of CPU, and with the solve it would add to the whole command's wall time; a second
core absorbs it."""
from __future__ import annotations

import multiprocessing
from concurrent.futures import Future, ProcessPoolExecutor


def _solve_bound(kwargs: dict) -> float | dict | None:
    if kwargs.get("goal") is not None:
        from autohet_ray.planner.bounds.money_bound import goal_lower_bound  # lazy: cvxpy, in the child process only
        return goal_lower_bound(**kwargs)
    # lazy: cvxpy (over 1 s to import), in the child
    from autohet_ray.planner.bounds.bound import lower_bound_iteration_s
    return lower_bound_iteration_s(**kwargs)


def lower_bound_in_background(**kwargs) -> Future:
    """`lower_bound_iteration_s(**kwargs)` in a child process (with `goal=`: money_bound.goal_lower_bound, a
    dict); its result (or its exception) comes from `.result()`. Spawned, not forked: the caller may have threads (a test session, a Ray driver), and a fork
    copies their locks in whatever state they are; the child imports cvxpy either way."""
    pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
    try:
        return pool.submit(_solve_bound, kwargs)
    finally:
        pool.shutdown(wait=False)
