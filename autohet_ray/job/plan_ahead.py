"""Planning ahead: while a job trains, a background thread plans every availability state one node loss away,
so a recovery finds its plan ready instead of waiting for the planner (seconds at scale).

The plans go into the job's plan cache (availability state -> plan dict). The thread plans one state at a time
holding the planner lock, which the controller takes too before it reads the cache, and it stops between
states when asked: a recovery waits at most for the state being planned, and finds it cached if it is its own.
"""
from __future__ import annotations

import threading

from autohet_ray.cluster.live import without_nodes
from autohet_ray.cluster.spec import Cluster


def states_one_loss_away(cluster: Cluster) -> list[Cluster]:
    """The clusters left after losing any one node (none when a single node is left)."""
    if len(cluster.nodes) < 2:
        return []
    return [without_nodes(cluster, [node.name]) for node in cluster.nodes]


class PlanAhead:
    """Plans `states` into `cache` (key: `state_key(cluster)`) with `plan_for(cluster) -> plan dict`, in a
    daemon thread, skipping states the cache already holds."""

    def __init__(self, states: list[Cluster], *, cache: dict, plan_for, state_key, lock: threading.Lock):
        self.states, self.cache, self.plan_for, self.state_key, self.lock = states, cache, plan_for, state_key, lock
        self.planned: list[str] = []       # keys this thread planned
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="autohet-plan-ahead", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for cluster in self.states:
            if self._stop.is_set():
                return
            key = self.state_key(cluster)
            with self.lock:
                if key in self.cache or self._stop.is_set():
                    continue
                try:
                    self.cache[key] = self.plan_for(cluster)
                except Exception as err:          # noqa: BLE001 - the recovery that needs it plans again
                    self.errors.append(f"{sorted(n.name for n in cluster.nodes)}: {type(err).__name__}: {err}")
                    continue
                self.planned.append(key)

    def stop(self) -> None:
        """No new state is started; the one being planned finishes."""
        self._stop.set()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait for the thread to end; True when it did."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive()
