"""`autohet train --storage`: a directory or S3 (a real S3 API server on loopback)."""
import pathlib
import sys

import boto3
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from autohet_ray import ConfigError  # noqa: E402
from autohet_ray.orchestrate.elastic_tiers import check_storage, storage_spec  # noqa: E402
from autohet_ray.orchestrate.job import job_from_dict  # noqa: E402
from autohet_ray.orchestrate.job_storage import write_text  # noqa: E402
from s3_server import CREDENTIALS, moto_endpoint  # noqa: E402


def test_directory_storage(tmp_path):
    where = write_text(str(tmp_path / "run"), "plan.json", "{}")
    assert pathlib.Path(where).read_text() == "{}"
    assert not list((tmp_path / "run").glob("*.tmp"))


ENV = {"aws_access_key_id": "AWS_ACCESS_KEY_ID", "aws_secret_access_key": "AWS_SECRET_ACCESS_KEY",
       "region_name": "AWS_DEFAULT_REGION"}


def _credentials(monkeypatch):
    for key, value in CREDENTIALS.items():
        monkeypatch.setenv(ENV[key], value)


def test_s3_storage(monkeypatch):
    _credentials(monkeypatch)
    with moto_endpoint() as endpoint:
        s3 = boto3.client("s3", endpoint_url=endpoint, **CREDENTIALS)
        s3.create_bucket(Bucket="runs")
        where = write_text("s3://runs/job-1", "metrics.jsonl", '{"step": 1}\n', endpoint_url=endpoint)
        assert where == "s3://runs/job-1/metrics.jsonl"
        body = s3.get_object(Bucket="runs", Key="job-1/metrics.jsonl")["Body"].read()
        assert body == b'{"step": 1}\n'


@pytest.mark.parametrize("storage, fragment", [("gs://bucket/x", "unknown scheme"), ("s3://", "names no bucket")])
def test_bad_storage_is_rejected_before_anything_runs(storage, fragment):
    with pytest.raises(ConfigError, match=fragment):
        job_from_dict({"model": {}, "global_batch": 8, "steps": 1, "cluster": {}, "storage": storage})


def test_job_schedule_choice():
    job = {"model": {}, "global_batch": 8, "steps": 1, "cluster": {}}
    assert job_from_dict(job).schedules() == ("1f1b", "zb-h1")
    assert job_from_dict({**job, "schedule": "1f1b"}).schedules() == ("1f1b",)
    with pytest.raises(ConfigError, match="schedule='gpipe'; valid: auto, 1f1b, zb-h1"):
        job_from_dict({**job, "schedule": "gpipe"})


def test_unusable_storage_is_named_before_a_job_starts(monkeypatch, tmp_path):
    check_storage(storage_spec(str(tmp_path / "new" / "run")))          # made
    assert (tmp_path / "new" / "run").is_dir()
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="is not a directory"):
        check_storage(storage_spec(str(tmp_path / "file")))
    with pytest.raises(ConfigError, match="cannot be created"):
        check_storage(storage_spec(str(tmp_path / "file" / "run")))
    with pytest.raises(ConfigError, match="is not a directory"):
        check_storage(storage_spec(str(tmp_path / "absent")), create=False)
    _credentials(monkeypatch)
    with moto_endpoint() as endpoint:
        boto3.client("s3", endpoint_url=endpoint, **CREDENTIALS).create_bucket(Bucket="runs")
        check_storage(storage_spec("s3://runs/job-1", endpoint_url=endpoint))
        with pytest.raises(ConfigError, match=r"s3://nope/job-1/ at http.*: the bucket does not exist"):
            check_storage(storage_spec("s3://nope/job-1", endpoint_url=endpoint))
        for name in ENV.values():
            monkeypatch.delenv(name)
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
        monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
        monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
        with pytest.raises(ConfigError, match="no AWS credentials found"):
            check_storage(storage_spec("s3://runs/job-1", endpoint_url=endpoint))
    _credentials(monkeypatch)
    with pytest.raises(ConfigError, match="cannot reach the S3 endpoint"):         # the server is gone
        check_storage(storage_spec("s3://runs/job-1", endpoint_url=endpoint))
