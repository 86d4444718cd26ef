"""A storage belongs to one job, end to end with the real `autohet` command (each run starts its own emulated
cluster, in a subprocess): a finished job's storage refuses a second `train` and its newest step still exports
bit-exact; of two concurrent `resume`s one is refused naming the holder, and the lease is gone once the other
ends."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

import pytest
from safetensors.torch import load_file

pytestmark = pytest.mark.timeout(900)
REPO = pathlib.Path(__file__).resolve().parents[2]
TRAIN = ["train", "--cluster", "jobs/local-3.yaml", "--model", "tiny-gpt", "--global-batch", "4", "--emulate",
         "--checkpoint-every", "1", "--iteration-wall-s", "1"]


def _env() -> dict:
    return {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}      # each run starts its own cluster


def autohet(*args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autohet_ray.cli", *args], cwd=REPO, text=True,
                          capture_output=True, timeout=timeout, env=_env())


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> dict:
    """A finished job (2 steps, each committed to the storage): its storage and job id."""
    storage = tmp_path_factory.mktemp("guard") / "run"
    done = autohet(*TRAIN, "--steps", "2", "--storage", str(storage), "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    assert not (storage / "lease.json").exists()                         # released at the normal end
    return {"storage": storage, "job_id": json.loads((storage / "job.json").read_text())["job_id"]}


def _export(storage: pathlib.Path, out: pathlib.Path) -> dict[str, bytes]:
    done = autohet("export", "--storage", str(storage), "--step", "2", "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    return {p.name: p.read_bytes() for p in sorted(out.glob("*.safetensors"))}


def _tree(root: pathlib.Path) -> dict:
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.is_file() and p.read_bytes())
            for p in [root, *root.rglob("*")]}


def test_a_second_train_is_refused_and_the_first_job_still_exports_bit_exact(finished, tmp_path):
    storage = finished["storage"]
    before = _export(storage, tmp_path / "before")
    assert before
    files = _tree(storage)
    done = autohet(*TRAIN, "--steps", "2", "--seed", "5", "--storage", str(storage))
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        f"autohet train: error: storage {str(storage)!r} already holds job {finished['job_id']} (newest committed "
        f"step 2); continue it with `autohet resume --storage {storage}`, or give another --storage for a new "
        "job"], done.stderr[-3000:]
    assert _tree(storage) == files                                       # not one file created or touched
    after = _export(storage, tmp_path / "after")
    assert after == before                                               # bit-exact, file by file
    for name in before:
        tensors_before, tensors_after = load_file(tmp_path / "before" / name), load_file(tmp_path / "after" / name)
        assert tensors_before.keys() == tensors_after.keys()
        assert all(tensors_before[t].equal(tensors_after[t]) for t in tensors_before)


def _wait_for_lease(storage: pathlib.Path, pid: int, proc: subprocess.Popen, timeout_s: float = 120) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (storage / "lease.json").exists():
            holder = json.loads((storage / "lease.json").read_text())
            if holder["pid"] == pid:
                return holder
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        time.sleep(0.1)
    raise AssertionError("the first resume never took the lease")


def test_of_two_concurrent_resumes_one_is_refused_naming_the_holder(finished):
    storage = finished["storage"]
    first = subprocess.Popen([sys.executable, "-m", "autohet_ray.cli", "resume", "--storage", str(storage),
                              "--steps", "14", "--emulate", "--json"], cwd=REPO, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env())
    try:
        holder = _wait_for_lease(storage, first.pid, first)
        second = autohet("resume", "--storage", str(storage), "--steps", "20", "--emulate")
        assert first.poll() is None, "the first resume ended before the second was refused: no concurrency seen"
    finally:
        out, err = first.communicate(timeout=600)
    assert second.returncode == 2 and second.stderr.strip().splitlines() == [
        f"autohet resume: error: storage {str(storage)!r} is in use by job {finished['job_id']} (pid {first.pid} on "
        f"{holder['host']}, since {holder['since_utc']} UTC): its lease {storage / 'lease.json'} was not released "
        "within 10 s; wait for that run to end, or pass --break-lease if it is gone"], second.stderr[-3000:]
    assert first.returncode == 0, err[-3000:]
    assert json.loads(out.strip().splitlines()[-1])["resumed_from"] == 2
    assert not (storage / "lease.json").exists()                         # released at the normal end
