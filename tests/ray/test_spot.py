"""Spot interruption watcher: IMDSv2 polling against a local HTTP server, and on a notice a flush handshake
with the controller's notice board before the node is drained through Ray (reported as a preemption)."""
from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

ray = pytest.importorskip("ray")

from autohet_ray import ConfigError  # noqa: E402
from autohet_ray.orchestrate.spot import parse_notice, poll_notice  # noqa: E402

pytestmark = pytest.mark.timeout(180)
TOKEN = "test-token-123"


class ImdsState:
    def __init__(self):
        self.notice: dict | None = None
        self.requests: list[str] = []


def make_handler(state: ImdsState):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, code: int, body: bytes = b"") -> None:
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_PUT(self):
            state.requests.append(f"PUT {self.path}")
            ok = self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
            self._send(200, TOKEN.encode()) if ok else self._send(400)

        def do_GET(self):
            state.requests.append(f"GET {self.path}")
            if self.headers.get("X-aws-ec2-metadata-token") != TOKEN:
                return self._send(401)
            if self.path != "/latest/meta-data/spot/instance-action" or state.notice is None:
                return self._send(404)
            self._send(200, json.dumps(state.notice).encode())
    return Handler


def start_imds() -> tuple[ThreadingHTTPServer, ImdsState, str]:
    state = ImdsState()
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(state))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, state, f"http://127.0.0.1:{server.server_address[1]}"


@pytest.fixture
def imds():
    server, state, url = start_imds()
    yield state, url
    server.shutdown()


def notice_in(seconds: float) -> dict:
    when = datetime.now(timezone.utc) + timedelta(seconds=seconds)
    return {"action": "terminate", "time": when.strftime("%Y-%m-%dT%H:%M:%SZ")}


def test_poll_notice_uses_imdsv2_token_and_parses(imds):
    state, url = imds
    assert poll_notice(url) is None                                   # 404: no notice yet
    assert state.requests == ["PUT /latest/api/token", "GET /latest/meta-data/spot/instance-action"]
    state.notice = {"action": "terminate", "time": "2026-11-29T18:45:00Z"}
    notice = poll_notice(url)
    assert notice["action"] == "terminate"
    assert notice["deadline_s"] == datetime(2026, 11, 29, 18, 45, tzinfo=timezone.utc).timestamp()
    with pytest.raises(ConfigError, match="action must be one of terminate, stop, hibernate"):
        parse_notice(json.dumps({"action": "explode", "time": "2026-11-29T18:45:00Z"}).encode())


def test_watcher_waits_for_flush_then_drains_node_as_preemption(imds):
    from ray.cluster_utils import Cluster

    from autohet_ray.orchestrate.spot import BOARD_NAME, NAMESPACE, draining_nodes, start_watchers
    state, url = imds
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    worker = cluster.add_node(num_cpus=0, resources={"spot_node": 1})
    ray.init(address=cluster.address)
    try:
        watchers = start_watchers([worker.node_id], url=url, interval_s=0.2, flush_timeout_s=30)
        board = ray.get_actor(BOARD_NAME, namespace=NAMESPACE)
        time.sleep(0.5)
        assert ray.get(board.pending.remote()) == {}
        state.notice = notice_in(120)
        deadline = time.monotonic() + 30
        while not ray.get(board.pending.remote()):
            assert time.monotonic() < deadline, "the watcher never posted the notice"
            time.sleep(0.1)
        time.sleep(0.5)                                                # the watcher waits for the flush
        events = [e["event"] for e in ray.get(watchers[worker.node_id].report.remote())]
        assert events == ["notice"]
        ray.get(board.ack.remote(worker.node_id))                      # the controller flushed
        deadline = time.monotonic() + 30
        while worker.node_id not in draining_nodes():
            assert time.monotonic() < deadline, "node not drained"
            time.sleep(0.1)
        assert abs(draining_nodes()[worker.node_id] / 1000 - parse_notice(json.dumps(state.notice).encode())
                   ["deadline_s"]) < 1.0                               # Ray knows when the node goes away
        events = [e["event"] for e in ray.get(watchers[worker.node_id].report.remote(), timeout=5)]
        assert events == ["notice", "flushed", "drained"]
    finally:
        ray.kill(ray.get_actor(BOARD_NAME, namespace=NAMESPACE))
        ray.shutdown()
        cluster.shutdown()
