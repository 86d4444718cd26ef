"""How many recoveries a job may make without progress, across steps (Recovery bounds the rounds inside one
recovery; this bounds a failure that comes back on every step)."""
from __future__ import annotations

from autohet_ray.recovery.decisions import RecoveryFailed
from autohet_ray.recovery.report import report_failure


class RecoveryExhausted(RecoveryFailed):
    """The job failed again after max_recoveries recoveries without progress: it stops instead."""

    def __init__(self, message: str, *, rank: int | None, last_error: str):
        super().__init__(message)
        self.rank, self.last_error = rank, last_error


class RecoveryBudget:
    """Counts recoveries by the newest step the job had reached when each happened ("high water"); a recovery
    stops counting once the job has gone `window_steps` beyond that step."""

    def __init__(self, max_recoveries: int, window_steps: int):
        assert max_recoveries >= 1 and window_steps >= 1, (max_recoveries, window_steps)
        self.max_recoveries, self.window_steps = max_recoveries, window_steps
        self.high_water = 0
        self.recent: list[int] = []          # the high water at each counted recovery

    def progressed(self, step: int) -> None:
        self.high_water = max(self.high_water, step)

    def charge(self, failure, step: int) -> None:
        """Called at each failure in `step`, before its recovery (printed): RecoveryExhausted when no recovery
        is left."""
        self.recent = [h for h in self.recent if self.high_water - h < self.window_steps]
        rank = getattr(failure, "rank", None)
        if len(self.recent) >= self.max_recoveries:
            raise RecoveryExhausted(
                f"{len(self.recent)} recoveries within {self.window_steps} steps without progress (the job "
                f"reached step {self.high_water}); failing rank {rank}: {failure}",
                rank=rank, last_error=str(failure))
        self.recent.append(self.high_water)
        report_failure(step, f"rank {rank} failed", None,
                       f"{failure} (recovery {len(self.recent)} of {self.max_recoveries} without progress)")
