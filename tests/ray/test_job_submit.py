"""`ray start --head` (an emulated GPU node) + `ray job submit --working-dir . -- python jobs/train.py` end to end, with
a cluster file of node types only (jobs/local-1.yaml) on a node that carries no autohet.io/node label, as an
autoscaler's nodes do: discovery finds it by its accelerator label and GPUs and names it by its Ray node id.

The head runs with `--block` and is stopped by SIGTERM to that process (it drains and stops its own processes)
rather than `ray stop`, which would stop every Ray cluster of this user on the machine.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from autoscaling_cluster import free_port

pytestmark = pytest.mark.timeout(240)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)
LABELS = "ray.io/accelerator-type=H800,autohet.io/emulated=true"          # no node name


def _wait_http(url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        assert proc.poll() is None, "ray start --head exited early"
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except urllib.error.HTTPError:
            return                # it answers (401 when Ray token auth is on: the job CLI sends the token)
        except OSError:
            time.sleep(0.25)
    raise TimeoutError(f"{url} did not answer in {timeout_s} s")


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("head")
    gcs, dash, client, agent = free_port(), free_port(), free_port(), free_port()
    env = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}")     # `python` in the job = this venv's python
    env.pop("RAY_ADDRESS", None)
    env["RAY_AUTH_MODE"] = "disabled"     # a ~/.ray/auth_token left by another local cluster must not turn it on
    log = open(tmp_path / "head.log", "w")
    proc = subprocess.Popen([f"{BIN}/ray", "start", "--head", f"--port={gcs}", "--num-cpus=1", "--num-gpus=2",
                             f"--labels={LABELS}", "--include-dashboard=true", "--dashboard-host=127.0.0.1",
                             f"--dashboard-port={dash}", f"--ray-client-server-port={client}",
                             f"--dashboard-agent-listen-port={agent}", "--block"],
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    address = f"http://127.0.0.1:{dash}"
    try:
        _wait_http(f"{address}/api/version", proc, 90)
        yield address, env | {"RAY_ADDRESS": f"127.0.0.1:{gcs}"}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def test_ray_job_submit_train_end_to_end(ray_head):
    from ray.job_submission import JobStatus, JobSubmissionClient
    address, env = ray_head
    env = {k: v for k, v in env.items() if k != "RAY_ADDRESS"}
    cmd = [f"{BIN}/ray", "job", "submit", "--address", address, "--submission-id", "autohet-e2e", "--no-wait",
           "--working-dir", ".", "--", "python", "jobs/train.py", "--cluster", "jobs/local-1.yaml", "--model",
           "tiny-gpt", "--global-batch", "4", "--steps", "2", "--micro-batch", "1", "--emulate",
           "--time-scale", "20", "--plan-time-limit-s", "5", "--json"]
    submitted = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    client = JobSubmissionClient(address)
    deadline = time.time() + 180
    while (status := client.get_job_status("autohet-e2e")) not in (JobStatus.SUCCEEDED, JobStatus.FAILED,
                                                                   JobStatus.STOPPED):
        assert time.time() < deadline, "the job did not finish in 180 s"
        time.sleep(0.5)
    logs = client.get_job_logs("autohet-e2e")
    assert status == JobStatus.SUCCEEDED, logs[-3000:]
    assert "step 2/2: loss" in logs and "(emulated" in logs and '"emulated": true' in logs
    assert re.search(r"\b[0-9a-f]{56}\b", logs)      # the plan's node, named by its Ray node id


def test_a_node_type_that_matches_no_live_node_is_one_line_exit_2(ray_head, tmp_path):
    _, env = ray_head
    (tmp_path / "spot.yaml").write_text("name: spot\ntypes: [{name: h800-spot, device: H800, count: 2, spot: true, "
                                        "max: 1}]\n")      # the live H800 node is on-demand (no market label)
    out = subprocess.run([sys.executable, "-m", "autohet_ray.cli", "train", "--cluster", str(tmp_path / "spot.yaml"),
                          "--model", "tiny-gpt", "--global-batch", "4", "--steps", "1", "--emulate",
                          "--storage", str(tmp_path / "run")], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2, out.stderr[-3000:]
    lines = [line for line in out.stderr.splitlines() if line.startswith("autohet train: error:")]
    assert len(lines) == 1 and "no live Ray node matches a node type" in lines[0], out.stderr[-3000:]
    assert "'h800-spot' (2x H800, spot: nodes with ray.io/accelerator-type=H800, ray.io/market-type=spot" in lines[0]
