"""Is a node's raylet still answering? A probe tells a blip from a loss faster than Ray's health checks.

Ray's GCS declares a node dead only after its health checks fail (seconds: period x threshold). A probe of the
node's raylet settles most cases at once: a live raylet answers within milliseconds, a killed one refuses the
connection (conclusive), and a stalled raylet or a vanished host stays silent. Silence alone is not
conclusive (a network blip, a paused process): `NodeWatch` declares a silent node lost only once the silence
lasts past a grace period (elastic/liveness.py: or when Ray itself lists the node as dead). Probes of several
nodes run at once. Sockets only, no Ray.
"""
from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor

RAYLET_PROBE_TIMEOUT_S = 0.5
# Probes further apart than this leave the time between them unobserved: it does not count as silence.
MAX_PROBE_GAP_S = 2.0
LOST_VERDICTS = ("refused", "dead", "silent")
# An HTTP/2 client preface and an empty SETTINGS frame (RFC 9113, 3.4): the raylet's gRPC server answers
# with its own SETTINGS. A bare TCP connect is no proof of life: the kernel completes it for a stopped process.
HTTP2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


def probe(address: tuple[str, int], timeout_s: float = RAYLET_PROBE_TIMEOUT_S) -> str:
    """"ok" (the raylet answered), "refused" (the host answers but nothing listens: the raylet died) or
    "silent" (no answer in time: the host is gone, the network hiccuped, or the raylet is stalled)."""
    deadline = time.monotonic() + timeout_s
    try:
        with socket.create_connection(address, timeout=timeout_s) as conn:
            conn.settimeout(max(1e-3, deadline - time.monotonic()))
            conn.sendall(HTTP2_HELLO)
            conn.recv(4096)               # any bytes, or an orderly close: a running process handled it
            return "ok"
    except ConnectionRefusedError:
        return "refused"
    except OSError:
        return "silent"


def probe_all(addresses: dict, timeout_s: float = RAYLET_PROBE_TIMEOUT_S) -> dict:
    """key -> probe(address), every address probed at once (a thread each): one probe's time, not N."""
    if not addresses:
        return {}
    with ThreadPoolExecutor(max_workers=len(addresses), thread_name_prefix="raylet-probe") as pool:
        futures = {key: pool.submit(probe, address, timeout_s) for key, address in addresses.items()}
    return {key: future.result() for key, future in futures.items()}


class NodeWatch:
    """Which of a set of nodes are lost, on conclusive evidence only: the raylet refuses connections ("refused"),
    Ray lists the node as dead or gave no address for it ("dead"), or the raylet stays silent past `grace_s`
    ("silent"). Silence is the wall time since the node last answered (gaps over MAX_PROBE_GAP_S between
    probes excluded: nobody watched then). A shorter silence reads "quiet".
    `raylets`: node name -> (host, port), or None where Ray no longer lists the node as alive."""

    def __init__(self, raylets: dict, grace_s: float, *, timeout_s: float = RAYLET_PROBE_TIMEOUT_S):
        assert grace_s >= 0, grace_s
        self.raylets, self.grace_s, self.timeout_s = dict(raylets), grace_s, timeout_s
        self.silent_s: dict[str, float] = {}       # name -> seconds silent since it last answered
        self.last_probe: dict[str, float] = {}     # name -> when its latest probe ended (monotonic)

    def poll(self) -> dict[str, str]:
        """Probe every node once, all at once: name -> "ok", "quiet", or why it is lost (LOST_VERDICTS)."""
        start = time.monotonic()
        answers = probe_all({name: a for name, a in self.raylets.items() if a is not None}, self.timeout_s)
        end = time.monotonic()
        verdicts = {}
        for name in self.raylets:
            verdict = answers.get(name, "dead")
            if verdict == "silent":
                since = start - self.last_probe.get(name, start)
                self.silent_s[name] = (self.silent_s.get(name, 0.0) + (since if since <= MAX_PROBE_GAP_S else 0.0)
                                       + end - start)
                if self.silent_s[name] < self.grace_s:
                    verdict = "quiet"
            else:
                self.silent_s.pop(name, None)
            self.last_probe[name] = end
            verdicts[name] = verdict
        quiet = [name for name, v in verdicts.items() if v == "quiet"]
        if quiet:
            verdicts |= {name: "dead" for name in self.dead_among(quiet)}
        return verdicts

    def dead_among(self, quiet: list[str]) -> set[str]:
        """Which quiet nodes are known dead by other means than the probe (none here; elastic/ asks Ray)."""
        return set()

    def check(self) -> tuple[str, str] | None:
        """(name, why) of the first lost node by name; None while every node answers or is within its grace."""
        return next(((name, v) for name, v in sorted(self.poll().items()) if v in LOST_VERDICTS), None)

    def explain(self, name: str, verdict: str) -> str:
        address = self.raylets[name]
        at = f"its raylet at {address[0]}:{address[1]}" if address else "its raylet"
        if verdict == "refused":
            return f"{at} refuses connections"
        if verdict == "dead":
            return "Ray lists it as dead"
        return f"{at} has been silent for {self.silent_s.get(name, 0.0):.1f} s (grace {self.grace_s:g} s)"
