"""The fault matrix's `ray job stop` row (see test_fault_matrix.py): a job submitted with `ray job submit` to a
2-node cluster that `ray start` made, as users run it (tests/ray/test_job_submit.py), then stopped."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest
import yaml

from test_fault_matrix import REPO, newest_anywhere

pytestmark = pytest.mark.timeout(600)


TWO_NODES = {"name": "two-node", "nodes": [{"name": "a", "device": "H800", "count": 1},
                                           {"name": "b", "device": "H800", "count": 1}]}


def two_node_plan() -> dict:
    """One single-stage pipeline on each node."""
    from ray_helpers import stage
    return {"schema_version": 1, "model": "tiny-gpt", "global_batch": 4, "micro_batch": 1, "seq_len": 16,
            "pipelines": [{"num_microbatches": 2, "stages": [stage((0, 4), 1, "H800", node, (0,))]}
                          for node in ("a", "b")]}


def ray_start(env: dict, log, *args: str) -> subprocess.Popen:
    from test_job_submit import BIN
    return subprocess.Popen([f"{BIN}/ray", "start", "--num-cpus=1", "--num-gpus=1", *args, "--block"], env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def labels(node: str) -> str:
    return f"--labels=ray.io/accelerator-type=H800,autohet.io/node={node},autohet.io/emulated=true"


def wait_for_nodes(dashboard: str, names: set[str], procs, timeout_s: float) -> None:
    """Wait until the cluster lists these nodes (by autohet node label) alive."""
    from ray.util.state import list_nodes
    deadline = time.time() + timeout_s
    while not names <= {n.labels.get("autohet.io/node")
                        for n in list_nodes(address=dashboard, filters=[("state", "=", "ALIVE")])}:
        assert all(proc.poll() is None for proc in procs), "a `ray start` exited early"
        assert time.time() < deadline, f"nodes {sorted(names)} not alive after {timeout_s} s"
        time.sleep(0.5)


@pytest.fixture
def two_node_ray_head(tmp_path):
    """`ray start --head` (node a, with the job server) and `ray start --address` (node b), as users run them."""
    from autoscaling_cluster import free_port
    from test_job_submit import BIN, _wait_http
    gcs, dash, client, agent = free_port(), free_port(), free_port(), free_port()
    env = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}", RAY_AUTH_MODE="disabled")
    env.pop("RAY_ADDRESS", None)
    log = open(tmp_path / "ray.log", "w")
    procs = [ray_start(env, log, "--head", f"--port={gcs}", labels("a"), "--include-dashboard=true",
                       "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}", f"--ray-client-server-port={client}",
                       f"--dashboard-agent-listen-port={agent}")]
    # Node b gets a temp dir of its own: nodes sharing one unpack the job's working dir at the same path, and
    # node b's agent replaces it (rmtree, unzip) when node b first needs it, under a worker starting on node a.
    # A short path: Ray's socket paths under it must stay within the Unix limit.
    temp_b = tempfile.mkdtemp(prefix="ray-b-")
    try:
        _wait_http(f"http://127.0.0.1:{dash}/api/version", procs[0], 120)
        procs.append(ray_start(env, log, f"--address=127.0.0.1:{gcs}", labels("b"), f"--temp-dir={temp_b}"))
        wait_for_nodes(f"http://127.0.0.1:{dash}", {"a", "b"}, procs, 120)    # the job's plan needs both
        yield f"http://127.0.0.1:{dash}", f"127.0.0.1:{gcs}", env
    finally:
        for proc in reversed(procs):             # each `ray start --block` stops its own processes on SIGTERM
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        log.close()
        shutil.rmtree(temp_b, ignore_errors=True)


def test_ray_job_stop(two_node_ray_head, tmp_path):
    """`ray job stop` on a submitted job: SIGTERM, then SIGKILL 3 s later. Before that, the job has printed
    where its newest step is and the resume command; `autohet resume` on the same cluster continues from the
    newest step committed anywhere."""
    from ray.job_submission import JobStatus, JobSubmissionClient
    from test_job_submit import BIN
    address, gcs, env = two_node_ray_head
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(TWO_NODES))
    (tmp_path / "plan.json").write_text(json.dumps(two_node_plan()))
    storage = str(tmp_path / "storage")
    submit = [f"{BIN}/ray", "job", "submit", "--address", address, "--submission-id", "autohet-stop", "--no-wait",
              "--working-dir", ".", "--", "python", "jobs/train.py", "--elastic", "--cluster",
              str(tmp_path / "cluster.yaml"), "--plan", str(tmp_path / "plan.json"), "--model", "tiny-gpt",
              "--global-batch", "4", "--steps", "30", "--checkpoint-every", "2", "--storage", storage,
              "--dtype", "float64", "--emulate", "--iteration-wall-s", "1.0"]
    done = subprocess.run(submit, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    client = JobSubmissionClient(address)
    deadline = time.time() + 240
    while "step 3/30:" not in (logs := client.get_job_logs("autohet-stop")):
        assert client.get_job_status("autohet-stop") in (JobStatus.PENDING, JobStatus.RUNNING), logs[-3000:]
        assert time.time() < deadline, logs[-3000:]
        time.sleep(0.5)
    stop = subprocess.run([f"{BIN}/ray", "job", "stop", "--address", address, "autohet-stop"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert stop.returncode == 0, stop.stderr[-3000:]
    assert client.get_job_status("autohet-stop") == JobStatus.STOPPED
    logs = client.get_job_logs("autohet-stop")
    # the newest step may be a storage step (every 2nd) or not: both are the truth, each with its copy count
    key = re.search(r"autohet: SIGTERM: committed step (\d+) is in node stores keeper-a, keeper-b( and the storage "
                    r"\S+)? \((\d) copies of each chunk at least\); if this process is killed now, `autohet resume "
                    rf"--storage {re.escape(storage)} --steps 30` continues from it", logs)
    assert key is not None, logs[-4000:]
    assert int(key.group(3)) == (3 if key.group(2) else 2), key.group(0)
    newest = newest_anywhere(storage)
    assert newest == int(key.group(1))              # what it printed is the newest step committed anywhere
    resumed = subprocess.run([sys.executable, "-m", "autohet_ray.cli", "resume", "--storage", storage, "--steps",
                              str(newest + 1), "--address", gcs, "--json"], cwd=REPO, env=env, capture_output=True,
                             text=True, timeout=240)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    out = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert out["resumed_from"] == newest and [s["step"] for s in out["steps"]] == [newest + 1]
    print(f"\nMATRIX ray job stop | {newest} | {out['resumed_from']} | STOPPED | {key.group(0)}")
