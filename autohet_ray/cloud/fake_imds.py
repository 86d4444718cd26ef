"""A per-node fake of the AWS instance metadata service (IMDSv2) on 127.0.0.1, for emulated spot nodes.

It answers the two requests `cloud/notices.poll_aws` makes, as AWS does: PUT /latest/api/token (needs the
X-aws-ec2-metadata-token-ttl-seconds header) gives a token; GET /latest/meta-data/spot/instance-action with
that token answers 404 until a notice is posted, then {"action": "terminate", "time": "<ISO 8601 UTC>"}.
Requests without the token are refused (401), as IMDSv2 refuses them. The emulation posts a notice with
PUT /_emulate/notice (JSON body: the instance-action document). Each endpoint is its own small process (as the
metadata service is no part of the job's processes): `FakeImds()` starts it, `.url` is its base URL. The
emulated replay starts one per node and points that node's SpotWatcher at it, so a notice takes the same path
as a real one.
"""
from __future__ import annotations

import json
import secrets
import subprocess
import sys
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from autohet_ray.cloud.notices import AWS_ACTION_PATH, AWS_TOKEN_PATH, NO_PROXY_OPENER, iso_utc

CONTROL_PATH = "/_emulate/notice"


class FakeImds:
    """One node's metadata endpoint in its own process; `post_notice(deadline_s)` posts a spot notice."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-m", "autohet_ray.cloud.fake_imds"], stdout=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL, text=True)
        port = int(self.proc.stdout.readline())
        self.url = f"http://127.0.0.1:{port}"

    def post_notice(self, deadline_s: float, action: str = "terminate") -> None:
        """From now on the endpoint announces `action` at `deadline_s` (epoch seconds; AWS rounds to seconds)."""
        body = json.dumps({"action": action, "time": iso_utc(deadline_s)}).encode()
        req = urllib.request.Request(self.url + CONTROL_PATH, data=body, method="PUT")
        with NO_PROXY_OPENER.open(req, timeout=30) as resp:
            assert resp.status == 200, resp.status

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


class _State:
    def __init__(self):
        self.token = secrets.token_hex(16)
        self.notice: bytes | None = None


def _handler(state: _State):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, code: int, body: bytes = b"") -> None:
            try:
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):    # the poller gave up waiting: its next poll asks again
                pass

        def do_PUT(self):
            if self.path == CONTROL_PATH:
                state.notice = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                return self._send(200)
            if self.path != AWS_TOKEN_PATH or not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                return self._send(400)
            self._send(200, state.token.encode())

        def do_GET(self):
            if self.headers.get("X-aws-ec2-metadata-token") != state.token:
                return self._send(401)
            if self.path != AWS_ACTION_PATH or state.notice is None:
                return self._send(404)
            self._send(200, state.notice)
    return Handler


def serve() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(_State()))
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    serve()
