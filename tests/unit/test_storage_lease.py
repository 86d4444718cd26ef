"""A storage belongs to one job: the lease (a directory, and a real S3 API server) is exclusive, names its holder
when refused, is released on the way out of `with` (also by an exception or a signal) but never removes another
holder's lease; a holder that is provably gone is broken by itself, any other only with --break-lease. And a new
job refuses a storage that already holds one, without touching it."""
import json
import os
import pathlib
import signal
import socket

import boto3
import pytest

from autohet_ray import ConfigError  # noqa: E402
from autohet_ray.storage.lease import LEASE_FILE, LeaseHeldError, storage_lease  # noqa: E402
from autohet_ray.storage.spec import storage_spec  # noqa: E402
from s3_server import CREDENTIALS, moto_endpoint, new_bucket  # noqa: E402

ENV = {"aws_access_key_id": "AWS_ACCESS_KEY_ID", "aws_secret_access_key": "AWS_SECRET_ACCESS_KEY",
       "region_name": "AWS_DEFAULT_REGION"}


@pytest.fixture
def s3(monkeypatch):
    """(endpoint, client, bucket) of an S3 API server and a new bucket."""
    for key, value in CREDENTIALS.items():
        monkeypatch.setenv(ENV[key], value)
    with moto_endpoint() as endpoint:
        yield endpoint, boto3.client("s3", endpoint_url=endpoint, **CREDENTIALS), new_bucket(endpoint)


class Store:
    """The lease object of a storage, read and written directly (as another process would)."""

    def __init__(self, kind: str, tmp_path, s3):
        if kind == "dir":
            self.url = str(tmp_path / "run")
            self.spec = storage_spec(self.url)
        else:
            self.bucket = s3[2]
            self.url = f"s3://{self.bucket}/job-1"
            self.spec, self.client = storage_spec(self.url, endpoint_url=s3[0]), s3[1]
        self.kind = kind

    def read(self) -> dict | None:
        if self.kind == "dir":
            path = pathlib.Path(self.url) / LEASE_FILE
            return json.loads(path.read_text()) if path.exists() else None
        try:
            return json.loads(self.client.get_object(Bucket=self.bucket, Key=f"job-1/{LEASE_FILE}")["Body"].read())
        except self.client.exceptions.NoSuchKey:
            return None

    def write(self, holder: dict) -> None:
        body = json.dumps(holder)
        if self.kind == "dir":
            os.makedirs(self.url, exist_ok=True)
            (pathlib.Path(self.url) / LEASE_FILE).write_text(body)
        else:
            self.client.put_object(Bucket=self.bucket, Key=f"job-1/{LEASE_FILE}", Body=body.encode())

    def lease(self, job_id: str, **kw):
        return storage_lease(self.spec, self.url, job_id=job_id, **kw)


@pytest.fixture(params=["dir", "s3"])
def store(request, tmp_path):
    s3 = request.getfixturevalue("s3") if request.param == "s3" else None
    return Store(request.param, tmp_path, s3)


def test_the_lease_is_exclusive_and_names_its_holder(store):
    with store.lease("first") as first:
        held = store.read()
        assert held["job_id"] == "first" and held["pid"] == os.getpid() and held["host"] == socket.gethostname()
        assert held["token"] == first.holder["token"] and held["start"]
        with pytest.raises(LeaseHeldError) as err:
            with store.lease("second", wait_s=0.3):
                pass
        text = str(err.value)
        assert f"is in use by job first (pid {os.getpid()} on {socket.gethostname()}, since " in text
        assert "--break-lease" in text and "\n" not in text and isinstance(err.value, ConfigError)
        assert store.read()["token"] == first.holder["token"]          # the refused one took nothing
    assert store.read() is None                                          # released at the normal end
    with store.lease("second"):
        assert store.read()["job_id"] == "second"


def test_the_lease_is_released_when_the_run_fails(store):
    with pytest.raises(RuntimeError, match="boom"):
        with store.lease("failing"):
            assert store.read() is not None
            raise RuntimeError("boom")
    assert store.read() is None


def test_a_signal_ends_the_run_through_the_exit_path(store):
    assert signal.getsignal(signal.SIGHUP) == signal.SIG_DFL
    with pytest.raises(SystemExit) as ended:
        with store.lease("hung-up"):
            os.kill(os.getpid(), signal.SIGHUP)
    assert ended.value.code == 128 + signal.SIGHUP and store.read() is None
    assert signal.getsignal(signal.SIGHUP) == signal.SIG_DFL             # restored


def _holder(**changes) -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(), "start": "1", "boot_id": None, "job_id": "old",
            "since": 0.0, "since_utc": "2026-01-01 00:00:00", "token": "theirs", **changes}


def _dead_pid() -> int:
    with open("/proc/sys/kernel/pid_max") as f:
        return int(f.read()) + 1                  # above pid_max: no process can have it


def _boot_id() -> str:
    with open("/proc/sys/kernel/random/boot_id") as f:
        return f.read().strip()


@pytest.mark.parametrize("case, why", [("dead", "no process {pid} runs on this host"),
                                       ("reused", "pid {pid} now belongs to another process"),
                                       ("rebooted", "this host rebooted since")])
def test_a_holder_provably_gone_is_broken_with_a_line(store, case, why, capsys):
    holder = {"dead": _holder(pid=_dead_pid(), start=None, boot_id=_boot_id()),
              "reused": _holder(start="1", boot_id=_boot_id()),
              "rebooted": _holder(start=None, boot_id="an-earlier-boot")}[case]
    store.write(holder)
    with store.lease("new"):
        assert store.read()["job_id"] == "new"
    line = capsys.readouterr().err.strip()
    pid = holder["pid"]
    assert line == (f"autohet: broke the lease of job old (pid {pid} on {socket.gethostname()}, since "
                    f"2026-01-01 00:00:00 UTC) on storage {store.url!r} ({why.format(pid=pid)})")


def test_a_live_or_remote_holder_is_broken_only_by_the_flag(store, capsys):
    for other in (_holder(host="elsewhere", pid=1), _holder(start=None)):      # another host; this very process
        store.write(other)
        with pytest.raises(LeaseHeldError, match=f"job old .pid {other['pid']} on {other['host']},"):
            with store.lease("new", wait_s=0.3):
                pass
        assert store.read()["token"] == "theirs"
        with store.lease("new", break_lease=True):
            assert store.read()["job_id"] == "new"
        assert "(broken by --break-lease)" in capsys.readouterr().err and store.read() is None


def test_an_unreadable_lease_is_refused_until_broken(store):
    if store.kind == "dir":
        os.makedirs(store.url, exist_ok=True)
        (pathlib.Path(store.url) / LEASE_FILE).write_text("{torn")
    else:
        store.client.put_object(Bucket=store.bucket, Key=f"job-1/{LEASE_FILE}", Body=b"{torn")
    with pytest.raises(LeaseHeldError, match="an unknown holder .its lease file is unreadable."):
        with store.lease("new", wait_s=0.3):
            pass
    with store.lease("new", break_lease=True):
        assert store.read()["job_id"] == "new"


def test_release_never_removes_the_lease_of_another_holder(store):
    first = store.lease("first")
    first.__enter__()
    with store.lease("second", break_lease=True):          # `first` was judged gone by a user
        first.__exit__(None, None, None)
        assert store.read()["job_id"] == "second"
    assert store.read() is None


# ---- a storage that holds a job -------------------------------------------------------------------------------

def _job_record(job_id: str) -> str:
    return json.dumps({"job_id": job_id, "job": {"model": {}}})


def _manifest(step: int) -> bytes:
    from autohet_ray.checkpoint import ChunkRecord, Manifest
    from autohet_ray.layout import Chunk
    record = ChunkRecord(step=step, name="w", global_shape=(2,), chunk=Chunk.whole((2,)), dtype="float32",
                         digest="xxh3-64:0", nbytes=8, replicas=("cloud",))
    return Manifest(step=step, records=(record,)).to_json()


def _snapshot(store) -> dict:
    if store.kind == "dir":
        root = pathlib.Path(store.url)
        return {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.read_bytes()) for p in root.rglob("*")
                if p.is_file()}
    listed = store.client.list_objects_v2(Bucket=store.bucket).get("Contents", [])
    return {o["Key"]: (o["ETag"], o["LastModified"]) for o in listed}


def _put(store, name: str, body: bytes) -> None:
    if store.kind == "dir":
        path = pathlib.Path(store.url) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)
    else:
        store.client.put_object(Bucket=store.bucket, Key=f"job-1/{name}", Body=body)


@pytest.mark.parametrize("job_file, steps, holds", [
    (True, [1, 3], "job abc123 (newest committed step 3)"),
    (True, [], "job abc123 (no committed step yet)"),
    (False, [2], "a job without job.json (newest committed step 2)")])
def test_a_storage_that_holds_a_job_is_refused_untouched(store, job_file, steps, holds):
    from autohet_ray.job.record import refuse_existing_job
    if job_file:
        _put(store, "job.json", _job_record("abc123").encode())
    for step in steps:
        _put(store, f"manifests/step-{step:010d}.json", _manifest(step))
    before = _snapshot(store)
    with pytest.raises(ConfigError) as err:
        refuse_existing_job(store.spec, store.url)
    assert str(err.value) == (f"storage {store.url!r} already holds {holds}; continue it with `autohet resume "
                              f"--storage {store.url}`, or give another --storage for a new job")
    assert _snapshot(store) == before


def test_an_empty_or_missing_storage_is_free(store):
    from autohet_ray.job.record import refuse_existing_job
    refuse_existing_job(store.spec, store.url)
    if store.kind == "dir":
        assert not os.path.exists(store.url)             # the check makes nothing
        os.makedirs(store.url)
        (pathlib.Path(store.url) / "notes.txt").write_text("mine")
        refuse_existing_job(store.spec, store.url)
    assert store.read() is None
