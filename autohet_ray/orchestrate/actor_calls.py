"""Waiting on one call per actor, failing fast with the rank of the first actor whose call failed."""
from __future__ import annotations

from typing import Callable

import time

import ray
from ray.exceptions import GetTimeoutError

WATCH_EVERY_S = 0.1


def gather_in_rank_order(refs: list, timeout_s: float | None,
                         on_error: Callable[[int, Exception], Exception | None],
                         watch: Callable[[], None]) -> list:
    """Results of `refs` in order. As soon as one fails, `on_error(rank, exc)` gives the exception to raise
    (None: it surfaces from the final ray.get as it is); GetTimeoutError names the ranks still silent.
    `watch` runs every WATCH_EVERY_S while calls are pending and raises to abandon the wait (a lost node
    noticed before any call fails)."""
    index = {ref: i for i, ref in enumerate(refs)}
    pending = list(refs)
    deadline = None if timeout_s is None else time.perf_counter() + timeout_s
    while pending:
        left = None if deadline is None else max(0.0, deadline - time.perf_counter())
        wait_s = WATCH_EVERY_S if left is None else min(WATCH_EVERY_S, left)
        ready, pending = ray.wait(pending, num_returns=1, timeout=wait_s)
        if not ready:
            if deadline is not None and time.perf_counter() >= deadline:
                raise GetTimeoutError(f"ranks {sorted(index[r] for r in pending)} did not answer in {timeout_s} s")
            watch()
            continue
        try:
            ray.get(ready[0])
        except Exception as exc:  # noqa: BLE001 - the caller decides which failures it names
            err = on_error(index[ready[0]], exc)
            if err is not None:
                raise err from exc
    return ray.get(refs)

