"""Spot/preemption notices read from a cloud's instance metadata service: one HTTP poll and parse per provider.

No Ray here (the per-node actors live in `elastic/spot.py`). Every reader returns None (no notice yet) or
    {"action": str, "time": ISO 8601 UTC str, "deadline_s": epoch seconds, "provider": "aws" | "gcp" | "azure"}
where `deadline_s` is when the cloud takes the machine away.

AWS, IMDSv2 (docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html and
  .../configuring-instance-metadata-service.html): PUT {base}/latest/api/token with header
  X-aws-ec2-metadata-token-ttl-seconds returns a token; GET {base}/latest/meta-data/spot/instance-action with
  header X-aws-ec2-metadata-token answers 404 until a notice exists, then
  {"action": "terminate" | "stop" | "hibernate", "time": "2026-11-29T18:45:00Z"} (about 2 minutes ahead).
GCP (cloud.google.com/compute/docs/instances/create-use-preemptible, "Detecting preemption", and
  .../create-use-spot, "Handle preemption"): GET {base}/computeMetadata/v1/instance/preempted with header
  Metadata-Flavor: Google (the server refuses requests without it, and its answers carry the same header)
  answers TRUE or FALSE. The answer holds no time: Compute Engine gives a best-effort 30 s between the
  preemption notice and the stop, so the deadline is the first TRUE seen + GCP_NOTICE_S, action "preempt".
  `?wait_for_change=true` would turn the poll into a hanging GET; plain polling keeps all providers alike.
Azure Scheduled Events (learn.microsoft.com/azure/virtual-machines/linux/scheduled-events): GET
  {base}/metadata/scheduledevents?api-version=2020-07-01 with header Metadata: true (refused without it)
  answers {"DocumentIncarnation": n, "Events": [{"EventId", "EventType", "ResourceType", "Resources",
  "EventStatus": "Scheduled" | "Started", "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT" (empty once started),
  ...}]}. A Spot eviction is EventType "Preempt", at least 30 s ahead. Events of a scale set or availability
  set reach all of its VMs, so only events whose Resources name this VM count; the VM's name comes from
  GET {base}/metadata/instance/compute/name?api-version=2021-02-01&format=text. Action "preempt".

provider="auto" tries aws, gcp, then azure against the same base URL and takes the first whose metadata
service answers in its own format (detect_provider). Its cost: on GCP one failed AWS token request first, on
Azure an AWS and a GCP one, each a fast local refusal; off any cloud (nothing at the address) every try
waits `timeout_s`, so one auto poll takes up to 3 x timeout_s and ends in MetadataUnavailable naming each
provider's failure. The SpotWatcher detects once and then polls only the provider it found.
All base URLs are configurable so tests point them at a local HTTP server on 127.0.0.1.
"""
from __future__ import annotations

import email.utils
import json
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone

from autohet_ray import ConfigError

METADATA_URL = "http://169.254.169.254"     # the link-local metadata address of all three clouds
PROVIDERS = ("aws", "gcp", "azure")
PROVIDER_CHOICES = (*PROVIDERS, "auto")

AWS_TOKEN_PATH = "/latest/api/token"
AWS_ACTION_PATH = "/latest/meta-data/spot/instance-action"
AWS_ACTIONS = ("terminate", "stop", "hibernate")
GCP_PREEMPTED_PATH = "/computeMetadata/v1/instance/preempted"
GCP_NOTICE_S = 30.0
# A job prepares its switch off a noticed node only with more than this left (the controller,
# job/notice_ahead.py, and the replay); nearer the deadline it flushes and re-plans at once.
NOTICE_MARGIN_S = 30.0
AZURE_EVENTS_PATH = "/metadata/scheduledevents?api-version=2020-07-01"
AZURE_NAME_PATH = "/metadata/instance/compute/name?api-version=2021-02-01&format=text"

# Metadata services are link-local: never send them through an HTTP(S)_PROXY from the environment.
NO_PROXY_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class MetadataUnavailable(OSError):
    """provider="auto" found no metadata service answering in any provider's format."""


def check_provider(provider: str) -> str:
    if provider not in PROVIDER_CHOICES:
        raise ConfigError(f"spot notice provider {provider!r}: must be one of {', '.join(PROVIDER_CHOICES)}")
    return provider


def _request(url: str, *, method: str = "GET", headers: dict | None = None, timeout_s: float = 2.0):
    """(body, response headers); urllib's HTTPError (an OSError) on a non-2xx answer."""
    req = urllib.request.Request(url, method=method, headers=headers or {})
    with NO_PROXY_OPENER.open(req, timeout=timeout_s) as resp:
        return resp.read(), resp.headers


def iso_utc(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _notice(provider: str, action: str, time_text: str, deadline_s: float) -> dict:
    return {"action": action, "time": time_text, "deadline_s": deadline_s, "provider": provider}


# -- AWS -------------------------------------------------------------------------------------------------------
def poll_aws(base_url: str = METADATA_URL, *, timeout_s: float = 2.0, token_ttl_s: int = 300) -> dict | None:
    token, _ = _request(base_url + AWS_TOKEN_PATH, method="PUT", timeout_s=timeout_s,
                        headers={"X-aws-ec2-metadata-token-ttl-seconds": str(token_ttl_s)})
    try:
        raw, _ = _request(base_url + AWS_ACTION_PATH, headers={"X-aws-ec2-metadata-token": token.decode()},
                          timeout_s=timeout_s)
    except urllib.error.HTTPError as err:
        if err.code == 404:
            return None
        raise
    return parse_aws(raw)


def parse_aws(raw: bytes) -> dict:
    body = _json(raw, "AWS spot/instance-action")
    action = body.get("action") if isinstance(body, dict) else None
    if action not in AWS_ACTIONS:
        raise ConfigError(f"AWS spot/instance-action {body!r}: action must be one of {', '.join(AWS_ACTIONS)}")
    when = body.get("time")
    try:
        deadline_s = datetime.fromisoformat(when.replace("Z", "+00:00")).timestamp()
    except (AttributeError, ValueError):
        raise ConfigError(f"AWS spot/instance-action time {when!r}: expected ISO 8601 like "
                          f"'2026-11-29T18:45:00Z'") from None
    return _notice("aws", action, when, deadline_s)


# -- GCP -------------------------------------------------------------------------------------------------------
def poll_gcp(base_url: str = METADATA_URL, *, timeout_s: float = 2.0) -> dict | None:
    raw, headers = _request(base_url + GCP_PREEMPTED_PATH, headers={"Metadata-Flavor": "Google"},
                            timeout_s=timeout_s)
    if headers.get("Metadata-Flavor") != "Google":
        raise ConfigError(f"{base_url}{GCP_PREEMPTED_PATH} answered without the header 'Metadata-Flavor: "
                          f"Google': not a GCP metadata server")
    return parse_gcp(raw)


def parse_gcp(raw: bytes, *, now_s: float | None = None) -> dict | None:
    answer = raw.strip()
    if answer == b"FALSE":
        return None
    if answer != b"TRUE":
        raise ConfigError(f"GCP instance/preempted answered {raw[:80]!r}: expected TRUE or FALSE")
    deadline_s = (time.time() if now_s is None else now_s) + GCP_NOTICE_S
    return _notice("gcp", "preempt", iso_utc(deadline_s), deadline_s)


# -- Azure -----------------------------------------------------------------------------------------------------
def poll_azure(base_url: str = METADATA_URL, *, timeout_s: float = 2.0) -> dict | None:
    headers = {"Metadata": "true"}
    name, _ = _request(base_url + AZURE_NAME_PATH, headers=headers, timeout_s=timeout_s)
    raw, _ = _request(base_url + AZURE_EVENTS_PATH, headers=headers, timeout_s=timeout_s)
    return parse_azure(raw, vm_name=name.decode().strip())


def parse_azure(raw: bytes, *, vm_name: str, now_s: float | None = None) -> dict | None:
    """The earliest Preempt event naming `vm_name` among its Resources, as a notice; None if there is none."""
    body = _json(raw, "Azure scheduledevents")
    events = body.get("Events") if isinstance(body, dict) else None
    if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
        raise ConfigError(f"Azure scheduledevents {body!r}: expected an object with an 'Events' list of objects")
    notices = [_azure_notice(e, now_s) for e in events
               if e.get("EventType") == "Preempt" and vm_name in (e.get("Resources") or ())]
    return min(notices, key=lambda n: n["deadline_s"], default=None)


def _azure_notice(event: dict, now_s: float | None) -> dict:
    not_before = event.get("NotBefore")
    if not not_before:                        # "" once the event has started: the VM goes now
        deadline_s = time.time() if now_s is None else now_s
        return _notice("azure", "preempt", iso_utc(deadline_s), deadline_s)
    try:
        deadline_s = email.utils.parsedate_to_datetime(not_before).timestamp()
    except (TypeError, ValueError):
        raise ConfigError(f"Azure Preempt event {event.get('EventId')!r}: NotBefore {not_before!r} is not an "
                          f"RFC 1123 date like 'Mon, 19 Sep 2016 18:29:47 GMT'") from None
    return _notice("azure", "preempt", iso_utc(deadline_s), deadline_s)


def _json(raw: bytes, what: str):
    try:
        return json.loads(raw)
    except ValueError:
        raise ConfigError(f"{what} answered {raw[:80]!r}: expected JSON") from None


# -- any provider ----------------------------------------------------------------------------------------------
READERS = {"aws": poll_aws, "gcp": poll_gcp, "azure": poll_azure}


def detect_provider(base_url: str = METADATA_URL, *, timeout_s: float = 2.0) -> tuple[str, dict | None]:
    """(the first provider of PROVIDERS whose metadata service answers, its current notice or None)."""
    failures = []
    for provider in PROVIDERS:
        try:
            return provider, READERS[provider](base_url, timeout_s=timeout_s)
        except (OSError, ConfigError) as err:        # not this cloud (or its answer is not in this format)
            failures.append(f"{provider}: {err!r}")
    raise MetadataUnavailable(f"no spot notice service at {base_url} ({'; '.join(failures)})")


def poll_notice(base_url: str = METADATA_URL, *, provider: str = "aws", timeout_s: float = 2.0) -> dict | None:
    """The pending notice of `provider` ("aws", "gcp", "azure"; "auto": detect_provider first) or None."""
    if check_provider(provider) == "auto":
        return detect_provider(base_url, timeout_s=timeout_s)[1]
    return READERS[provider](base_url, timeout_s=timeout_s)
