"""What a node joining costs an elastic job, with and without plan-ahead (EMULATED: fake GPUs, real CPU compute
on this machine's shared cores, tiny-gpt paced to `--iteration-wall-s`).

The job trains on nodes a and c of a 3-node cluster (a, b: one H800 each; c: two H20); node b joins. At each
step boundary the controller's check_joins runs. Without plan-ahead it switches at once: flush, plan the new
state, start b's worker processes, rebuild the process groups, restore. With plan-ahead the first boundary
starts planning the new state in the background and b's workers (process start, imports), the job trains on,
and a later boundary switches onto them once both are ready. Per join: the switch call's wall time (the
job's down time, the first step after it aside), its phases, the steps trained while preparing, and the first
step after the switch. Ends with one JSON line.

    python -m benchmarks run spot-replay-join-cost -- [--joins 3] [--iteration-wall-s 0.5]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from autohet_ray.replay.phases import last_json_line

NODES = {"name": "three-node", "nodes": [{"name": "a", "device": "H800", "count": 1},
                                          {"name": "b", "device": "H800", "count": 1},
                                          {"name": "c", "device": "H20", "count": 2}]}
# plans are priced as a 4-layer model of 1.3B-class width, so the planner puts work on every GPU it is given
PRICED_AS = {"name": "priced-gpt-4l", "family": "gpt", "num_layers": 4, "hidden": 2048, "num_heads": 16,
             "num_kv_heads": 16, "ffn_hidden": 8192, "vocab_size": 32000, "max_seq_len": 2048}


def node_of(test_cluster, name: str):
    for node in test_cluster.list_all_nodes():
        if node.node_id in {n.node_id for n in _live(name)}:
            return node
    return None


def _live(name: str):
    from autohet_ray.orchestrate.discovery import live_nodes
    return [n for n in live_nodes() if n.name == name]


def set_node_b(test_cluster, alive: bool) -> None:
    """Node b present (added, waited for) or absent (removed)."""
    from autohet_ray.cluster.spec import cluster_from_dict
    from autohet_ray.emulate.cluster import node_args
    present = node_of(test_cluster, "b")
    if alive and present is None:
        test_cluster.add_node(**node_args(cluster_from_dict(NODES).node("b")))
        deadline = time.monotonic() + 60
        while not _live("b"):
            assert time.monotonic() < deadline, "node b did not come up"
            time.sleep(0.2)
    elif not alive and present is not None:
        test_cluster.remove_node(present, allow_graceful=False)
        deadline = time.monotonic() + 60
        while _live("b"):
            assert time.monotonic() < deadline, "node b did not go"
            time.sleep(0.2)


def measure_join(test_cluster, storage_dir: str, *, prepare: bool, iteration_wall_s: float,
                 max_wait_s: float = 120.0, groups_ahead: bool = True) -> dict:
    """Start a job without node b, train 2 steps, add b, step until check_joins switches; the join's figures.
    `groups_ahead`: a prepared join also sets up the next plan's process groups ahead (switch_ahead.Standby)."""
    from autohet_ray.job.config import TrainJob
    from autohet_ray.model.spec import load_model
    from autohet_ray.orchestrate.controller import Controller
    from autohet_ray.storage.spec import storage_spec
    set_node_b(test_cluster, alive=False)
    job = TrainJob(model=load_model("tiny-gpt").to_dict(), priced_as=PRICED_AS, priced_seq_len=2048,
                   cluster=NODES, global_batch=16, dtype="float64", setup_timeout_s=180,
                   storage=storage_spec(storage_dir), elastic=True, checkpoint_every=0, baselines=False,
                   iteration_wall_s=iteration_wall_s, collective_timeout_s=60, detect_timeout_s=30)
    ctl = Controller(job)
    ctl.prepare_joins, ctl.groups_ahead = prepare, groups_ahead
    try:
        ctl.start()
        walls = [ctl.step()["wall_s"] for _ in range(3)]
        ctl.planning_ahead.wait(120)               # the states one loss away: not the join's
        set_node_b(test_cluster, alive=True)
        seen, trained = time.perf_counter(), 0
        while True:
            start = time.perf_counter()
            report = ctl.check_joins()
            switch_s = time.perf_counter() - start
            if report is not None:
                break
            assert time.perf_counter() - seen < max_wait_s, "the join was never switched to"
            walls.append(ctl.step()["wall_s"])
            trained += 1
        first = ctl.step()["wall_s"]
        return {"prepare": prepare, "groups_ahead": prepare and groups_ahead, "switch_s": switch_s, "steps_trained_while_preparing": trained,
                "join_to_switch_s": time.perf_counter() - seen - first, "first_step_s": first,
                "step_s_median": statistics.median(walls), "plan_source": report.get("plan_source"),
                "num_ranks": report["num_ranks"], "reused_actors": report["reused_actors"],
                "prepared_s": report.get("prepared_s"), "prepared_workers": report.get("prepared_workers"),
                "plan": report.get("plan"),
                **{k: v for k, v in report.items() if k.endswith("_s") and isinstance(v, (int, float))}}
    finally:
        ctl.close()


def join_cost_medians(path: str | None) -> dict | None:
    """The emulated join's medians with and without plan-ahead (spot_replay_join_cost.py), labelled."""
    if not path or not os.path.exists(path):
        return None
    line = last_json_line(path)
    return {"label": "emulated (3 nodes on one host, tiny-gpt), not ~1000 ranks: "
                     "the job's down time at a join's switch and its parts, medians",
            "file": os.path.relpath(path, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
            "command": line.get("command"), **line["medians"]}


def summary(rows: list[dict]) -> dict:
    out = {}
    for prepare in (False, True):
        mine = [r for r in rows if r["prepare"] is prepare]
        if mine:
            out["with_plan_ahead" if prepare else "without_plan_ahead"] = {
                k: statistics.median(r.get(k, 0.0) for r in mine) for k in (
                    "switch_s", "replan_s", "restart_s", "restore_s", "first_step_s", "step_s_median",
                    "steps_trained_while_preparing", "reused_actors", "num_ranks")}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--joins", type=int, default=3, help="joins measured per mode (alternating modes)")
    ap.add_argument("--iteration-wall-s", type=float, default=0.5)
    args = ap.parse_args(argv)
    from autohet_ray.cluster.spec import cluster_from_dict
    from autohet_ray.emulate.cluster import FAST_HEALTH_CHECKS, emulated_cluster
    rows, wall0 = [], time.perf_counter()
    cluster = emulated_cluster(cluster_from_dict(NODES), system_config=FAST_HEALTH_CHECKS)
    with cluster as test_cluster, tempfile.TemporaryDirectory() as tmp:
        for i in range(args.joins):
            for prepare in (False, True):
                rows.append(measure_join(test_cluster, f"{tmp}/{i}-{prepare}", prepare=prepare,
                                         iteration_wall_s=args.iteration_wall_s))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    command = " ".join(["benchmarks/spot_replay_join_cost.py", *(argv or sys.argv[1:])])
    print(json.dumps({"emulated": True, "command": command,
                      "measured_on": time.strftime("%Y-%m-%d", time.gmtime()), "cluster": NODES,
                      "iteration_wall_s": args.iteration_wall_s, "joins": rows, "medians": summary(rows),
                      "wall_s": round(time.perf_counter() - wall0, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
