"""A job's storage (`autohet train --storage`): a directory or S3 (a real S3 API server on loopback): its files
are written atomically, read back, and metrics.jsonl grows a line at a time; bad storage and job values fail
before anything runs."""
import pathlib

import boto3
import pytest

from autohet_ray import ConfigError  # noqa: E402
from autohet_ray.storage.spec import check_storage, storage_spec  # noqa: E402
from autohet_ray.job.config import job_from_dict  # noqa: E402
from autohet_ray.storage.job_files import LineLog, read_lines, read_text, write_text  # noqa: E402
from s3_server import CREDENTIALS, moto_endpoint  # noqa: E402


def test_directory_storage(tmp_path):
    spec = storage_spec(str(tmp_path / "run"))
    where = write_text(spec, "plan.json", "{}")
    assert pathlib.Path(where).read_text() == "{}" and read_text(spec, "plan.json") == "{}"
    assert not list((tmp_path / "run").glob(".*tmp*")) and read_text(spec, "absent.json") is None
    log = LineLog(spec, "metrics.jsonl")
    log.append('{"step": 1}')
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == '{"step": 1}\n'     # durable after each line
    LineLog(spec, "metrics.jsonl").append('{"step": 2}')                         # a resumed job appends
    assert read_text(spec, "metrics.jsonl") == '{"step": 1}\n{"step": 2}\n'


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
        spec = storage_spec("s3://runs/job-1", endpoint_url=endpoint)
        where = write_text(spec, "plan.json", "{}")
        assert where == "s3://runs/job-1/plan.json" and read_text(spec, "nothing") is None
        LineLog(spec, "metrics.jsonl").append('{"step": 1}')
        LineLog(spec, "metrics.jsonl").append('{"step": 2}')                     # a resumed job: a new part
        assert read_lines(spec, "metrics.jsonl") == ['{"step": 1}', '{"step": 2}']
        body = s3.get_object(Bucket="runs", Key="job-1/metrics.jsonl.parts/00000001")["Body"].read()
        assert body == b'{"step": 2}\n'


@pytest.mark.parametrize("storage, fragment", [("gs://bucket/x", "unknown scheme"), ("s3://", "names no bucket")])
def test_bad_storage_is_rejected_before_anything_runs(storage, fragment):
    with pytest.raises(ConfigError, match=fragment):
        job_from_dict({"model": {}, "global_batch": 8, "cluster": {}, "storage": storage_spec(storage)})


def test_job_schedule_choice():
    job = {"model": {}, "global_batch": 8, "cluster": {}}
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


def test_job_rejects_bad_values():
    base = dict(model={}, cluster={}, global_batch=4, storage=storage_spec("/x"))
    with pytest.raises(ConfigError, match="global_batch=0"):
        job_from_dict(base | {"global_batch": 0})
    with pytest.raises(ConfigError, match="dtype='float16'; valid: float32, float64, bfloat16"):
        job_from_dict(base | {"dtype": "float16"})
    with pytest.raises(ConfigError, match="storage_spec"):
        job_from_dict(base | {"storage": "/x"})
    with pytest.raises(ConfigError, match="elastic job needs storage"):
        job_from_dict(base | {"storage": None, "elastic": True})
    with pytest.raises(ConfigError, match="loss_grace_s=0"):
        job_from_dict(base | {"loss_grace_s": 0})
    with pytest.raises(ConfigError, match="eval_every=5 needs data"):
        job_from_dict(base | {"eval_every": 5})
    with pytest.raises(ConfigError, match=r"unknown fields \['steps'\]"):
        job_from_dict(base | {"steps": 3})
