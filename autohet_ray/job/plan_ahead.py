"""Planning ahead: while a job trains, a background thread plans every availability state one node loss away,
so a recovery finds its plan ready instead of waiting for the planner (seconds at scale).

The plans go into the job's plan cache (availability state -> {"plan", "ahead"}). The thread plans one state
at a time holding the planner lock, which `choose_plan` takes too before it reads the cache, and it stops
between states when asked: a recovery waits at most for the state being planned, and finds it cached if it is
its own.
"""
from __future__ import annotations

import threading

from autohet_ray.cluster.live import Discovered
from autohet_ray.cluster.spec import Cluster
from autohet_ray.job.config import TrainJob
from autohet_ray.job.foresight import cached_entry, one_loss_states
from autohet_ray.job.plan_choice import PLANNER_LOCK, plan_request, state_key
from autohet_ray.job.stage_in import warm_up


class PlanAhead:
    """Plans `states` into `cache` with `plan_for(cluster) -> cache entry`, in a daemon thread, skipping states
    the cache already holds."""

    def __init__(self, states: list[Cluster], *, cache: dict, plan_for, prepare=None):
        """`prepare()`: run once in the thread before the first state (what a recovery should not wait for)."""
        self.states, self.cache, self.plan_for, self.prepare = states, cache, plan_for, prepare
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="autohet-plan-ahead", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        if self.prepare is not None:
            try:
                self.prepare()
            except Exception as err:              # noqa: BLE001 - only the recovery's speed depends on it
                self.errors.append(f"prepare: {type(err).__name__}: {err}")
        for cluster in self.states:
            key = state_key(cluster)
            with PLANNER_LOCK:
                if self._stop.is_set():
                    return
                if cached_entry(self.cache, key) is not None:     # planned, or an equivalent state was
                    continue
                try:
                    self.cache[key] = self.plan_for(cluster)
                except Exception as err:          # noqa: BLE001 - the recovery that needs it plans again
                    self.errors.append(f"{sorted(n.name for n in cluster.nodes)}: {type(err).__name__}: {err}")

    def stop(self) -> None:
        """No new state is started; the one being planned finishes."""
        self._stop.set()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait for the thread to end; True when it did."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive()


def start_planning_ahead(job: TrainJob, *, found: Discovered, profile, priced_model, seq_len: int,
                         cache: dict[str, dict], states: list[Cluster] | None = None) -> PlanAhead:
    """A PlanAhead thread planning, into `cache`, `states` (default: one state per kind of node one loss away
    from `found`; job/foresight.py)."""
    from autohet_ray.planner import plan_training  # lazy: PySCIPOpt

    def plan_for(cluster: Cluster) -> dict:
        request = plan_request(job, cluster, profile=profile, priced_model=priced_model, seq_len=seq_len)
        return {"plan": plan_training(**request).plan.to_dict(), "ahead": True}
    return PlanAhead(one_loss_states(found.cluster) if states is None else states, cache=cache, plan_for=plan_for,
                     prepare=lambda: warm_up(priced_model))
