"""The raylet probe behind fast node-loss detection (the node-loss test in tests/ray/test_recovery.py runs it
end to end): a listening port answers "ok", a closed one "refused"."""
from __future__ import annotations

import socket

from autohet_ray.orchestrate.liveness import probe


def test_probe_tells_a_listening_port_from_a_closed_one():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        address = server.getsockname()
        assert probe(address) == "ok"
    assert probe(address) == "refused"            # nothing listens there any more
