"""S3 specifics against a real S3 API (moto server): an uploader killed with SIGKILL mid-multipart leaves
an invisible, dangling upload that the sweep removes."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autohet_ray.checkpoint.tiers.s3 import S3Config, S3Tier

TESTS = Path(__file__).resolve().parents[1]
from s3_server import client, moto_endpoint, new_bucket  # noqa: E402

UPLOADER = """
import sys, time
from s3_server import client
from autohet_ray.checkpoint.faults import Faults
from autohet_ray.checkpoint.tiers.s3 import MiB, S3Config, S3Tier

url, bucket, marker = sys.argv[1:4]

def stall_after_first_part():
    open(marker, "w").close()
    time.sleep(300)                      # the parent kills us here

config = S3Config(bucket=bucket, prefix="job/", endpoint_url=url, multipart_threshold=5 * MiB,
                  part_size=5 * MiB, num_upload_threads=1)
tier = S3Tier(config, client=client(url), faults=Faults({"upload_part": (1, stall_after_first_part)}))
tier.put_chunk("step-0000000007/layers.0.big/0-1", bytes(11 * MiB))
"""


@pytest.fixture(scope="module")
def s3_url():
    with moto_endpoint() as url:
        yield url


@pytest.mark.cli
def test_sigkill_mid_multipart_leaves_an_upload_the_sweep_removes(s3_url, tmp_path):
    bucket = new_bucket(s3_url)
    marker = tmp_path / "first-part-done"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)])}
    proc = subprocess.Popen([sys.executable, "-c", UPLOADER, s3_url, bucket, str(marker)], env=env)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert proc.poll() is None, f"uploader exited early with {proc.returncode}"
            assert time.monotonic() < deadline, "uploader never finished its first part"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
    tier = S3Tier(S3Config(bucket=bucket, prefix="job/", endpoint_url=s3_url), client=client(s3_url))
    assert tier.list() == []                                          # nothing visible
    assert tier.pending_multipart() == ["step-0000000007/layers.0.big/0-1"]
    # (moto reports a fixed 2010 "Initiated" time, so only the step rule is checked for "keep")
    assert tier.sweep_multipart(through_step=6) == []                 # step 7 may still be written
    assert tier.sweep_multipart(through_step=7) == ["step-0000000007/layers.0.big/0-1"]
    assert tier.pending_multipart() == []
    client(s3_url).create_multipart_upload(Bucket=bucket, Key="job/step-0000000009/x/s")
    assert tier.sweep_multipart(older_than_s=0) == ["step-0000000009/x/s"]      # the age rule
