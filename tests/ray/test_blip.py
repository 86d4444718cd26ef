"""A blip is no loss, on a 3-node emulated Ray cluster: node b's raylet is paused (SIGSTOP) for 1 s in the middle
of a paced step of a few seconds; the step completes without GroupFailure and its loss equals the single-process
reference. A pause past the grace is a loss (named by the step's watch and by detect_failure), and a killed
raylet is one at once, long before the grace or Ray's health checks."""
from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

import pytest

ray = pytest.importorskip("ray")

from autohet_ray.cluster.node_probe import probe  # noqa: E402
from autohet_ray.elastic.liveness import detect_failure  # noqa: E402
from autohet_ray.emulate.pacer import PACED_OPS  # noqa: E402
from autohet_ray.model.spec import load_model  # noqa: E402
from autohet_ray.data.synthetic import synthetic_batch  # noqa: E402
from autohet_ray.cluster.labels import NODE_NAME_LABEL  # noqa: E402
from autohet_ray.orchestrate.worker_group import GroupFailure, WorkerGroup  # noqa: E402
from autohet_ray.plan.schema import plan_from_dict  # noqa: E402
from ray_helpers import THREE_NODES, asymmetric_plan, reference_losses  # noqa: E402
from shared_clusters import shared_cluster  # noqa: E402

pytestmark = pytest.mark.timeout(180)
SPEC = load_model("tiny-gpt")
# seconds per micro-batch forward and backward on every rank: a step of about 2-3 s
PACE = {"forward": 0.45, "backward": 0.45}
VICTIM, VICTIM_RANK = "b", 3          # pipeline 1's only stage (ranks: c, c, a, b); not the head node
three_node_cluster = shared_cluster(THREE_NODES, name="three_node_cluster", changes_nodes=True)


def live_node_ids() -> dict[str, str]:
    return {raw["Labels"][NODE_NAME_LABEL]: raw["NodeID"] for raw in ray.nodes() if raw["Alive"]}


def start_group(loss_grace_s: float) -> WorkerGroup:
    group = WorkerGroup(plan_from_dict(asymmetric_plan()), live_node_ids(), loss_grace_s=loss_grace_s)
    pacer = {"targets": {op: 0.0 for op in PACED_OPS} | PACE, "time_scale": 1.0}
    group.setup(model_spec=SPEC.to_dict(), seed=0, lr=1e-3, dtype="float64", collective_timeout_s=30,
                pacers=[pacer] * len(group.slots))
    return group


def train_step(group: WorkerGroup, step: int) -> float:
    batch = ray.put(synthetic_batch(vocab_size=SPEC.vocab_size, global_batch=4, seq_len=16, seed=0, step=step))
    return group.gather([a.train_step.remote(batch, snapshot=False) for a in group.actors])[0]["loss"]


def victim_node(cluster):
    (node,) = [n for n in cluster.list_all_nodes() if n.node_id == live_node_ids()[VICTIM]]
    return node


def wait_stopped(pid: int, timeout_s: float = 5.0) -> None:
    """Until every thread of `pid` is stopped (a signal is delivered asynchronously)."""
    deadline = time.monotonic() + timeout_s
    while any(open(f"/proc/{pid}/task/{tid}/stat").read().rsplit(")", 1)[1].split()[0] != "T"
              for tid in os.listdir(f"/proc/{pid}/task")):
        assert time.monotonic() < deadline, f"process {pid} did not stop"
        time.sleep(0.005)


@contextlib.contextmanager
def paused_raylet(cluster, group: WorkerGroup, *, after_s: float, for_s: float):
    """SIGSTOP the victim's raylet `after_s` from now, SIGCONT it `for_s` later or when the block ends, whichever
    comes first (and always on exit). Yields a record: stopped_at/resumed_at (monotonic), `probed` (a probe of
    the raylet while stopped) and `seen` (the group's watch's silence just before the SIGCONT)."""
    (raylet,) = victim_node(cluster).all_processes["raylet"]
    pid, address = raylet.process.pid, group.raylets[VICTIM]
    record, done = {}, threading.Event()

    def pause():
        if done.wait(after_s):
            return
        os.kill(pid, signal.SIGSTOP)
        wait_stopped(pid)
        record["stopped_at"] = time.monotonic()
        record["probed"] = probe(address)
        done.wait(max(0.0, record["stopped_at"] + for_s - time.monotonic()))
        record["seen"] = dict(group.node_watch.silent_s)
        os.kill(pid, signal.SIGCONT)
        record["resumed_at"] = time.monotonic()

    thread = threading.Thread(target=pause, daemon=True)
    thread.start()
    try:
        yield record
    finally:
        done.set()
        thread.join()
        os.kill(pid, signal.SIGCONT)


def test_a_one_second_raylet_pause_mid_step_is_no_loss(three_node_cluster):
    group = start_group(loss_grace_s=3.0)
    try:
        losses = [train_step(group, 0)]
        with paused_raylet(three_node_cluster, group, after_s=0.5, for_s=1.0) as pause:
            losses.append(train_step(group, 1))
            ended_at = time.monotonic()
    finally:
        group.kill()
    assert pause["resumed_at"] - pause["stopped_at"] >= 1.0 and pause["resumed_at"] < ended_at   # within the step
    assert pause["probed"] == "silent"                    # the pause was visible to a probe...
    assert pause["seen"].get(VICTIM, 0) > 0.4, pause      # ...and the step's watch saw it as a silence
    assert group.node_watch.silent_s == {}                # the raylet answers again
    assert losses == pytest.approx(reference_losses(2), rel=1e-9)


def test_a_pause_past_the_grace_is_a_loss(three_node_cluster):
    grace = 1.0
    group = start_group(loss_grace_s=grace)
    try:
        with paused_raylet(three_node_cluster, group, after_s=0.3, for_s=10.0) as pause:
            with pytest.raises(GroupFailure) as failure:
                train_step(group, 0)
            raised_at = time.monotonic()
            start = time.monotonic()
            named = detect_failure(group, live_node_ids(), failure.value, job_id="blip-test", timeout_s=10,
                                   loss_grace_s=grace)
            detect_s = time.monotonic() - start
    finally:
        group.kill()
    assert failure.value.rank == VICTIM_RANK and failure.value.dead
    assert f"node '{VICTIM}' is lost (its raylet at" in str(failure.value) and "silent for" in str(failure.value)
    assert grace <= raised_at - pause["stopped_at"] < grace + 1.5, (raised_at - pause["stopped_at"])
    assert named["lost_nodes"] == [VICTIM] and named["dead_ranks"] == [VICTIM_RANK], named
    assert grace <= detect_s < grace + 1.5, detect_s      # detection waits the grace too, then names the node


def test_a_killed_raylet_is_a_loss_at_once(three_node_cluster):
    group = start_group(loss_grace_s=30.0)               # far longer than the test: no silence counts
    victim, killed = victim_node(three_node_cluster), {}

    def kill():
        killed["at"] = time.monotonic()
        three_node_cluster.remove_node(victim, allow_graceful=False)

    timer = threading.Timer(0.5, kill)
    try:
        timer.start()
        with pytest.raises(GroupFailure) as failure:
            train_step(group, 0)
        raised_at = time.monotonic()
        timer.join()
        start = time.monotonic()
        named = detect_failure(group, live_node_ids() | {VICTIM: victim.node_id}, failure.value,
                               job_id="blip-test", timeout_s=10, loss_grace_s=30.0)
        detect_s = time.monotonic() - start
    finally:
        timer.cancel()
        group.kill()
    assert failure.value.rank == VICTIM_RANK and failure.value.dead, failure.value
    assert raised_at - killed["at"] < 1.5, raised_at - killed["at"]
    assert named["lost_nodes"] == [VICTIM] and detect_s < 1.0, (named, detect_s)
