"""Fake instance-metadata services of AWS (IMDSv2), GCP and Azure on 127.0.0.1 for tests.

Each refuses requests that lack the headers its cloud requires (AWS: the IMDSv2 token; GCP: Metadata-Flavor:
Google; Azure: Metadata: true) and logs every request as "METHOD path". Test modules import it by path
(tests/ is on the import path through pytest's `pythonpath` in pyproject.toml):
    from fake_metadata import fake_metadata
    with fake_metadata("gcp") as fake:
        fake.preempted = True            # aws: fake.notice = notice_in(120); azure: fake.events = [...]
"""
from __future__ import annotations

import contextlib
import email.utils
import json
import threading
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

AWS_TOKEN = "test-token-123"
AZURE_VM = "spot-vm-1"


class FakeMetadata:
    """What the fake answers; set the attribute of its provider. `raw` (bytes) replaces the notice endpoint's
    body (for malformed answers)."""

    def __init__(self, provider: str):
        assert provider in ("aws", "gcp", "azure"), provider
        self.provider = provider
        self.requests: list[str] = []
        self.notice: dict | None = None          # aws: the spot/instance-action document
        self.preempted = False                   # gcp
        self.events: list[dict] = []             # azure: Scheduled Events
        self.incarnation = 1
        self.vm_name = AZURE_VM                  # azure: this VM's compute/name
        self.raw: bytes | None = None
        self.flavor_header = True                # gcp: answers carry Metadata-Flavor: Google
        self.server: ThreadingHTTPServer | None = None
        self.url = ""

    def shutdown(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _handler(fake: FakeMetadata):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, code: int, body: bytes = b"", headers: dict | None = None) -> None:
            self.send_response(code)
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_PUT(self):
            fake.requests.append(f"PUT {self.path}")
            if fake.provider != "aws":
                return self._send(405)
            ok = self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
            self._send(200, AWS_TOKEN.encode()) if ok else self._send(400)

        def do_GET(self):
            fake.requests.append(f"GET {self.path}")
            getattr(self, f"_get_{fake.provider}")()

        def _get_aws(self):
            if self.headers.get("X-aws-ec2-metadata-token") != AWS_TOKEN:
                return self._send(401)
            if self.path != "/latest/meta-data/spot/instance-action" or (fake.notice is None and fake.raw is None):
                return self._send(404)
            self._send(200, fake.raw if fake.raw is not None else json.dumps(fake.notice).encode())

        def _get_gcp(self):
            flavor = {"Metadata-Flavor": "Google"} if fake.flavor_header else {}
            if self.headers.get("Metadata-Flavor") != "Google":
                return self._send(403, b"Missing Metadata-Flavor:Google header.", flavor)
            if self.path.split("?")[0] != "/computeMetadata/v1/instance/preempted":
                return self._send(404, b"", flavor)
            body = fake.raw if fake.raw is not None else (b"TRUE" if fake.preempted else b"FALSE")
            self._send(200, body, flavor)

        def _get_azure(self):
            if self.headers.get("Metadata") != "true":
                return self._send(400, b'{"error": "Bad request. Required metadata header not specified"}')
            path, _, query = self.path.partition("?")
            if "api-version=" not in query:
                return self._send(400, b'{"error": "Bad request. api-version was not specified"}')
            if path == "/metadata/instance/compute/name":
                return self._send(200, fake.vm_name.encode())
            if path != "/metadata/scheduledevents":
                return self._send(404)
            doc = {"DocumentIncarnation": fake.incarnation, "Events": fake.events}
            self._send(200, fake.raw if fake.raw is not None else json.dumps(doc).encode())
    return Handler


def start_metadata(provider: str) -> FakeMetadata:
    """A running fake of `provider` on 127.0.0.1:<free port> (its base URL: `.url`); `.shutdown()` ends it."""
    fake = FakeMetadata(provider)
    fake.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    threading.Thread(target=fake.server.serve_forever, daemon=True).start()
    fake.url = f"http://127.0.0.1:{fake.server.server_address[1]}"
    return fake


@contextlib.contextmanager
def fake_metadata(provider: str):
    fake = start_metadata(provider)
    try:
        yield fake
    finally:
        fake.shutdown()


def start_imds():
    """An AWS fake as (server, fake, url); set `fake.notice` to post a notice."""
    fake = start_metadata("aws")
    return fake.server, fake, fake.url


def notice_in(seconds: float, action: str = "terminate") -> dict:
    """An AWS spot/instance-action document for `seconds` from now."""
    when = datetime.now(timezone.utc) + timedelta(seconds=seconds)
    return {"action": action, "time": when.strftime("%Y-%m-%dT%H:%M:%SZ")}


def azure_event(event_type: str = "Preempt", *, resources=(AZURE_VM,), seconds: float | None = 30,
                event_id: str = "602d9444-d2cd-49c7-8624-8643e7171297") -> dict:
    """A Scheduled Events entry; `seconds` from now as NotBefore, None: already started (NotBefore "")."""
    started = seconds is None
    not_before = "" if started else email.utils.format_datetime(
        datetime.now(timezone.utc).replace(microsecond=0) + timedelta(seconds=seconds), usegmt=True)
    return {"EventId": event_id, "EventType": event_type, "ResourceType": "VirtualMachine",
            "Resources": list(resources), "EventStatus": "Started" if started else "Scheduled",
            "NotBefore": not_before, "Description": "", "EventSource": "Platform", "DurationInSeconds": -1}
