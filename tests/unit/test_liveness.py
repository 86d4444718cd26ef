"""The raylet probe and NodeWatch behind node-loss detection, against real sockets on 127.0.0.1 only (the Ray
tests in tests/ray/test_blip.py and test_recovery.py run them end to end): an answering server is "ok", a
closed port "refused", a listener that never answers "silent"; a silence counts as a loss only past the grace."""
from __future__ import annotations

import socket
import threading
import time

import pytest

from autohet_ray.cluster import node_probe
from autohet_ray.cluster.node_probe import NodeWatch, probe, probe_all

TIMEOUT_S = 0.2


class FakeRaylet:
    """A loopback listener standing for a raylet: while `answering` it replies to each connection's first
    bytes (as the raylet's gRPC server answers the HTTP/2 preface); otherwise it holds the connection without a
    word, like a stopped process whose kernel still completes the TCP handshake."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.05)
        self.address = self.sock.getsockname()
        self.answering, self.held, self.stopped = True, [], False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stopped:
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            if self.answering:
                conn.settimeout(1.0)
                conn.recv(64)                  # read the preface first: closing on unread bytes resets
                conn.sendall(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
                conn.close()
            else:
                self.held.append(conn)

    def close(self) -> None:
        self.stopped = True
        self.thread.join()
        self.sock.close()
        for conn in self.held:
            conn.close()


@pytest.fixture
def raylets():
    made = []

    def make():
        made.append(FakeRaylet())
        return made[-1]
    yield make
    for raylet in made:
        raylet.close()


def closed_port() -> tuple[str, int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()


def silent_listener(stack) -> tuple[str, int]:
    """A listening socket nobody accepts on: connects complete, nothing ever answers."""
    sock = stack.enter_context(socket.socket())
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    return sock.getsockname()


def test_probe_tells_an_answering_raylet_from_a_closed_port_and_a_silent_one(raylets):
    import contextlib
    raylet = raylets()
    assert probe(raylet.address, TIMEOUT_S) == "ok"
    assert probe(closed_port(), TIMEOUT_S) == "refused"
    with contextlib.ExitStack() as stack:
        start = time.monotonic()
        assert probe(silent_listener(stack), TIMEOUT_S) == "silent"     # accepted by the kernel only
        assert time.monotonic() - start == pytest.approx(TIMEOUT_S, abs=0.15)
    raylet.answering = False                          # a stalled process: the connect succeeds, no answer
    assert probe(raylet.address, TIMEOUT_S) == "silent"


def test_probes_run_in_parallel():
    import contextlib
    with contextlib.ExitStack() as stack:
        addresses = {f"n{i}": silent_listener(stack) for i in range(6)}
        start = time.monotonic()
        verdicts = probe_all(addresses, TIMEOUT_S)
        took = time.monotonic() - start
    assert verdicts == {name: "silent" for name in addresses}
    assert took < 2.5 * TIMEOUT_S, took               # one probe's time, not six


def test_a_refusal_or_a_missing_address_is_lost_at_once_whatever_the_grace(raylets):
    watch = NodeWatch({"a": raylets().address, "b": closed_port(), "c": None}, grace_s=60, timeout_s=TIMEOUT_S)
    assert watch.poll() == {"a": "ok", "b": "refused", "c": "dead"}
    assert watch.check() == ("b", "refused")
    assert "refuses connections" in watch.explain("b", "refused")
    assert watch.explain("c", "dead") == "Ray lists it as dead"


def test_a_blip_shorter_than_the_grace_passes_and_resets_the_silence(raylets):
    raylet = raylets()
    watch = NodeWatch({"a": raylet.address}, grace_s=1.5, timeout_s=TIMEOUT_S)
    assert watch.check() is None
    raylet.answering = False
    start = time.monotonic()
    while time.monotonic() - start < 0.6:             # silent, within the grace
        assert watch.check() is None
        assert watch.poll() == {"a": "quiet"}
    raylet.answering = True
    assert watch.poll() == {"a": "ok"} and watch.silent_s == {}
    raylet.answering = False                          # a second blip starts from zero
    start = time.monotonic()
    while time.monotonic() - start < 0.6:
        assert watch.check() is None


def test_a_silence_past_the_grace_is_a_loss_timed_on_the_wall_clock(raylets):
    raylet = raylets()
    watch = NodeWatch({"a": raylet.address, "b": raylets().address}, grace_s=0.8, timeout_s=TIMEOUT_S)
    assert watch.check() is None
    raylet.answering = False
    start = time.monotonic()
    while (lost := watch.check()) is None:
        assert time.monotonic() - start < 3.0, "the silence was never declared a loss"
        time.sleep(0.05)
    took = time.monotonic() - start
    assert lost == ("a", "silent")
    assert 0.8 <= took < 0.8 + 3 * TIMEOUT_S, took
    assert "silent for" in watch.explain("a", "silent") and "grace 0.8 s" in watch.explain("a", "silent")


def test_unwatched_time_between_probes_is_no_evidence_of_silence(raylets, monkeypatch):
    monkeypatch.setattr(node_probe, "MAX_PROBE_GAP_S", 0.1)
    raylet = raylets()
    raylet.answering = False
    watch = NodeWatch({"a": raylet.address}, grace_s=1.0, timeout_s=TIMEOUT_S)
    for _ in range(3):                       # 3 probes of 0.2 s, 0.25 s apart: 1.35 s on the wall, 0.6 s seen
        assert watch.poll() == {"a": "quiet"}
        time.sleep(0.25)
    assert watch.silent_s["a"] == pytest.approx(3 * TIMEOUT_S, abs=0.1)
