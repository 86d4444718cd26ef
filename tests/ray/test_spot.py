"""Spot notices from AWS (IMDSv2), GCP and Azure metadata fakes on loopback; per-job notice boards on a real Ray
cluster; the flush handshake before a watcher drains its node; Ray's (private) drain state pinned."""
from __future__ import annotations

import email.utils
import json
import socket
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone

import pytest

ray = pytest.importorskip("ray")

from autohet_ray import ConfigError  # noqa: E402
from autohet_ray.cloud.notices import MetadataUnavailable, detect_provider, parse_aws, parse_azure, poll_notice  # noqa: E402
from autohet_ray.elastic.spot import (board_name, drain_node, draining_nodes, job_watchers,  # noqa: E402
                                      start_watchers, stop_watching, watch_nodes)
from fake_metadata import azure_event, fake_metadata, notice_in  # noqa: E402

pytestmark = pytest.mark.timeout(180)


def wait_for(predicate, what: str, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        assert time.monotonic() < deadline, what
        time.sleep(0.1)
    return value


def bare_get(url: str) -> int:
    """The status of a GET without any metadata header."""
    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=2) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


# -- readers against fake metadata servers (no Ray) ---------------------------------------------------------------
def test_aws_poll_uses_imdsv2_token_and_parses():
    with fake_metadata("aws") as fake:
        assert poll_notice(fake.url) is None                               # 404: no notice yet
        assert fake.requests == ["PUT /latest/api/token", "GET /latest/meta-data/spot/instance-action"]
        assert bare_get(fake.url + "/latest/meta-data/spot/instance-action") == 401
        fake.notice = {"action": "terminate", "time": "2026-11-29T18:45:00Z"}
        notice = poll_notice(fake.url, provider="aws")
    assert notice == {"action": "terminate", "time": "2026-11-29T18:45:00Z", "provider": "aws",
                      "deadline_s": datetime(2026, 11, 29, 18, 45, tzinfo=timezone.utc).timestamp()}
    with pytest.raises(ConfigError, match="action must be one of terminate, stop, hibernate"):
        parse_aws(b'{"action": "explode", "time": "2026-11-29T18:45:00Z"}')


def test_gcp_poll_sends_metadata_flavor_and_reads_preempted():
    with fake_metadata("gcp") as fake:
        assert bare_get(fake.url + "/computeMetadata/v1/instance/preempted") == 403
        fake.requests.clear()
        assert poll_notice(fake.url, provider="gcp") is None               # FALSE
        assert fake.requests == ["GET /computeMetadata/v1/instance/preempted"]
        fake.preempted = True
        before = time.time()
        notice = poll_notice(fake.url, provider="gcp")
        after = time.time()
    assert notice["action"] == "preempt" and notice["provider"] == "gcp"
    assert before + 30 <= notice["deadline_s"] <= after + 30               # GCP's best-effort 30 s
    assert notice["time"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(notice["deadline_s"]))


def test_azure_poll_reads_preempt_events_naming_this_vm():
    with fake_metadata("azure") as fake:
        assert bare_get(fake.url + "/metadata/scheduledevents?api-version=2020-07-01") == 400
        assert poll_notice(fake.url, provider="azure") is None              # no events
        fake.events = [azure_event("Freeze"), azure_event(resources=["another-vm"], seconds=5)]
        assert poll_notice(fake.url, provider="azure") is None              # not a preemption, not this VM
        soon, later = azure_event(seconds=45), azure_event(seconds=90, event_id="later")
        fake.events.extend([later, soon])
        notice = poll_notice(fake.url, provider="azure")
        assert {r.split("?")[0] for r in fake.requests} == {"GET /metadata/instance/compute/name",
                                                            "GET /metadata/scheduledevents"}
    assert notice["action"] == "preempt" and notice["provider"] == "azure"
    assert notice["deadline_s"] == email.utils.parsedate_to_datetime(soon["NotBefore"]).timestamp()
    started = parse_azure(json.dumps({"DocumentIncarnation": 2, "Events": [azure_event(seconds=None)]}).encode(),
                          vm_name="spot-vm-1", now_s=1000.0)
    assert started["deadline_s"] == 1000.0                                 # NotBefore "": it goes now


@pytest.mark.parametrize("provider, answer, message", [
    ("gcp", b"MAYBE", r"GCP instance/preempted answered b'MAYBE': expected TRUE or FALSE"),
    ("azure", b"<html>", r"Azure scheduledevents answered b'<html>': expected JSON"),
    ("azure", b'{"Events": 3}', r"Azure scheduledevents \{'Events': 3\}: expected an object with an 'Events' list"),
    ("azure", b'{"Events": [{"EventId": "e1", "EventType": "Preempt", "Resources": ["spot-vm-1"], '
              b'"NotBefore": "tomorrow"}]}', r"NotBefore 'tomorrow' is not an RFC 1123 date"),
    ("aws", b'{"action": "stop", "time": "soon"}', r"time 'soon': expected ISO 8601"),
    ("aws", b"[]", r"action must be one of terminate, stop, hibernate"),
])
def test_malformed_metadata_answers_are_config_errors(provider, answer, message):
    with fake_metadata(provider) as fake:
        fake.raw = answer
        with pytest.raises(ConfigError, match=message):
            poll_notice(fake.url, provider=provider)


def test_gcp_answer_without_the_flavor_header_is_not_gcp():
    with fake_metadata("gcp") as fake:
        fake.flavor_header = False
        with pytest.raises(ConfigError, match="without the header 'Metadata-Flavor: Google'"):
            poll_notice(fake.url, provider="gcp")


def test_bad_provider_names_and_job_ids_are_config_errors():
    with pytest.raises(ConfigError, match="provider 'oracle': must be one of aws, gcp, azure, auto"):
        poll_notice("http://127.0.0.1:9", provider="oracle")
    with pytest.raises(ConfigError, match="provider 'AWS': must be one of aws, gcp, azure, auto"):
        start_watchers(["n"], job_id="j", provider="AWS")                 # refused before anything starts
    with pytest.raises(ConfigError, match="interval_s must be > 0"):
        watch_nodes(["n"], job_id="j", provider="aws", interval_s=0)
    with pytest.raises(ConfigError, match="job_id must be a non-empty string"):
        board_name("")


def test_auto_tries_aws_gcp_azure_in_turn():
    with fake_metadata("aws") as aws, fake_metadata("gcp") as gcp, fake_metadata("azure") as azure:
        aws.notice, gcp.preempted, azure.events = notice_in(120), True, [azure_event()]
        assert [detect_provider(f.url)[1]["provider"] for f in (aws, gcp, azure)] == ["aws", "gcp", "azure"]
        assert azure.requests[:2] == ["PUT /latest/api/token", "GET /computeMetadata/v1/instance/preempted"]
        assert poll_notice(gcp.url, provider="auto")["provider"] == "gcp"
    with socket.socket() as s:                                             # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(MetadataUnavailable, match=r"no spot notice service at .*aws: .*; gcp: .*; azure: "):
        poll_notice(closed, provider="auto")


# -- watchers on a real Ray cluster ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster
    small = {"object_store_memory": 80 * 1024 ** 2}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False, **small})
    cluster.small = small
    ray.init(address=cluster.address)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def add_node(cluster) -> str:
    node_id = cluster.add_node(num_cpus=0, **cluster.small).node_id
    # not cluster.wait_for_nodes(): it also counts the nodes that drained and exited
    wait_for(lambda: any(n["NodeID"] == node_id and n["Alive"] for n in ray.nodes()), "node did not join")
    return node_id


def board_gone(job_id: str) -> bool:
    try:
        ray.get_actor(board_name(job_id), namespace="autohet-spot")
    except ValueError:
        return True
    return False


def events(watcher) -> list[str]:
    return [e["event"] for e in ray.get(watcher.report.remote(), timeout=10)]


def test_draining_nodes_reports_a_drained_node_and_its_deadline(cluster):
    """Pins Ray's private drain state (no public API has it): an upgrade that breaks it fails here."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_cpus=0)
    class Busy:                                      # an idle node would exit at once instead of draining
        def ping(self):
            return True
    node_id = add_node(cluster)
    busy = Busy.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote()
    assert ray.get(busy.ping.remote(), timeout=30)
    assert node_id not in draining_nodes()
    deadline_s = time.time() + 300
    drain_node(node_id, deadline_s=deadline_s, message="test_spot: pin draining_nodes")
    assert wait_for(lambda: draining_nodes().get(node_id), "drained node not reported") == int(deadline_s * 1000)
    ray.kill(busy)


def test_aws_watcher_waits_for_flush_then_drains_node_as_preemption(cluster):
    node_id = add_node(cluster)
    with fake_metadata("aws") as imds:
        board = watch_nodes([node_id], job_id="aws-job", provider="aws", url=imds.url, interval_s=0.2, flush_timeout_s=30)
        [watcher] = ray.get(board.watcher_handles.remote()).values()
        try:
            wait_for(lambda: len(imds.requests) >= 4, "the watcher never polled")
            assert ray.get(board.pending.remote()) == {}
            noticed_at = time.time()
            imds.notice = notice_in(120)
            pending = wait_for(lambda: ray.get(board.pending.remote()), "the watcher never posted the notice")
            # the notice says when the watcher stops waiting for the flush and drains (the job's switch deadline)
            assert noticed_at + 30 <= pending[node_id]["flush_by_s"] <= time.time() + 30
            time.sleep(0.5)                                                    # the watcher waits for the flush
            assert events(watcher) == ["notice"]
            ray.get(board.ack.remote(node_id))                                 # the controller flushed
            deadline_ms = wait_for(lambda: draining_nodes().get(node_id), "node not drained")
            assert abs(deadline_ms / 1000 - parse_aws(json.dumps(imds.notice).encode())
                       ["deadline_s"]) < 1.0                                   # Ray knows when the node goes away
            wait_for(lambda: events(watcher) == ["notice", "flushed", "drained"], "watcher did not finish")
        finally:
            stop_watching("aws-job")


def test_gcp_and_azure_notices_reach_only_their_own_jobs_board(cluster):
    gcp_node, azure_node = add_node(cluster), add_node(cluster)
    options = {"interval_s": 0.2, "flush_timeout_s": 30}
    jobs = ("train", "train-2", "azure-job", "broken-job")
    with fake_metadata("gcp") as gcp, fake_metadata("azure") as azure, fake_metadata("aws") as quiet:
        try:
            boards = {
                "train": watch_nodes([gcp_node], job_id="train", provider="gcp", url=gcp.url, **options),
                "train-2": watch_nodes([gcp_node], job_id="train-2", provider="aws", url=quiet.url, **options),
                "azure-job": watch_nodes([azure_node], job_id="azure-job", provider="auto", url=azure.url,
                                         **options),
                "broken-job": watch_nodes([azure_node], job_id="broken-job", provider="gcp", url=azure.url,
                                          **options)}                          # GCP headers to Azure: refused
            watchers = {job: watcher for job in jobs for watcher in ray.get(boards[job].watcher_handles.remote())
                        .values()}
            wait_for(lambda: all(len(job_watchers(job)) == 1 for job in jobs), "watchers not registered")
            wait_for(lambda: len(quiet.requests) >= 4, "the quiet job's watcher never polled")
            gcp.preempted, azure.events = True, [azure_event(seconds=60)]
            posted = {job: wait_for(lambda job=job: ray.get(boards[job].pending.remote()), f"{job}: no notice")
                      for job in ("train", "azure-job")}
            assert list(posted["train"]) == [gcp_node] and posted["train"][gcp_node]["provider"] == "gcp"
            assert list(posted["azure-job"]) == [azure_node]
            assert posted["azure-job"][azure_node]["deadline_s"] == email.utils.parsedate_to_datetime(
                azure.events[0]["NotBefore"]).timestamp()
            time.sleep(1.0)                                                    # several more polls of the others
            assert ray.get(boards["train-2"].pending.remote()) == {}           # same node, other job: nothing
            assert ray.get(boards["broken-job"].pending.remote()) == {}
            broken = ray.get(watchers["broken-job"].report.remote())
            assert broken and all(e["event"] == "poll_error" and "HTTPError 400" in e["error"] for e in broken)
            assert ray.get(watchers["azure-job"].report.remote())[0]["provider"] == "azure"   # auto found it

            for job, node_id in (("train", gcp_node), ("azure-job", azure_node)):
                ray.get(boards[job].ack.remote(node_id))
                deadline_ms = wait_for(lambda node_id=node_id: draining_nodes().get(node_id), "not drained")
                assert deadline_ms == int(posted[job][node_id]["deadline_s"] * 1000)
                wait_for(lambda job=job: events(watchers[job])[-1] == "drained", f"{job}: not drained")

            stop_watching("train")                                             # "train-2" is another job
            wait_for(lambda: not job_watchers("train"), "train's watcher still alive")
            assert job_watchers("train-2") and ray.get(boards["train-2"].pending.remote()) == {}
            wait_for(lambda: board_gone("train"), "train's board still alive")
        finally:
            for job in jobs:
                stop_watching(job)
        for job in jobs:
            wait_for(lambda job=job: not job_watchers(job), f"{job}: watcher still alive")
            wait_for(lambda job=job: board_gone(job), f"{job}: board still alive")
