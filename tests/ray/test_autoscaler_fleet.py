"""A job on a cluster that Ray's own autoscaler scales (fake multi-node provider, autoscaler v2), described by node
types only: it starts with no worker nodes, asks the autoscaler for its fleet, trains, loses its spot node to a
reclaim (processes killed, node gone, no notice), recovers with no committed step lost while the autoscaler brings
a replacement, and switches onto the replacement; the losses equal an uninterrupted run's (fp64)."""
from __future__ import annotations

import time

import pytest
import ray

from autoscaling_cluster import FAKE_HEAD_NODE_ID, autoscaling_cluster, reclaim
from ray_helpers import FAST_HEALTH_CHECKS, reference_losses

from autohet_ray.cluster.labels import gpu_resource
from autohet_ray.emulate.cluster import emulated_labels
from autohet_ray.job.config import TrainJob
from autohet_ray.model.spec import load_model
from autohet_ray.orchestrate.controller import Controller
from autohet_ray.storage.spec import storage_spec

pytestmark = pytest.mark.timeout(600)

STEPS = 8
RECLAIM_AFTER = 2          # the step after which the spot node is reclaimed
# The job's cluster file: node types only, no node names.
FLEET = {"name": "fleet", "types": [{"name": "h100-spot", "device": "H100", "count": 1, "spot": True, "max": 1},
                                    {"name": "a100", "device": "A100-80GB", "count": 1, "max": 1}]}


def worker_type(device: str, *, spot: bool) -> dict:
    """An autoscaler node type of one emulated GPU: the resources and labels an emulated node offers."""
    return {"min_workers": 0, "max_workers": 2, "node_config": {},
            "resources": {"CPU": 0, "GPU": 1, gpu_resource(device): 1}, "labels": emulated_labels(device, spot=spot)}


# Three worker types; the job's file asks for two of them (the L40S type is never launched for it).
WORKER_TYPES = {"h100-spot": worker_type("H100", spot=True), "a100-on-demand": worker_type("A100-80GB", spot=False),
                "l40s-on-demand": worker_type("L40S", spot=False)}


def gpu_nodes() -> dict[str, str]:
    """Alive GPU nodes: Ray node id -> accelerator label."""
    return {n["NodeID"]: n["Labels"]["ray.io/accelerator-type"] for n in ray.nodes()
            if n["Alive"] and n["Resources"].get("GPU")}


def test_a_typed_job_gets_its_fleet_survives_a_reclaim_and_switches_onto_the_replacement(tmp_path):
    started, started_wall = time.perf_counter(), time.time()
    if ray.is_initialized():
        ray.shutdown()
    log = []

    def event(what: str) -> None:
        log.append((time.perf_counter() - started, what))
        print(f"[{log[-1][0]:6.1f} s] {what}", flush=True)

    with autoscaling_cluster(WORKER_TYPES, str(tmp_path), system_config=FAST_HEALTH_CHECKS) as (address, pgid):
        ray.init(address=address)
        try:
            event(f"head up; GPU nodes: {len(gpu_nodes())}")
            assert gpu_nodes() == {}
            job = TrainJob(model=load_model("tiny-gpt").to_dict(), cluster=FLEET, global_batch=4, elastic=True,
                           storage=storage_spec(str(tmp_path / "run")), dtype="float64", checkpoint_every=0,
                           request_fleet=True, fleet_wait_s=240, baselines=False, plan_time_limit_s=5,
                           collective_timeout_s=30, detect_timeout_s=30)
            ctl = Controller(job)
            state = {"victim": None, "replacement": None, "committed": None, "recovered_at": None,
                     "trained_meanwhile": 0}

            def on_event(kind: str, report: dict) -> None:
                if kind == "launched":
                    event(f"launched on {sorted(gpu_nodes().values())}: {report['plan']}")
                elif kind == "step" and report["step"] == RECLAIM_AFTER and state["victim"] is None:
                    state["victim"] = next(i for i, d in gpu_nodes().items() if d == "H100")
                    state["committed"] = ctl.committer.committed[-1]
                    killed = reclaim(state["victim"], pgid)
                    event(f"reclaimed spot node {state['victim']} ({len(killed)} processes killed); newest "
                          f"committed step {state['committed']}")
                elif kind == "recovered":
                    event(f"recovered: lost {report['lost_nodes']}, {report['lost_steps']} steps lost, plan "
                          f"{report['plan']}")
                elif kind == "replanned":
                    event(f"switched: joined {report.get('joined')}, plan {report['plan']}")
                if kind == "step" and state["recovered_at"] is not None and state["replacement"] is None:
                    state["trained_meanwhile"] += 1
                    state["replacement"] = _wait_for_replacement(state["victim"])
                    event(f"replacement joined: {state['replacement']}")
                if kind == "recovered":
                    state["recovered_at"] = report["restored_step"]
                _wait_for_preparations(ctl, state)

            summary = ctl.run(STEPS, on_event=on_event)
            launched = {n["NodeID"]: n["Labels"].get("ray.io/accelerator-type") for n in ray.nodes()
                        if n["NodeID"] != FAKE_HEAD_NODE_ID}     # every node the autoscaler started, dead or alive
        finally:
            ray.shutdown()
    event("cluster stopped")
    for request in ctl.fleet.events:
        print(f"  asked the autoscaler at +{request['at'] - started_wall:.1f} s: {request['counts']} ({request['why']})")
    recoveries = [e for e in summary["events"] if "lost_nodes" in e]
    switches = [e for e in summary["events"] if e.get("joined")]
    assert summary["failure"] is None
    assert len(recoveries) == 1 and recoveries[0]["lost_nodes"] == [state["victim"]]
    assert recoveries[0]["restored_step"] == state["committed"]       # no committed step lost
    assert state["trained_meanwhile"] >= 1          # the survivor trained while the replacement came
    assert state["replacement"] is not None and len(switches) == 1
    assert switches[0]["joined"] == [state["replacement"]]            # a new node id, planned onto
    survivor = next(i for i, d in launched.items() if d == "A100-80GB")
    assert {s.node for p in ctl.plan.pipelines for s in p.stages} == {survivor, state["replacement"]}
    assert "L40S" not in launched.values()         # a type the job's file does not name is never asked for
    assert ctl.fleet.events[0]["counts"] == {"h100-spot": 1, "a100": 1}
    losses = list({s["step"]: s["loss"] for s in summary["steps"]}.values())     # the lost step's redo counts
    assert len(losses) == STEPS and losses == pytest.approx(reference_losses(STEPS), rel=1e-9)
    print(f"test time: {time.perf_counter() - started:.1f} s; load average {open('/proc/loadavg').read().split()[:3]}")


def _wait_for_replacement(victim: str, timeout_s: float = 180.0) -> str:
    """The id of the spot node the autoscaler launched in the reclaimed one's place, once Ray lists it alive (the
    first step trained on the survivor waits for it, so the switch comes within the run however slow the host)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        new = [i for i, d in gpu_nodes().items() if d == "H100" and i != victim]
        if new:
            return new[0]
        time.sleep(0.2)
    raise AssertionError(f"no replacement for {victim} within {timeout_s} s")


def _wait_for_preparations(ctl, state, timeout_s: float = 120.0) -> None:
    """Once the replacement is up, each step boundary waits for the join being prepared (its workers and node
    store started, then its standby group set up), so the switch comes within the run however slow the host."""
    if state["replacement"] is None:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        joining = ctl.joining
        if joining is None:
            return
        started = len(ray.wait(joining.started, num_returns=len(joining.started), timeout=0)[0]) == len(joining.started)
        if started and (joining.standby is None or joining.standby.ready()):
            return
        time.sleep(0.1)
