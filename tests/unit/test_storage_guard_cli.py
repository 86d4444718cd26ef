"""The real `autohet` command (a subprocess; no Ray cluster starts in any of these): a storage that holds a job
is refused by `train` (a directory and a real S3 API server) untouched; the lease refuses a second run and
names the holder, is released when the run fails, and is broken by the flag or, for a holder that is gone,
by itself; crafted names in an index, a manifest, an HF index and job.json get one line and exit 2 while a
file outside stays unread and unwritten."""
import json
import os
import pathlib
import socket
import subprocess
import sys

import boto3
import pytest

from s3_server import CREDENTIALS, moto_endpoint, new_bucket  # noqa: E402
from crafted_inputs import Sentinel, crafted_names, hf_dir, index_with, manifest_with  # noqa: E402

pytestmark = [pytest.mark.cli, pytest.mark.timeout(300)]
REPO = pathlib.Path(__file__).resolve().parents[2]
CLUSTER = "jobs/local-3.yaml"
TRAIN = ["train", "--cluster", CLUSTER, "--model", "tiny-gpt", "--global-batch", "4", "--steps", "2",
         "--emulate"]
S3_ENV = {"AWS_ACCESS_KEY_ID": CREDENTIALS["aws_access_key_id"],
          "AWS_SECRET_ACCESS_KEY": CREDENTIALS["aws_secret_access_key"],
          "AWS_DEFAULT_REGION": CREDENTIALS["region_name"]}


def autohet(*args: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | (env_extra or {})
    return subprocess.run([sys.executable, "-m", "autohet_ray.cli", *args], cwd=REPO, text=True,
                          capture_output=True, timeout=240, env=env)


def one_error_line(done: subprocess.CompletedProcess, command: str) -> str:
    """The one stderr line of a refused command (exit 2, no traceback)."""
    assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"autohet {command}: error: "), done.stderr[-3000:]
    return lines[0][len(f"autohet {command}: error: "):]


def _manifest(step: int) -> bytes:
    from autohet_ray.checkpoint import ChunkRecord, Manifest
    from autohet_ray.layout import Chunk
    record = ChunkRecord(step=step, name="w", global_shape=(2,), chunk=Chunk.whole((2,)), dtype="float32",
                         digest="xxh3-64:0", nbytes=8, replicas=("cloud",))
    return Manifest(step=step, records=(record,)).to_json()


def job_files(job_id: str = "abc123", steps=(3,)) -> dict[str, bytes]:
    """The files of a job's storage: a real job record of tiny-gpt on local-3, and committed manifests."""
    from autohet_ray.cluster.spec import load_cluster
    from autohet_ray.job.config import job_from_dict
    from autohet_ray.model.spec import load_model
    from autohet_ray.storage.spec import storage_spec
    job = job_from_dict({"model": load_model("tiny-gpt").to_dict(), "global_batch": 4,
                         "cluster": load_cluster(str(REPO / CLUSTER)).to_dict(), "storage": storage_spec("x")})
    files = {"job.json": json.dumps({"job_id": job_id, "job": job.to_dict()}).encode()}
    return files | {f"manifests/step-{s:010d}.json": _manifest(s) for s in steps}


def write_dir(root: pathlib.Path, files: dict[str, bytes]) -> None:
    for name, body in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(body)


def tree(root: pathlib.Path) -> dict:
    """Every file and folder under `root`: its mtime, and a file's bytes."""
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.is_file() and p.read_bytes())
            for p in [root, *root.rglob("*")]}


# ---- a storage belongs to one job ----------------------------------------------------------------------------

def test_train_refuses_a_directory_that_holds_a_job_untouched(tmp_path):
    storage = tmp_path / "run"
    write_dir(storage, job_files())
    before = tree(storage)
    line = one_error_line(autohet(*TRAIN, "--seed", "5", "--storage", str(storage)), "train")
    assert line == (f"storage {str(storage)!r} already holds job abc123 (newest committed step 3); continue it "
                    f"with `autohet resume --storage {storage}`, or give another --storage for a new job")
    assert tree(storage) == before


def test_train_refuses_an_s3_storage_that_holds_a_job_untouched():
    with moto_endpoint() as endpoint:
        bucket = new_bucket(endpoint)
        s3 = boto3.client("s3", endpoint_url=endpoint, **CREDENTIALS)
        for name, body in job_files(steps=(1, 2)).items():
            s3.put_object(Bucket=bucket, Key=f"runs/one/{name}", Body=body)
        listing = lambda: [(o["Key"], o["ETag"], o["LastModified"])  # noqa: E731
                           for o in s3.list_objects_v2(Bucket=bucket)["Contents"]]
        before = listing()
        url = f"s3://{bucket}/runs/one"
        done = autohet(*TRAIN, "--storage", url, "--endpoint-url", endpoint, env_extra=S3_ENV)
        assert one_error_line(done, "train").startswith(f"storage {url!r} already holds job abc123 (newest "
                                                        "committed step 2); continue it with `autohet resume")
        assert listing() == before


def _lease(storage: pathlib.Path, **holder) -> None:
    record = {"host": socket.gethostname(), "pid": os.getpid(), "start": None, "boot_id": None,
              "job_id": "abc123", "since": 0.0, "since_utc": "2026-01-01 00:00:00", "token": "theirs", **holder}
    (storage / "lease.json").write_text(json.dumps(record))


def test_resume_takes_the_lease_and_releases_it_when_it_fails(tmp_path):
    storage = tmp_path / "run"
    write_dir(storage, job_files())
    line = one_error_line(autohet("resume", "--storage", str(storage), "--steps", "1"), "resume")
    assert line == "--steps 1 must exceed the committed step 3 the job resumes from"     # raised under the lease
    assert not (storage / "lease.json").exists()


def test_a_second_run_is_refused_naming_the_holder_until_the_flag_breaks_it(tmp_path):
    storage = tmp_path / "run"
    write_dir(storage, job_files())
    _lease(storage, host="elsewhere", pid=4242)                  # a resume running on another host
    line = one_error_line(autohet("resume", "--storage", str(storage), "--steps", "1"), "resume")
    assert line.startswith(f"storage {str(storage)!r} is in use by job abc123 (pid 4242 on elsewhere, since "
                           f"2026-01-01 00:00:00 UTC): its lease {storage / 'lease.json'} was not released within "
                           "10 s; wait for that run to end, or pass --break-lease if it is gone"), line
    assert json.loads((storage / "lease.json").read_text())["token"] == "theirs"
    done = autohet("resume", "--storage", str(storage), "--steps", "1", "--break-lease")
    assert done.returncode == 2 and done.stderr.splitlines()[0] == (
        f"autohet: broke the lease of job abc123 (pid 4242 on elsewhere, since 2026-01-01 00:00:00 UTC) on storage "
        f"{str(storage)!r} (broken by --break-lease)"), done.stderr
    assert not (storage / "lease.json").exists()


def test_a_lease_whose_holder_died_is_broken_by_itself(tmp_path):
    storage = tmp_path / "run"
    write_dir(storage, job_files())
    dead = subprocess.Popen(["true"])
    dead.wait()
    _lease(storage, pid=dead.pid)
    done = autohet("resume", "--storage", str(storage), "--steps", "1")
    assert done.returncode == 2 and done.stderr.splitlines()[0].endswith(
        f"({'no process %d runs on this host' % dead.pid})"), done.stderr
    assert not (storage / "lease.json").exists()


def test_train_waits_for_a_live_lease_and_is_refused(tmp_path):
    storage = tmp_path / "new"
    storage.mkdir()
    _lease(storage, start=None)                     # this test's own process: alive
    line = one_error_line(autohet(*TRAIN, "--storage", str(storage)), "train")
    assert line.startswith(f"storage {str(storage)!r} is in use by job abc123 (pid {os.getpid()} on "), line
    assert sorted(os.listdir(storage)) == ["lease.json"]


# ---- no input escapes its directory ----------------------------------------------------------------------------

def test_data_check_refuses_an_index_naming_files_outside(tmp_path):
    sentinel = Sentinel(tmp_path / "outside")
    data = tmp_path / "data"
    data.mkdir()
    for name in crafted_names(sentinel, data):
        (data / "index.json").write_text(json.dumps(index_with(name, sentinel.content)))
        with sentinel:
            line = one_error_line(autohet("data", "check", str(data)), "data")
        assert line.startswith(f"{data / 'index.json'}: shards[0].file {name!r} ") and sentinel.untouched(), line


def test_export_refuses_a_manifest_naming_chunks_outside(tmp_path):
    sentinel = Sentinel(tmp_path / "outside")
    for name in crafted_names(sentinel, tmp_path / "ckpt" / "step-0000000001"):
        manifest_with(tmp_path, name)
        (tmp_path / "ckpt" / "job.json").write_bytes(job_files()["job.json"])
        with sentinel:
            done = autohet("export", "--storage", str(tmp_path / "ckpt"), "--out", str(tmp_path / "hf"))
        line = one_error_line(done, "export")
        assert line.startswith(f"manifest manifests/step-0000000001.json in tier 'storage': tensor name {name!r}")
        assert sentinel.untouched() and not (tmp_path / "hf").exists()


def test_train_refuses_an_hf_index_naming_files_outside(tmp_path):
    from autohet_ray.nn.hf import INDEX_FILE
    hf = tmp_path / "hf"
    hf_dir(hf)
    index = json.loads((hf / INDEX_FILE).read_text())
    sentinel = Sentinel(tmp_path / "outside")
    tensor = sorted(index["weight_map"])[0]
    for name in crafted_names(sentinel, hf):
        (hf / INDEX_FILE).write_text(json.dumps({**index, "weight_map": {**index["weight_map"], tensor: name}}))
        with sentinel:
            done = autohet(*TRAIN, "--init-from", str(hf), "--storage", str(tmp_path / "run"))
        assert one_error_line(done, "train").startswith(f"{hf / INDEX_FILE}: weight_map[{tensor!r}] {name!r} ")
        assert sentinel.untouched()


def test_resume_refuses_a_job_id_naming_a_path_outside(tmp_path):
    sentinel = Sentinel(tmp_path / "outside")
    storage = tmp_path / "run"
    for job_id in crafted_names(sentinel, storage):
        write_dir(storage, job_files(job_id=job_id))
        with sentinel:
            line = one_error_line(autohet("resume", "--storage", str(storage), "--steps", "9"), "resume")
        assert line.startswith(f"{storage / 'job.json'}: job_id {job_id!r} ") and sentinel.untouched(), line
        assert not (storage / "lease.json").exists()
