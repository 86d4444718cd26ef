"""Keepers a job stopped using: their node was declared lost (a stall past the grace, a node that may well
come back) or was drained for a spot notice (and may never be reclaimed). Keepers are detached, so nothing
else would ever stop them, and their node stores would hold shared memory for good.

A dropped keeper is stopped, and its store removed, once its chunks are safe elsewhere: when a step newer
than every step it could hold is committed to the live node stores or the storage (older steps are then
never restored again). The stop runs on the caller's background pool: a keeper on a silent node may take
its whole timeout to answer. Stopping one is the caller's `stop(spec)` (elastic/commit.py: through Ray)."""
from __future__ import annotations

from concurrent.futures import Executor, Future, wait
from typing import Callable


class DroppedKeepers:
    def __init__(self, stop: Callable[[dict], bool]):
        self.stop = stop                                 # stops a keeper (by its spec); whether one was alive
        self.waiting: dict[str, tuple[dict, int]] = {}   # node id -> (keeper spec, newest committed step then)
        self.stopping: list[Future] = []

    def drop(self, spec: dict, newest_committed: int) -> None:
        self.waiting[spec["node_id"]] = (spec, newest_committed)

    def rejoined(self, node_id: str) -> None:
        """The node serves the job again (a stall ended): its keeper is in use, not to be stopped."""
        self.waiting.pop(node_id, None)

    def reap(self, committed_step: int, pool: Executor) -> None:
        """Start stopping every dropped keeper whose every step is older than `committed_step`, just committed."""
        for node_id, (spec, newest) in list(self.waiting.items()):
            if committed_step > newest:
                del self.waiting[node_id]
                self.stopping.append(pool.submit(self.stop, spec))

    def remaining(self) -> list[dict]:
        """Specs of the dropped keepers not stopped yet (their chunks may still be needed)."""
        return [spec for spec, _ in self.waiting.values()]

    def wait(self, timeout_s: float) -> None:
        wait(self.stopping, timeout=timeout_s)

