"""`autohet train --storage`: a directory or S3 (a real S3 API server on loopback)."""
import pathlib
import sys

import boto3
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from autohet_ray import ConfigError  # noqa: E402
from autohet_ray.orchestrate.job import job_from_dict  # noqa: E402
from autohet_ray.orchestrate.job_storage import write_text  # noqa: E402
from s3_server import CREDENTIALS, moto_endpoint  # noqa: E402


def test_directory_storage(tmp_path):
    where = write_text(str(tmp_path / "run"), "plan.json", "{}")
    assert pathlib.Path(where).read_text() == "{}"
    assert not list((tmp_path / "run").glob("*.tmp"))


def test_s3_storage(monkeypatch):
    for key, value in CREDENTIALS.items():
        monkeypatch.setenv({"aws_access_key_id": "AWS_ACCESS_KEY_ID", "aws_secret_access_key": "AWS_SECRET_ACCESS_KEY",
                            "region_name": "AWS_DEFAULT_REGION"}[key], value)
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
