"""What a planned switch stops the job for, side by side (EMULATED: fake GPUs on one host, real CPU compute on
this machine's shared cores, tiny-gpt paced to `--iteration-wall-s` by the cost model, so these figures check
the executor's schedule, not the cost model; 3 nodes, not ~1000 ranks):

- notice_at_once: a spot notice for node b acted on at once (flush, plan the state without b, rebuild the
  process groups on the survivors' processes, restore): the controller before notices were prepared;
- notice_prepared: the same notice prepared while the job trains (plan from the plan-ahead cache, the next
  plan's workers set up in the background: process groups, engines), then the switch at a step boundary:
  flush, stop the old workers, restore the flushed step into the standby ones (local first);
- join_prepared: node b joins a job on a and c; its plan and workers prepared ahead, the switch rebuilds the
  process groups (groups_ahead false) or takes the standby workers (groups_ahead true).

Per run: switch_s (wall time of the between-steps call that switched: the job stands still), its phases, the
steps trained while preparing, the first step after. Medians over --runs per mode. Ends with one JSON line.

    python -m benchmarks run spot-replay-switch-cost -- [--runs 3] [--iteration-wall-s 0.5]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time

from autohet_ray.emulate.cluster import FAST_HEALTH_CHECKS
from benchmarks.spot_replay_join_cost import NODES, PRICED_AS, measure_join, set_node_b

MODES = ("notice_at_once", "notice_prepared", "join_prepared_groups_rebuilt", "join_prepared_groups_ahead")
PHASES = ("switch_s", "flush_s", "stop_s", "replan_s", "restart_s", "keepers_s", "fetch_s", "load_s",
          "configure_snapshots_s", "standby_setup_s", "prepared_s", "first_step_s", "step_s_median",
          "steps_trained_while_preparing", "num_ranks", "reused_actors")


def measure_notice(test_cluster, storage_dir: str, *, prepared: bool, iteration_wall_s: float,
                   max_wait_s: float = 120.0) -> dict:
    """A job on a, b and c trains 3 steps; a notice for b (deadline in 120 s) is posted on the job's notice
    board; step until check_notices switches. The switch's figures."""
    import ray

    from autohet_ray.elastic.spot import start_board
    from autohet_ray.job.config import TrainJob
    from autohet_ray.model.spec import load_model
    from autohet_ray.orchestrate.controller import Controller
    from autohet_ray.storage.spec import storage_spec
    set_node_b(test_cluster, alive=True)
    job = TrainJob(model=load_model("tiny-gpt").to_dict(), priced_as=PRICED_AS, priced_seq_len=2048,
                   cluster=NODES, global_batch=16, dtype="float64", setup_timeout_s=180,
                   storage=storage_spec(storage_dir), elastic=True, checkpoint_every=0, baselines=False,
                   iteration_wall_s=iteration_wall_s, collective_timeout_s=60, detect_timeout_s=30)
    ctl = Controller(job)
    ctl.prepare_notices = prepared
    try:
        ctl.start()
        walls = [ctl.step()["wall_s"] for _ in range(3)]
        ctl.planning_ahead.wait(120)
        board = start_board(ctl.job_id)
        notice = {"action": "terminate", "provider": "aws", "deadline_s": time.time() + 120}
        ray.get(board.post.remote(ctl.found.node_ids["b"], notice), timeout=30)
        seen, trained = time.perf_counter(), 0
        while True:
            start = time.perf_counter()
            report = ctl.check_notices(board)
            switch_s = time.perf_counter() - start
            if report is not None:
                break
            assert time.perf_counter() - seen < max_wait_s, "the notice was never switched on"
            walls.append(ctl.step()["wall_s"])
            trained += 1
        first = ctl.step()["wall_s"]
        return {"mode": "notice_prepared" if prepared else "notice_at_once", "switch_s": switch_s,
                "steps_trained_while_preparing": trained, "first_step_s": first,
                "step_s_median": statistics.median(walls), "lost_steps": report["lost_steps"],
                "storage_bytes": report["bytes_by_tier"].get("storage", 0), "plan": report.get("plan"),
                "num_ranks": report["num_ranks"], "reused_actors": report["reused_actors"],
                **{k: v for k, v in report.items() if k.endswith("_s") and isinstance(v, (int, float))
                   and k != "switch_s"}}
    finally:
        ctl.close()


def medians(rows: list[dict]) -> dict:
    out = {}
    for mode in MODES:
        mine = [r for r in rows if r["mode"] == mode]
        if mine:
            out[mode] = {k: round(statistics.median(r.get(k) or 0.0 for r in mine), 4) for k in PHASES}
            out[mode]["runs"] = len(mine)
    return out


def run_once(test_cluster, tmp: str, mode: str, i: int, wall: float) -> dict:
    if mode.startswith("notice"):
        return measure_notice(test_cluster, f"{tmp}/{mode}-{i}", prepared=mode == "notice_prepared",
                              iteration_wall_s=wall)
    row = measure_join(test_cluster, f"{tmp}/{mode}-{i}", prepare=True, iteration_wall_s=wall,
                       groups_ahead=mode.endswith("ahead"))
    return {"mode": mode, **row}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="runs per mode (modes interleaved)")
    ap.add_argument("--iteration-wall-s", type=float, default=0.5)
    args = ap.parse_args(argv)
    from autohet_ray.cluster.spec import cluster_from_dict
    from autohet_ray.emulate.cluster import emulated_cluster
    rows, wall0 = [], time.perf_counter()
    with emulated_cluster(cluster_from_dict(NODES), system_config=FAST_HEALTH_CHECKS) as test_cluster, \
            tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            for mode in MODES:
                rows.append(run_once(test_cluster, tmp, mode, i, args.iteration_wall_s))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    command = " ".join(["python -m benchmarks run spot-replay-switch-cost --", *(argv or sys.argv[1:])])
    print(json.dumps({"emulated": True, "label": f"emulated, {len(NODES['nodes'])} nodes on one host (tiny-gpt paced "
                      "by the cost model: checks the executor's schedule), not ~1000 ranks",
                      "command": command, "measured_on": time.strftime("%Y-%m-%d", time.gmtime()),
                      "cluster": NODES, "iteration_wall_s": args.iteration_wall_s, "runs": rows,
                      "medians": medians(rows), "wall_s": round(time.perf_counter() - wall0, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
