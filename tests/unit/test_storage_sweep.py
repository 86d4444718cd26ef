"""What dead writers leave in a storage is swept, but only what is older than the job's start (a concurrent
writer's temporaries are safe): `.tmp-` files in a directory, abandoned multipart uploads on S3 (a real S3 API
server). On S3, metrics.jsonl is written as numbered parts and read back as one log."""
import os
import time

import pytest

from autohet_ray.storage.job_files import LineLog, read_lines
from autohet_ray.storage.spec import storage_spec
from autohet_ray.storage.sweep import StorageSweeper, sweep_or_warn

from s3_server import CREDENTIALS, client, moto_endpoint, new_bucket  # noqa: E402

ENV = {"aws_access_key_id": "AWS_ACCESS_KEY_ID", "aws_secret_access_key": "AWS_SECRET_ACCESS_KEY",
       "region_name": "AWS_DEFAULT_REGION"}


@pytest.fixture(scope="module")
def s3_url():
    with moto_endpoint() as url:
        yield url


@pytest.fixture
def credentials(monkeypatch):
    for key, value in CREDENTIALS.items():
        monkeypatch.setenv(ENV[key], value)


def test_directory_sweep_removes_only_temporaries_older_than_the_job_start(tmp_path, capsys):
    spec = storage_spec(str(tmp_path))
    (tmp_path / "step-0000000003" / "w").mkdir(parents=True)
    old = [tmp_path / ".job.json.tmp-dead", tmp_path / "step-0000000003" / "w" / ".0-4.tmp-dead"]
    for path in old:
        path.write_bytes(b"x")
        os.utime(path, (time.time() - 60, time.time() - 60))
    started_at = time.time() - 1
    young = tmp_path / ".plan.json.tmp-writing"              # a concurrent writer's, begun after the start
    young.write_bytes(b"y")
    (tmp_path / "job.json").write_text("{}")
    os.utime(tmp_path / "job.json", (time.time() - 60, time.time() - 60))       # old, but not a temporary
    sweeper = StorageSweeper(spec, started_at)
    removed = sweeper.at_start()
    assert removed == sorted(p.relative_to(tmp_path).as_posix() for p in old)
    assert young.exists() and (tmp_path / "job.json").exists() and not any(p.exists() for p in old)
    assert "removed 2 temporary files older than the job's start" in capsys.readouterr().err
    old[0].write_bytes(b"x")                                   # another dead writer's, from before the start
    os.utime(old[0], (started_at - 5, started_at - 5))
    assert sweeper.at_close() == [old[0].name] and young.exists()


def test_s3_sweep_aborts_only_multipart_uploads_from_before_the_job_start(s3_url, credentials, capsys):
    """moto dates every upload 2010-11-10, so the start aborts both older ones; an upload begun after the
    start (a concurrent writer's) survives the close, which aborts only those pending at the start."""
    bucket, s3 = new_bucket(s3_url), client(s3_url)
    spec = storage_spec(f"s3://{bucket}/run", endpoint_url=s3_url)
    for key in ("run/step-0000000002/w/0-4", "run/step-0000000002/v/0-4", "other/step-0000000002/w/0-4"):
        s3.create_multipart_upload(Bucket=bucket, Key=key)            # dead writers' (one of another storage)
    sweeper = StorageSweeper(spec, time.time())
    assert sweeper.at_start() == ["step-0000000002/v/0-4", "step-0000000002/w/0-4"]
    assert "removed 2 abandoned multipart uploads" in capsys.readouterr().err
    s3.create_multipart_upload(Bucket=bucket, Key="run/step-0000000003/w/0-4")       # a live writer's
    assert sweeper.at_close() == []
    left = sorted(u["Key"] for u in s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []))
    assert left == ["other/step-0000000002/w/0-4", "run/step-0000000003/w/0-4"]


def test_s3_close_aborts_uploads_pending_since_before_the_start(s3_url, credentials):
    bucket, s3 = new_bucket(s3_url), client(s3_url)
    spec = storage_spec(f"s3://{bucket}/run", endpoint_url=s3_url)
    before = s3.create_multipart_upload(Bucket=bucket, Key="run/step-0000000001/w/0-4")["UploadId"]
    s3.create_multipart_upload(Bucket=bucket, Key="run/step-0000000004/w/0-4")      # begun after the start
    sweeper = StorageSweeper(spec, time.time())
    sweeper.pending_at_start = {before}          # what the start found pending but the server dated as recent
    assert sweeper.at_close() == ["step-0000000001/w/0-4"]
    assert [u["Key"] for u in s3.list_multipart_uploads(Bucket=bucket)["Uploads"]] == ["run/step-0000000004/w/0-4"]


def test_a_failed_sweep_is_one_line_and_not_the_end_of_the_job(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    spec = storage_spec(str(tmp_path / "file"))                  # gone bad since: now a file
    assert sweep_or_warn(StorageSweeper(spec, time.time()).at_close, spec, "close") == []
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"autohet: sweeping {tmp_path / 'file'}/ at close failed:")


def test_s3_metrics_are_numbered_parts_read_back_as_one_log(s3_url, credentials):
    bucket, s3 = new_bucket(s3_url), client(s3_url)
    spec = storage_spec(f"s3://{bucket}/run", endpoint_url=s3_url)
    lines = [f'{{"step": {i}, "loss": {1 / i}}}' for i in range(1, 11)]
    log = LineLog(spec, "metrics.jsonl", part_lines=4)
    for line in lines[:9]:
        log.append(line)
    LineLog(spec, "metrics.jsonl", part_lines=4).append(lines[9])                # a resumed job: a new part
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="run/")["Contents"]]
    assert keys == [f"run/metrics.jsonl.parts/{i:08d}" for i in range(4)]
    sizes = [len(s3.get_object(Bucket=bucket, Key=k)["Body"].read().splitlines()) for k in keys]
    assert sizes == [4, 4, 1, 1]                                                 # no object holds the whole log
    assert read_lines(spec, "metrics.jsonl") == lines
