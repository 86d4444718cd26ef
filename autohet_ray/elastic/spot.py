"""Spot interruption watchers: a per-node actor polls the cloud's notice endpoint and posts to its job's board.

Nothing in Ray polls spot notices (AWS gives ~2 minutes, GCP and Azure ~30 s). `watch_nodes(node_ids,
job_id=...)` starts one SpotWatcher per node and the job's NoticeBoard (named `board_name(job_id)` in
NAMESPACE), so two jobs on one cluster never see each other's notices; `stop_watching(job_id)` ends both.
On a notice the watcher
  1. posts it to its job's board and waits (bounded) until the controller acknowledges that it flushed a
     checkpoint (the controller polls `board.pending` between steps and calls `board.ack(node_id)`),
  2. drains its node through Ray (`GcsClient.drain_node`, DRAIN_NODE_REASON_PREEMPTION, deadline = the
     notice's deadline), so Ray schedules nothing new there and reports the node as preempted.
Reading the notice endpoints of AWS (IMDSv2), GCP and Azure, and provider="auto": `cloud/notices.py`.

Ray's drain state. Ray 2.60 has no public API that says a node is draining: `ray.util.state.list_nodes`
reports `NodeState.state` as only ALIVE or DEAD (its `state_message` is the death reason), `ray.nodes()`
has Alive/DeathReason but nothing about a drain, and a DRAINING status (without its deadline) shows only in
the autoscaler's internal `ray.autoscaler.v2` cluster state, no public API either. So `draining_nodes` keeps
the private `ray._private.state.state.get_draining_nodes()` (node id -> deadline ms; Ray Serve reads the same
through the GCS client), and tests/ray/test_spot.py pins it on a real local cluster so an upgrade that
changes it fails loudly. A drained node that runs nothing exits at once and so never shows as draining.

Lifetimes. The board and the watchers are owned by the process that starts them (not detached): they die with the
job's driver even when stop_watching is never reached. Ray ends an actor once no handle to it is left, so
the board holds its watchers and the caller holds the board.
"""
from __future__ import annotations

import threading
import time

import ray
from ray._private.state import state
from ray.core.generated import autoscaler_pb2
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from autohet_ray.cloud.notices import METADATA_URL, detect_provider, poll_notice
from autohet_ray.job.config import TrainJob
from autohet_ray.recovery.notice_board import Notices, board_name, check_watcher_options, watcher_name

CONTROL_TIMEOUT_S = TrainJob.control_timeout_s

NAMESPACE = "autohet-spot"


def drain_node(node_id: str, *, deadline_s: float, message: str, gcs_address: str | None = None) -> None:
    """Drain a node through Ray's GCS with the preemption reason; RuntimeError if Ray refuses."""
    address = gcs_address or ray.get_runtime_context().gcs_address
    gcs = ray._raylet.GcsClient(address=address)
    accepted, why = gcs.drain_node(node_id, autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),
                                   message, int(deadline_s * 1000))
    if not accepted:
        raise RuntimeError(f"Ray refused to drain node {node_id[:8]}: {why}")


def draining_nodes() -> dict[str, int]:
    """Ray's own drain signal: node id -> drain deadline (ms since the epoch; 0: none) of every live node being
    drained (by a spot watcher, the autoscaler, or KubeRay's pod SIGTERM). Private Ray API: see the module doc."""
    return dict(state.get_draining_nodes())


NoticeBoard = ray.remote(num_cpus=0, max_concurrency=8)(Notices)


def start_board(job_id: str):
    """The job's notice board (created on first use, the same actor after), pinned to the caller's node (the
    driver's: a head or on-demand node), never on a spot node that may go away in the middle of the flush
    handshake. It needs no resources, so the pin can always be met."""
    here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
    return NoticeBoard.options(name=board_name(job_id), namespace=NAMESPACE, get_if_exists=True,
                               scheduling_strategy=here).remote()


@ray.remote(num_cpus=0, max_restarts=0)
class SpotWatcher:
    """Runs on one node: polls the notice endpoint every `interval_s`; on a notice posts it to `board`, waits up
    to `flush_timeout_s` for the flush acknowledgement, then drains the node. `report()`: what happened."""

    def __init__(self, board, *, provider: str, url: str = METADATA_URL, interval_s: float = 5.0,
                 flush_timeout_s: float = 60.0, control_timeout_s: float = CONTROL_TIMEOUT_S):
        check_watcher_options(provider, interval_s, flush_timeout_s)
        self.board, self.url, self.interval_s, self.flush_timeout_s = board, url, interval_s, flush_timeout_s
        self.control_timeout_s = control_timeout_s
        self.provider = None if provider == "auto" else provider
        self.node_id = ray.get_runtime_context().get_node_id()
        self.events: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="spot-watcher")
        self._thread.start()

    def _poll(self) -> dict | None:
        if self.provider is not None:
            return poll_notice(self.url, provider=self.provider)
        self.provider, notice = detect_provider(self.url)
        self.events.append({"event": "provider", "provider": self.provider, "t": time.time()})
        return notice

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                notice = self._poll()
            except (OSError, ValueError) as err:     # unreachable, refused or malformed: keep polling, keep a trace
                self.events.append({"event": "poll_error", "error": repr(err), "t": time.time()})
                continue
            if notice is not None:
                self._handle(notice)
                return

    def _handle(self, notice: dict) -> None:
        notice = {**notice, "flush_by_s": time.time() + self.flush_timeout_s}     # it drains the node then
        self.events.append({"event": "notice", **notice, "t": time.time()})
        ray.get(self.board.post.remote(self.node_id, notice), timeout=self.control_timeout_s)
        flushed = ray.get(self.board.wait_ack.remote(self.node_id, self.flush_timeout_s),
                          timeout=self.flush_timeout_s + self.control_timeout_s)
        self.events.append({"event": "flushed" if flushed else "flush_timeout", "t": time.time()})
        try:
            drain_node(self.node_id, deadline_s=notice["deadline_s"],
                       message=f"spot {notice['provider']} {notice['action']} at {notice['time']}")
        except RuntimeError as err:
            self.events.append({"event": "drain_error", "error": str(err), "t": time.time()})
            return
        self.events.append({"event": "drained", "t": time.time()})

    def report(self) -> list[dict]:
        return list(self.events)

    def stop(self) -> None:
        self._stop.set()


def start_watchers(node_ids: list[str], *, job_id: str, provider: str, url: str = METADATA_URL,
                   interval_s: float = 5.0, flush_timeout_s: float = 60.0,
                   control_timeout_s: float = CONTROL_TIMEOUT_S) -> dict:
    """One watcher of `job_id` pinned to each node (an existing one is reused), held by the job's notice board
    (see Lifetimes in the module doc). Returns node id -> watcher handle."""
    check_watcher_options(provider, interval_s, flush_timeout_s)
    board = start_board(job_id)
    watchers = {node_id: SpotWatcher.options(
        name=watcher_name(job_id, node_id), namespace=NAMESPACE, get_if_exists=True,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)).remote(
            board, provider=provider, url=url, interval_s=interval_s, flush_timeout_s=flush_timeout_s,
            control_timeout_s=control_timeout_s)
        for node_id in node_ids}
    ray.get(board.keep.remote(watchers), timeout=control_timeout_s)
    return watchers


def watch_nodes(node_ids: list[str], *, job_id: str, **watcher_options):
    """Start a watcher of `job_id` on each node; the job's notice board (`pending()` -> {node id: notice}).
    Keep the board's handle while the job runs: it holds the watchers."""
    start_watchers(node_ids, job_id=job_id, **watcher_options)
    return start_board(job_id)


def job_watchers(job_id: str) -> list[str]:
    """Names of the live watchers of `job_id` (node ids hold no '-', so job "a" never matches job "a-b")."""
    prefix = watcher_name(job_id, "")
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["namespace"] == NAMESPACE and a["name"].startswith(prefix) and "-" not in a["name"][len(prefix):]]


def stop_watching(job_id: str) -> None:
    """Kill the watchers and the notice board of `job_id` (at job end; a no-op for what is already gone)."""
    board = _named(board_name(job_id))
    handles = list(ray.get(board.watcher_handles.remote()).values()) if board is not None else []
    handles += [h for h in map(_named, job_watchers(job_id)) if h is not None]
    for handle in [*handles, board]:
        if handle is not None:
            ray.kill(handle)


def _named(name: str):
    try:
        return ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:                               # never started, or gone already
        return None

