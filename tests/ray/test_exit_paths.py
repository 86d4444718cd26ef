"""Every exit path of an elastic job keeps its newest committed step, and `autohet resume` continues from it with
the losses of an uninterrupted run: Ctrl-C (SIGINT) in the middle of a step and SIGTERM at a step boundary (the
real `autohet train` process, on this test's emulated cluster), an exception inside a step, and a second node
lost while the job recovers from a first. (A normal end at a step that is no multiple of --checkpoint-every:
tests/ray/test_recovery.py::test_resume_cli_restarts_a_stopped_job_from_its_storage.)"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

ray = pytest.importorskip("ray")

from autohet_ray.cli import main  # noqa: E402
from autohet_ray.storage.spec import storage_spec  # noqa: E402
from autohet_ray.model.spec import load_model  # noqa: E402
from autohet_ray.orchestrate.controller import Controller  # noqa: E402
from autohet_ray.job.config import TrainJob  # noqa: E402
from ray_helpers import (FAST_HEALTH_CHECKS, THREE_NODES, asymmetric_plan,  # noqa: E402
                         reference_losses)
from shared_clusters import shared_cluster  # noqa: E402

pytestmark = pytest.mark.timeout(400)
SPEC = load_model("tiny-gpt")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FOUR_NODES = THREE_NODES | {"name": "four-node", "nodes": [*THREE_NODES["nodes"],
                                                          {"name": "d", "device": "H20", "count": 1}]}


cluster = shared_cluster(FOUR_NODES, system_config=FAST_HEALTH_CHECKS, changes_nodes=True)


def resume(storage: str, steps: int, capsys) -> dict:
    capsys.readouterr()
    assert main(["resume", "--storage", storage, "--steps", str(steps), "--json"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def store_dirs(job_id: str) -> list[str]:
    from autohet_ray.checkpoint.node_store import default_store_root
    root = os.path.join(default_store_root(), job_id)
    return os.listdir(root) if os.path.isdir(root) else []


def check_resumed(out: dict, restored: int, steps: int) -> None:
    ref = reference_losses(steps)
    assert out["resumed_from"] == restored and out["skipped_chunks"] == []
    assert [s["step"] for s in out["steps"]] == list(range(restored + 1, steps + 1))
    assert [s["loss"] for s in out["steps"]] == pytest.approx(ref[restored:steps], rel=1e-6)


def train_process(cluster, tmp_path, storage: str) -> subprocess.Popen:
    """`autohet train --elastic` on this test's cluster, paced so that a step lasts about a second."""
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(THREE_NODES))
    (tmp_path / "plan.json").write_text(json.dumps(asymmetric_plan()))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    cmd = [sys.executable, "-m", "autohet_ray.cli", "train", "--elastic", "--cluster", str(tmp_path / "cluster.yaml"),
           "--model", "tiny-gpt", "--global-batch", "4", "--steps", "20", "--checkpoint-every", "2",
           "--plan", str(tmp_path / "plan.json"), "--storage", storage, "--address", cluster.address,
           "--dtype", "float64", "--emulate", "--iteration-wall-s", "1.0"]
    return subprocess.Popen(cmd, cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def signal_after_step(proc: subprocess.Popen, step: int, signum: int, delay_s: float) -> tuple[list[str], int]:
    """Send `signum` `delay_s` after the progress line of `step`; the output and the last step it printed."""
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if f"step {step}/20:" in line:
            time.sleep(delay_s)
            proc.send_signal(signum)
            break
    rest, _ = proc.communicate(timeout=120)
    lines += rest.splitlines(keepends=True)
    done = [int(line.split("step ")[1].split("/")[0]) for line in lines if "/20: loss" in line]
    return lines, max(done)


@pytest.mark.parametrize("signum, delay_s", [(signal.SIGINT, 0.5), (signal.SIGTERM, 0.0)],
                         ids=["sigint-during-a-step", "sigterm-at-a-step-boundary"])
def test_signal_keeps_the_newest_committed_step(cluster, tmp_path, capsys, signum, delay_s):
    storage = str(tmp_path / "storage")
    proc = train_process(cluster, tmp_path, storage)
    lines, last = signal_after_step(proc, 3, signum, delay_s)
    output = "".join(lines)
    assert proc.returncode in (130, 128 + signal.SIGTERM), output[-3000:]
    assert last == 3, output[-3000:]                 # step 4 was cut short (SIGINT) or never started (SIGTERM)
    assert f"committed step 3 is in {storage}" in output, output[-3000:]   # 3 is no checkpoint step: copied
    job_id = json.loads((tmp_path / "storage" / "job.json").read_text())["job_id"]
    assert store_dirs(job_id) == []                  # node stores removed only once step 3 was safe
    check_resumed(resume(storage, 5, capsys), 3, 5)


def elastic_job(storage: str, **kw) -> TrainJob:
    base = dict(model=SPEC.to_dict(), cluster=THREE_NODES, global_batch=4, storage=storage_spec(storage),
                elastic=True, dtype="float64", checkpoint_every=2, collective_timeout_s=30, detect_timeout_s=30,
                plan=asymmetric_plan(), baselines=False)
    return TrainJob(**(base | kw))


def test_exception_inside_a_step_keeps_the_newest_committed_step(cluster, tmp_path, capsys):
    storage = str(tmp_path / "storage")
    ctl = Controller(elastic_job(storage))

    def fail(_controller):
        raise RuntimeError("a bug in the driver, in the middle of step 4")
    try:
        ctl.start()
        for _ in range(3):
            ctl.step()
        with pytest.raises(RuntimeError, match="a bug in the driver"):
            ctl.step(fault_hook=fail)
    finally:
        secured = ctl.close()
    assert secured["step"] == 3 and store_dirs(ctl.job_id) == []
    check_resumed(resume(storage, 5, capsys), 3, 5)


def test_second_node_lost_during_recovery_is_recovered_too(cluster, tmp_path, capsys, monkeypatch):
    """Node b is lost in step 4; while the job restores step 3 on the nodes left, a second node of the new plan
    is lost too: the second loss is handled like the first, and nothing committed is lost (three copies of
    every chunk: num_peers=2)."""
    from autohet_ray.orchestrate import live_job as live_job_module
    storage = str(tmp_path / "storage")
    ctl = Controller(elastic_job(storage, cluster=FOUR_NODES, num_peers=2))
    handles, second, newest_at_restore = {}, [], []
    real_restore = live_job_module.restore_newest

    def restore_but_lose_another_node_first(group, *args, **kw):
        if not second:                                      # node a is the head: this process's own node
            newest_at_restore.append(max(ctl.committer.committed))
            second.append(min(s["node"] for s in group.slots if s["node"] != "a"))
            remove_and_wait_until_dead(cluster, handles.pop(second[0]))
        return real_restore(group, *args, **kw)

    def lose_b(controller):
        controller.mark_fault()
        cluster.remove_node(handles.pop("b"), allow_graceful=False)
    try:
        ctl.start()
        handles.update(node_handles(cluster, ctl))
        losses = [ctl.step()["loss"] for _ in range(3)]
        monkeypatch.setattr(live_job_module, "restore_newest", restore_but_lose_another_node_first)
        first = ctl.step(fault_hook=lose_b)
        losses += [first["loss"], ctl.step()["loss"]]
    finally:
        secured = ctl.close()
    rec = first["recovery"]
    # step 3's commit runs beside step 4, as b goes: it lands (b's worker answered first) or not
    committed = newest_at_restore[0]
    assert committed in (2, 3)
    assert rec["rounds"] == 2 and rec["lost_nodes"] == second and rec["earlier_rounds"][0]["lost_nodes"] == ["b"]
    assert not any(stage.startswith(("b:", f"{second[0]}:")) for p in rec["plan"] for stage in p), rec["plan"]
    assert rec["restored_step"] == committed and rec["skipped_chunks"] == []      # nothing committed is lost
    assert rec["lost_steps"] == 3 - committed
    ref = reference_losses(committed + 2)
    assert losses[:3] == pytest.approx(ref[:3], rel=1e-6)
    assert losses[3:] == pytest.approx(ref[committed:committed + 2], rel=1e-6)
    assert secured["step"] == committed + 2
    check_resumed(resume(storage, committed + 3, capsys), committed + 2, committed + 3)


def remove_and_wait_until_dead(cluster, node, timeout_s: float = 120.0) -> None:
    """Kill a node's raylet and wait until Ray marks the node dead. Without the wait, a restore that starts at
    once can still reach the node's workers (they exit a moment after their raylet) and succeed: the loss then
    shows up one step later instead of during the restore."""
    cluster.remove_node(node, allow_graceful=False)
    deadline = time.monotonic() + timeout_s
    while any(n["NodeID"] == node.node_id and n["Alive"] for n in ray.nodes()):
        assert time.monotonic() < deadline, f"node {node.node_id} still alive {timeout_s} s after its removal"
        time.sleep(0.2)


def node_handles(cluster, ctl) -> dict:
    ids = {node_id: name for name, node_id in ctl.found.node_ids.items()}
    return {ids[n.node_id]: n for n in cluster.list_all_nodes() if n.node_id in ids}
