"""One helper process for the planner's independent parts (a baseline, a micro-batch size's search, a "what
would it add" re-plan), so that a second core shares the work of one `autohet plan`. The planner's code is
pure Python under the GIL: threads would not run it at once, a process does.

Off unless a command turns it on (`use_helper_process`): a library caller, a test session or a Ray actor
plans in its own process as before. With fewer than two usable cores it stays off. Spawned, not forked (the
caller may have threads; see background.py), and started at once, so that its imports overlap the caller's
loading. Results do not depend on where a part ran: each part is a pure function of its inputs."""
from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import Future, ProcessPoolExecutor

_pool: ProcessPoolExecutor | None = None


def use_helper_process() -> None:
    """Start the helper process (once) if this machine has a second core for it."""
    global _pool
    if _pool is None and len(os.sched_getaffinity(0)) >= 2:
        _pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
        _pool.submit(_warm_up)


def _warm_up() -> None:
    """The helper's heavy imports (PySCIPOpt, the cost model), while the caller loads its inputs."""
    import autohet_ray.cost.evaluate  # noqa: F401  # lazy: in the helper process only, at its start
    import autohet_ray.planner.candidates.grouping  # noqa: F401  # lazy: in the helper process only (PySCIPOpt)


def helper() -> ProcessPoolExecutor | None:
    return _pool


def run_split(fn, items: list, *args, **kwargs) -> list:
    """[fn(item, *args, **kwargs) for item in items], with every other item (from the second on) run by the
    helper process when there is one. Results come back in the order of `items`; an exception is raised
    where the sequential loop would have raised it."""
    pool = helper()
    if pool is None or len(items) < 2:
        return [fn(item, *args, **kwargs) for item in items]
    remote: dict[int, Future] = {i: pool.submit(fn, item, *args, **kwargs) for i, item in enumerate(items)
                                 if i % 2}
    local = {i: _outcome(fn, item, *args, **kwargs) for i, item in enumerate(items) if not i % 2}
    out = []
    for i in range(len(items)):
        if i in remote:
            out.append(remote[i].result())
            continue
        value, error = local[i]
        if error is not None:
            raise error
        out.append(value)
    return out


def _outcome(fn, *args, **kwargs) -> tuple:
    try:
        return fn(*args, **kwargs), None
    except Exception as error:  # noqa: BLE001  (re-raised by run_split in the sequential order)
        return None, error


def stop_helper_process() -> None:
    """Stop the helper process (a later use_helper_process starts a new one)."""
    global _pool
    if _pool is not None:
        _pool.shutdown(wait=True)
        _pool = None
