"""The fault matrix: each way an elastic `autohet train` can end, and what it leaves. Every row asserts the exit
code, the line that tells the user what happened, and that `autohet resume` restores the newest step committed
anywhere (the storage or a node store, read from the files themselves before the resume). The rows share one
emulated 3-node cluster; `ray job stop` gets its own `ray start` cluster: test_fault_matrix_job_stop.py.
Each row prints `MATRIX row | newest committed | restored | exit code | key line` (pytest -s shows it)."""
from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import yaml

ray = pytest.importorskip("ray")

from autohet_ray.cli import main  # noqa: E402
from autohet_ray.orchestrate.controller import Controller  # noqa: E402
from ray_helpers import FAST_HEALTH_CHECKS, THREE_NODES, asymmetric_plan  # noqa: E402
from shared_clusters import shared_cluster  # noqa: E402

pytestmark = pytest.mark.timeout(400)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MANIFEST = re.compile(r"step-(\d{10})\.json$")


cluster = shared_cluster(THREE_NODES, system_config=FAST_HEALTH_CHECKS)


def job_files(tmp_path) -> tuple[str, str]:
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(THREE_NODES))
    (tmp_path / "plan.json").write_text(json.dumps(asymmetric_plan()))
    return str(tmp_path / "cluster.yaml"), str(tmp_path / "plan.json")


def train_args(tmp_path, storage: str, steps: int, *extra: str) -> list[str]:
    cluster_file, plan = job_files(tmp_path)
    return ["train", "--elastic", "--cluster", cluster_file, "--model", "tiny-gpt", "--global-batch", "4",
            "--steps", str(steps), "--checkpoint-every", "2", "--plan", plan, "--storage", storage,
            "--dtype", "float64", *extra]


def committed_steps(storage: str, job_id: str) -> dict[str, set[int]]:
    """Steps with a manifest, per place: "storage", and each node store of the job (read from the files)."""
    from autohet_ray.checkpoint.node_store import default_store_root
    places = {"storage": glob.glob(os.path.join(storage, "manifests", "*.json"))}
    for store in glob.glob(os.path.join(default_store_root(), job_id, "*")):
        places[os.path.basename(store)] = glob.glob(os.path.join(store, "manifests", "*.json"))
    return {place: {int(MANIFEST.search(f).group(1)) for f in files if MANIFEST.search(f)}
            for place, files in places.items()}


def newest_anywhere(storage: str) -> int:
    job_id = json.load(open(os.path.join(storage, "job.json")))["job_id"]
    return max(step for steps in committed_steps(storage, job_id).values() for step in steps)


def resume_in_process(storage: str, steps: int, capsys) -> tuple[int, dict, str]:
    capsys.readouterr()
    code = main(["resume", "--storage", storage, "--steps", str(steps), "--json"])
    captured = capsys.readouterr()
    return code, json.loads(captured.out.strip().splitlines()[-1]), captured.err


def check_row(name: str, storage: str, capsys, *, code: int, expected_code: int, output: str, key: str,
              note: str = "") -> None:
    """The exit code and key line of the stopped run, then resume: it restores the newest step committed
    anywhere and trains one more step."""
    assert code == expected_code, output[-4000:]
    line = next((line for line in output.splitlines() if key in line), None)
    assert line is not None, f"{key!r} not in:\n{output[-4000:]}"
    newest = newest_anywhere(storage)
    resumed_code, out, err = resume_in_process(storage, newest + 1, capsys)
    assert resumed_code == 0, err[-3000:]
    assert out["resumed_from"] == newest and [s["step"] for s in out["steps"]] == [newest + 1]
    print(f"\nMATRIX {name} | {newest} | {out['resumed_from']} | {code} | {line.strip()}{note}")


def train_in_process(args: list[str], capsys) -> tuple[int, str]:
    capsys.readouterr()
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_normal_end(cluster, tmp_path, capsys):
    storage = str(tmp_path / "storage")
    code, output = train_in_process(train_args(tmp_path, storage, 3), capsys)
    check_row("normal end", storage, capsys, code=code, expected_code=0, output=output,
              key=f"committed step 3 is in {storage}")
    assert newest_anywhere(storage) == 4            # the resume's own final step: no node store left behind


def train_process(tmp_path, storage: str, address: str) -> subprocess.Popen:
    """`autohet train --elastic` on this module's cluster, paced so that a step lasts about a second."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    cmd = [sys.executable, "-m", "autohet_ray.cli", *train_args(tmp_path, storage, 20), "--address", address,
           "--emulate", "--iteration-wall-s", "1.0"]
    return subprocess.Popen(cmd, cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def signal_after_step(proc: subprocess.Popen, step: int, signum: int, delay_s: float) -> tuple[str, dict]:
    """Send `signum` `delay_s` after the progress line of `step`; the whole output, and the seconds from the
    signal to each line printed after it."""
    lines, after = [], {}
    for line in proc.stdout:
        lines.append(line)
        if f"step {step}/20:" in line:
            time.sleep(delay_s)
            proc.send_signal(signum)
            sent = time.perf_counter()
            break
    for line in proc.stdout:
        lines.append(line)
        after.setdefault(line.strip(), time.perf_counter() - sent)
    proc.wait(timeout=120)
    return "".join(lines), after


@pytest.mark.parametrize("signum, delay_s", [(signal.SIGINT, 0.5), (signal.SIGTERM, 0.0), (signal.SIGHUP, 0.5)],
                         ids=["SIGINT", "SIGTERM", "SIGHUP"])
def test_stop_signal(cluster, tmp_path, capsys, signum, delay_s):
    """The newest step is secured in two node stores and printed with the resume command before the storage
    is tried; then it reaches the storage and the stores go."""
    storage = str(tmp_path / "storage")
    proc = train_process(tmp_path, storage, cluster.address)
    output, after = signal_after_step(proc, 3, signum, delay_s)
    name = signal.Signals(signum).name
    assert re.search(rf"autohet: {name}: committed step 3 is in node stores keeper-\w, keeper-\w.* \(2 copies "
                     rf"of each chunk at least\); if this process is killed now, `autohet resume --storage "
                     rf"{re.escape(storage)} --steps 20` continues from it", output), output[-4000:]
    secured_at = output.index(f"autohet: {name}: committed step 3")
    assert output.index(f"committed step 3 is in {storage}") > secured_at      # the storage only after that
    seconds = next(t for line, t in after.items() if line.startswith(f"autohet: {name}: committed step 3"))
    check_row(name, storage, capsys, code=proc.returncode, expected_code=128 + signum, output=output,
              key=f"autohet: {name}: committed step 3", note=f" (printed {seconds:.2f} s after the signal)")


def test_sigkill_of_the_driver(cluster, tmp_path, capsys):
    """Nothing runs on SIGKILL: the detached keepers keep the committed steps, and resume finds them."""
    storage = str(tmp_path / "storage")
    proc = train_process(tmp_path, storage, cluster.address)
    output, _ = signal_after_step(proc, 3, signal.SIGKILL, 0.5)
    job_id = json.load(open(os.path.join(storage, "job.json")))["job_id"]
    in_stores = {place: steps for place, steps in committed_steps(storage, job_id).items() if place != "storage"}
    assert len(in_stores) == 3 and all(steps & {2, 3} for steps in in_stores.values()), in_stores
    check_row("SIGKILL of the driver", storage, capsys, code=proc.returncode, expected_code=-signal.SIGKILL,
              output=output, key="step 3/20: loss")


def test_exception_in_a_worker(cluster, tmp_path, capsys, monkeypatch):
    """Step 4's batch holds a token id past the vocabulary: the worker's embedding raises, on a healthy
    cluster, so the job stops (no recovery into the same error) with step 3 secured, and says why."""
    from autohet_ray.data.training import TrainingData
    real_batch = TrainingData.batch

    def bad_fourth_batch(self, step):
        batch = real_batch(self, step)
        if step == 3:
            batch["input_ids"][0, 0] = self.model.vocab_size + 7
        return batch
    monkeypatch.setattr(TrainingData, "batch", bad_fourth_batch)
    storage = str(tmp_path / "storage")
    code, output = train_in_process(train_args(tmp_path, storage, 6), capsys)
    assert re.search(r"autohet: stopped: a step failed with every node and worker alive: .*rank \d", output), \
        output[-4000:]
    assert f"committed step 3 is in {storage}" in output and "done:" not in output
    monkeypatch.setattr(TrainingData, "batch", real_batch)
    check_row("exception in a worker", storage, capsys, code=code, expected_code=4, output=output,
              key="autohet: stopped: a step failed")


def block_storage(storage: str, steps: range) -> list[str]:
    """Make every chunk write of these steps fail: a plain file where the step's directory goes."""
    os.makedirs(storage, exist_ok=True)
    blockers = [os.path.join(storage, f"step-{step:010d}") for step in steps]
    for path in blockers:
        open(path, "w").close()
    return blockers


def test_storage_that_fails_every_upload(cluster, tmp_path, capsys):
    """Each upload fails and is printed as it happens; at the end the newest step is in the node stores only:
    the stores are kept, the message says where and how to resume, exit 3. Resume (the storage repaired)
    restores it from the node stores."""
    storage = str(tmp_path / "storage")
    blockers = block_storage(storage, range(1, 6))
    code, output = train_in_process(train_args(tmp_path, storage, 3), capsys)
    assert re.search(r"autohet: step 2: storage upload skipped \[tier \S+\]: rank \d: upload of step 2 failed",
                     output), output[-4000:]
    assert f"autohet: step 3 did not reach the storage {storage}" in output, output[-4000:]
    assert re.search(r"committed step 3 is in node stores keeper-a, keeper-b, keeper-c .*kept for job \w+ .*"
                     rf"`autohet resume --storage {re.escape(storage)}` continues from it", output), output[-4000:]
    assert "done:" not in output
    for path in blockers:
        os.remove(path)
    check_row("storage that fails every upload", storage, capsys, code=code, expected_code=3, output=output,
              key="did not reach the storage")


def test_plain_job_whose_final_commit_fails(cluster, tmp_path, capsys):
    """Without --elastic the storage is the only place: a failed final commit is printed (step, tier, reason),
    and the run exits 3 instead of saying "done"."""
    storage = str(tmp_path / "storage")
    block_storage(storage, range(1, 4))
    args = [a for a in train_args(tmp_path, storage, 3, "--checkpoint-every", "0") if a != "--elastic"]
    code, output = train_in_process(args, capsys)         # (the last --checkpoint-every counts: the end only)
    assert code == 3 and "done:" not in output, output[-4000:]
    assert re.search(r"autohet: step 3: commit of the newest step .*: .*rank \d: snapshot of step 3 failed: "
                     r"(NotADirectoryError|FileExistsError)", output), output[-4000:]
    assert f"autohet: step 3 did not reach the storage {storage}; the newest step there is None." in output
    assert "autohet: no step of this job was committed anywhere; `autohet train` starts it again." in output


def test_worker_that_dies_on_every_step(cluster, tmp_path, capsys, monkeypatch):
    """From step 4 on, a worker is killed in every step (before step 3's commit, which runs beside step 4, can
    land): each loss is recovered, from the newest committed step, until --max-recoveries 2; the third failure
    stops the job, its newest committed step secured, the failing rank and its error named."""
    real_step_once = Controller._step_once

    def kill_a_worker_from_step_4(self, fault_hook=None):
        if self.step_index >= 3:
            fault_hook = lambda ctl: ray.kill(ctl.group.actors[-1])     # noqa: E731
        return real_step_once(self, fault_hook)
    monkeypatch.setattr(Controller, "_step_once", kill_a_worker_from_step_4)
    storage = str(tmp_path / "storage")
    code, output = train_in_process(train_args(tmp_path, storage, 8, "--max-recoveries", "2"), capsys)
    failures = re.findall(r"autohet: step 4: rank \d failed: worker rank \d .* died: .*\(recovery (\d) of 2 "
                          r"without progress\)", output)
    assert failures == ["1", "2"] and "keeper of node" not in output, output[-4000:]
    assert re.search(r"autohet: stopped: 2 recoveries within 10 steps without progress \(the job reached step "
                     r"3\); failing rank (\d): worker rank \1 .* died: ", output), output[-4000:]
    assert re.search(rf"committed step [23] is in {storage}", output) and "done:" not in output
    monkeypatch.setattr(Controller, "_step_once", real_step_once)
    check_row("worker that dies on every step", storage, capsys, code=code, expected_code=4, output=output,
              key="autohet: stopped: 2 recoveries")

