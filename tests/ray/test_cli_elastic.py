"""`autohet train --elastic` then `autohet resume`: the losses of both runs equal those of an uninterrupted
single-process run (each run starts its own emulated cluster, in a subprocess)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ray_helpers import reference_losses

from autohet_ray.storage.job_files import read_metrics
from autohet_ray.storage.spec import storage_spec

pytestmark = pytest.mark.timeout(400)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMMON = ["--emulate", "--json"]
TRAIN = ["train", "--elastic", "--cluster", "jobs/local-3.yaml", "--model", "tiny-gpt", "--global-batch", "4",
         "--checkpoint-every", "2", "--iteration-wall-s", "1"]


def autohet(*args: str, env_extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}      # start an emulated cluster
    env.update(env_extra or {})
    done = subprocess.run([sys.executable, "-m", "autohet_ray.cli", *args, *COMMON], cwd=REPO, text=True,
                          capture_output=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_elastic_train_then_resume_matches_an_uninterrupted_run(tmp_path):
    first = autohet(*TRAIN, "--dtype", "float64", "--steps", "4", "--storage", str(tmp_path / "part"))
    assert first["storage_committed"] == [4]
    resumed = autohet("resume", "--storage", str(tmp_path / "part"), "--steps", "6")
    assert resumed["resumed_from"] == 4 and resumed["launch"]["bytes_by_tier"].get("storage", 0) > 0
    assert first["launch"]["time_scale"] > 0                        # --emulate paces the emulated devices
    target = first["launch"]["predicted_iteration_s"] * first["launch"]["time_scale"]
    assert all(s["wall_s"] >= 0.8 * target for s in first["steps"][1:]), (target, first["steps"])
    losses = [s["loss"] for s in first["steps"] + resumed["steps"]]
    assert losses == pytest.approx(reference_losses(6), rel=1e-6)


def test_elastic_needs_storage():
    done = subprocess.run([sys.executable, "-m", "autohet_ray.cli", *TRAIN, "--steps", "1"], cwd=REPO, text=True,
                          capture_output=True, timeout=120)
    assert done.returncode == 2 and "an elastic job needs storage" in done.stderr


def test_elastic_train_and_resume_through_s3(tmp_path, monkeypatch):
    import boto3
    from s3_server import CREDENTIALS, moto_endpoint, new_bucket
    creds = {"AWS_ACCESS_KEY_ID": CREDENTIALS["aws_access_key_id"],
             "AWS_SECRET_ACCESS_KEY": CREDENTIALS["aws_secret_access_key"],
             "AWS_DEFAULT_REGION": CREDENTIALS["region_name"]}
    with moto_endpoint() as endpoint:
        bucket = new_bucket(endpoint)
        url = f"s3://{bucket}/runs/one"
        first = autohet(*TRAIN, "--steps", "3", "--storage", url, "--endpoint-url", endpoint, env_extra=creds)
        assert first["storage_committed"] == [3] and first["secured"]["step"] == 3   # no checkpoint step: copied
        s3 = boto3.client("s3", endpoint_url=endpoint, **CREDENTIALS)
        parts = s3.list_objects_v2(Bucket=bucket, Prefix="runs/one/metrics.jsonl")["Contents"]
        assert [p["Key"] for p in parts] == ["runs/one/metrics.jsonl.parts/00000000"]   # no whole-log object
        for name, value in creds.items():
            monkeypatch.setenv(name, value)
        metrics = read_metrics(storage_spec(url, endpoint_url=endpoint))
        assert [m["step"] for m in metrics] == [1, 2, 3]
        resumed = autohet("resume", "--storage", url, "--endpoint-url", endpoint, "--steps", "4", env_extra=creds)
    assert resumed["resumed_from"] == 3 and resumed["launch"]["bytes_by_tier"]["storage"] > 0
    assert [s["step"] for s in resumed["steps"]] == [4]
