"""Waiting on one call per actor, failing fast with the rank of the first actor whose call failed."""
from __future__ import annotations

from typing import Callable

import ray
from ray.exceptions import GetTimeoutError


def gather_in_rank_order(refs: list, timeout_s: float | None,
                         on_error: Callable[[int, Exception], Exception | None]) -> list:
    """Results of `refs` in order. As soon as one fails, `on_error(rank, exc)` gives the exception to raise
    (None: it surfaces from the final ray.get as it is); GetTimeoutError names the ranks still silent."""
    index = {ref: i for i, ref in enumerate(refs)}
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1, timeout=timeout_s)
        if not ready:
            raise GetTimeoutError(f"ranks {sorted(index[r] for r in pending)} did not answer in {timeout_s} s")
        try:
            ray.get(ready[0])
        except Exception as exc:  # noqa: BLE001 - the caller decides which failures it names
            err = on_error(index[ready[0]], exc)
            if err is not None:
                raise err from exc
    return ray.get(refs)
