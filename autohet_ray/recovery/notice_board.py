"""The state of a job's spot notice board (elastic/spot.py serves it as the NoticeBoard actor): the notices its
watchers posted, and the controller's acknowledgement of each once it flushed a checkpoint."""
from __future__ import annotations

import threading

from autohet_ray import ConfigError
from autohet_ray.cloud.notices import check_provider


def board_name(job_id: str) -> str:
    """The name of `job_id`'s notice board actor (two jobs on one cluster never share one)."""
    if not isinstance(job_id, str) or not job_id:
        raise ConfigError(f"spot watching: job_id must be a non-empty string (got {job_id!r})")
    return f"autohet-spot-notices-{job_id}"


def watcher_name(job_id: str, node_id: str) -> str:
    return f"autohet-spot-watcher-{job_id}-{node_id}"


def check_watcher_options(provider: str, interval_s: float, flush_timeout_s: float) -> None:
    check_provider(provider)
    if interval_s <= 0 or flush_timeout_s < 0:
        raise ConfigError(f"SpotWatcher: interval_s must be > 0 (got {interval_s}) and flush_timeout_s "
                          f">= 0 (got {flush_timeout_s})")


class Notices:
    """One job's spot notices from its watchers, acknowledged by the controller once it flushed a checkpoint.
    Its methods run in several actor threads at once (a watcher posts while the controller reads): one lock
    guards both maps, so a notice is never seen without its acknowledgement event."""

    def __init__(self):
        self.notices: dict[str, dict] = {}
        self.acked: dict[str, threading.Event] = {}
        self.watchers: dict = {}             # node id -> the job's SpotWatcher there (holding it keeps it alive)
        self._lock = threading.Lock()

    def post(self, node_id: str, notice: dict) -> None:
        with self._lock:
            self.acked.setdefault(node_id, threading.Event())
            self.notices[node_id] = notice

    def pending(self) -> dict[str, dict]:
        with self._lock:
            return {n: v for n, v in self.notices.items() if not self.acked[n].is_set()}

    def ack(self, node_id: str) -> None:
        self._event(node_id).set()

    def wait_ack(self, node_id: str, timeout_s: float) -> bool:
        return self._event(node_id).wait(timeout_s)           # outside the lock: post and ack go on meanwhile

    def _event(self, node_id: str) -> threading.Event:
        with self._lock:
            return self.acked.setdefault(node_id, threading.Event())

    def keep(self, watchers: dict) -> None:
        with self._lock:
            self.watchers.update(watchers)

    def watcher_handles(self) -> dict:
        with self._lock:
            return dict(self.watchers)
