"""Prefetching: while step i runs, a background thread prepares step i+1's batch, so reading the data is
not on the step's critical path. `waited_s` is how long callers were blocked on it."""
from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor


class Prefetcher:
    def __init__(self, make_batch: Callable[[int], dict]):
        """`make_batch(step)` builds the batch of a step (e.g. a bound `Dataset.global_batch`)."""
        self._make_batch = make_batch
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="autohet-prefetch")
        self._pending: tuple[int, Future] | None = None
        self.waited_s = 0.0
        """Seconds `get` kept its callers waiting, all calls together."""
        self.last_wait_s = 0.0
        self.num_batches = 0
        self.num_misses = 0
        """Calls for a step other than the one prefetched (the first, and after a rewind): built in the call."""

    def get(self, step: int) -> dict:
        """The batch of `step`; starts preparing the batch of step + 1 before returning."""
        started = time.perf_counter()
        pending, self._pending = self._pending, None
        if pending is not None and pending[0] == step:
            batch = pending[1].result()
        else:
            if pending is not None:
                pending[1].cancel()
            self.num_misses += 1
            batch = self._make_batch(step)
        self._pending = (step + 1, self._pool.submit(self._make_batch, step + 1))
        self.last_wait_s = time.perf_counter() - started
        self.waited_s += self.last_wait_s
        self.num_batches += 1
        return batch

    def stats(self) -> dict:
        return {"batches": self.num_batches, "misses": self.num_misses, "waited_s": self.waited_s}

    def close(self) -> None:
        if self._pending is not None:
            self._pending[1].cancel()
            self._pending = None
        self._pool.shutdown(wait=True)

    def __enter__(self) -> "Prefetcher":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
