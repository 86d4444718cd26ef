"""Spot interruption watcher: a per-node poller of the AWS IMDSv2 `spot/instance-action` endpoint.

Nothing in Ray polls the spot notice (AWS gives ~2 minutes). On a notice the watcher
  1. posts it to the job's NoticeBoard actor and waits (bounded) until the controller acknowledges that it
     flushed a checkpoint (the controller polls the board between steps: `ElasticController.check_notices`),
  2. drains its node through Ray (`GcsClient.drain_node`, DRAIN_NODE_REASON_PREEMPTION, deadline = the
     notice's termination time), so Ray schedules nothing new there and reports the node as preempted.

IMDSv2: PUT {base}/latest/api/token (header X-aws-ec2-metadata-token-ttl-seconds) returns a token; GET
{base}/latest/meta-data/spot/instance-action with header X-aws-ec2-metadata-token answers 404 until a
notice exists, then {"action": "terminate"|"stop"|"hibernate", "time": "2026-11-29T18:45:00Z"}.
The base URL is configurable so tests can point it at a local HTTP server on 127.0.0.1.
"""
from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from datetime import datetime

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from autohet_ray import ConfigError

IMDS_URL = "http://169.254.169.254"
TOKEN_PATH = "/latest/api/token"
ACTION_PATH = "/latest/meta-data/spot/instance-action"
BOARD_NAME = "autohet-spot-notices"
NAMESPACE = "autohet-spot"
ACTIONS = ("terminate", "stop", "hibernate")


def _request(url: str, *, method: str = "GET", headers: dict | None = None, timeout_s: float = 2.0):
    req = urllib.request.Request(url, method=method, headers=headers or {})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return resp.read()


def poll_notice(base_url: str = IMDS_URL, *, timeout_s: float = 2.0, token_ttl_s: int = 300) -> dict | None:
    """The pending spot notice ({"action", "time", "deadline_s"}) or None; IMDSv2 (token first)."""
    token = _request(base_url + TOKEN_PATH, method="PUT", timeout_s=timeout_s,
                     headers={"X-aws-ec2-metadata-token-ttl-seconds": str(token_ttl_s)}).decode()
    try:
        raw = _request(base_url + ACTION_PATH, headers={"X-aws-ec2-metadata-token": token}, timeout_s=timeout_s)
    except urllib.error.HTTPError as err:
        if err.code == 404:
            return None
        raise
    return parse_notice(raw)


def parse_notice(raw: bytes) -> dict:
    body = json.loads(raw)
    action = body.get("action")
    if action not in ACTIONS:
        raise ConfigError(f"spot instance-action {body!r}: action must be one of {', '.join(ACTIONS)}")
    when = datetime.fromisoformat(body["time"].replace("Z", "+00:00")).timestamp()
    return {"action": action, "time": body["time"], "deadline_s": when}


def drain_node(node_id: str, *, deadline_s: float, message: str, gcs_address: str | None = None) -> None:
    """Drain a node through Ray's GCS with the preemption reason; RuntimeError if Ray refuses."""
    from ray.core.generated import autoscaler_pb2
    address = gcs_address or ray.get_runtime_context().gcs_address
    gcs = ray._raylet.GcsClient(address=address)
    accepted, why = gcs.drain_node(node_id, autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),
                                   message, int(deadline_s * 1000))
    if not accepted:
        raise RuntimeError(f"Ray refused to drain node {node_id[:8]}: {why}")


def draining_nodes() -> dict[str, int]:
    """Ray's own drain signal: node id -> drain deadline (ms since the epoch; 0: none) of every node being
    drained (by a spot watcher, the autoscaler, or KubeRay's pod SIGTERM)."""
    from ray._private.state import state
    return dict(state.get_draining_nodes())


@ray.remote(num_cpus=0, max_concurrency=8)
class NoticeBoard:
    """Spot notices from the watchers, acknowledged by the controller once it flushed a checkpoint."""

    def __init__(self):
        self.notices: dict[str, dict] = {}
        self.acked: dict[str, threading.Event] = {}

    def post(self, node_id: str, notice: dict) -> None:
        self.notices[node_id] = notice
        self.acked.setdefault(node_id, threading.Event())

    def pending(self) -> dict[str, dict]:
        return {n: v for n, v in self.notices.items() if not self.acked[n].is_set()}

    def ack(self, node_id: str) -> None:
        self.acked.setdefault(node_id, threading.Event()).set()

    def wait_ack(self, node_id: str, timeout_s: float) -> bool:
        return self.acked.setdefault(node_id, threading.Event()).wait(timeout_s)


def start_board():
    return NoticeBoard.options(name=BOARD_NAME, namespace=NAMESPACE, get_if_exists=True,
                               lifetime="detached").remote()


@ray.remote(num_cpus=0, max_restarts=0)
class SpotWatcher:
    """Runs on one node: polls the notice endpoint every `interval_s`; on a notice posts it, waits up to
    `flush_timeout_s` for the flush acknowledgement, then drains the node."""

    def __init__(self, url: str, interval_s: float, flush_timeout_s: float):
        if interval_s <= 0 or flush_timeout_s < 0:
            raise ConfigError(f"SpotWatcher: interval_s must be > 0 (got {interval_s}) and flush_timeout_s "
                              f">= 0 (got {flush_timeout_s})")
        self.url, self.interval_s, self.flush_timeout_s = url, interval_s, flush_timeout_s
        self.node_id = ray.get_runtime_context().get_node_id()
        self.events: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="spot-watcher")
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                notice = poll_notice(self.url)
            except (OSError, ValueError) as err:          # IMDS unreachable or odd: keep polling, keep a trace
                self.events.append({"event": "poll_error", "error": repr(err), "t": time.time()})
                continue
            if notice is not None:
                self._handle(notice)
                return

    def _handle(self, notice: dict) -> None:
        board = ray.get_actor(BOARD_NAME, namespace=NAMESPACE)
        self.events.append({"event": "notice", **notice, "t": time.time()})
        ray.get(board.post.remote(self.node_id, notice))
        flushed = ray.get(board.wait_ack.remote(self.node_id, self.flush_timeout_s))
        self.events.append({"event": "flushed" if flushed else "flush_timeout", "t": time.time()})
        drain_node(self.node_id, deadline_s=notice["deadline_s"],
                   message=f"spot {notice['action']} at {notice['time']}")
        self.events.append({"event": "drained", "t": time.time()})

    def report(self) -> list[dict]:
        return list(self.events)

    def stop(self) -> None:
        self._stop.set()


def start_watchers(node_ids: list[str], *, url: str = IMDS_URL, interval_s: float = 5.0,
                   flush_timeout_s: float = 60.0) -> dict:
    """One watcher pinned to each node (and the job's notice board). Returns node id -> watcher handle."""
    start_board()
    return {node_id: SpotWatcher.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)).remote(
            url, interval_s, flush_timeout_s) for node_id in node_ids}


def watch_nodes(node_ids: list[str], **watcher_options):
    """Start a watcher on each node; the notice board (for ElasticController.check_notices)."""
    start_watchers(node_ids, **watcher_options)
    return ray.get_actor(BOARD_NAME, namespace=NAMESPACE)
