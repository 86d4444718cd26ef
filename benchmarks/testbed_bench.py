"""The headline, measured on a heterogeneous testbed (autohet_ray/testbed/): devices are CPU shares (cgroup v1
quotas), links are tbf-shaped veths between network namespaces, one raylet per namespace, S3 behind its own
shaped link. Nothing is paced: every figure is "testbed" (real CPU compute at each device's share).

    python -m benchmarks run testbed -- [--testbed jobs/testbeds/paper-mix.yaml] [--homogeneous
        jobs/testbeds/paper-mix-homogeneous.yaml] [--repeats 3] [--steps 4] [--storage-mbit 16,64,256]

1. Up the mixed testbed; `autohet profile --cluster` measures each device class on it (in the head's namespace).
2. The planner's plan and the baselines (Megatron-LM on all devices, on its best subset, Whale) from that
   profile (planner.plan_with_baselines, as `autohet plan` runs it).
3. `autohet train --plan P --profile PROFILE` for each plan, interleaved (autohet, megatron, megatron-subset,
   whale, then again), `--repeats` times: the median of each plan's steady-state samples/s, beside the
   prediction made from the testbed's own profile.
4. A node vanishes (every process frozen, link down) under an elastic job on S3, at each storage rate: recovered
   local-first (node stores and peers) and again from S3 only; the phases of each (`--storage-mbit`).
5. The homogeneous testbed (same node count and total CPU share, one class): profiled, planned, trained the same
   way; heterogeneous efficiency = autohet mixed / autohet homogeneous (measured samples/s).
Ends with one JSON line. Each testbed is taken down on every exit path. Needs root.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time

from autohet_ray.testbed import bed
from autohet_ray.testbed.spec import load_testbed

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(REPO, "jobs", "models", "testbed-gpt.yaml")
PLANS = ("autohet", "megatron", "megatron-subset", "whale")
PY = sys.executable


def cli(*args: str, timeout_s: float = 600) -> str:
    """`autohet ARGS` as the testbed's driver; its stdout (stderr passes through). Raises on a non-zero exit."""
    out = bed.drive([PY, "-m", "autohet_ray.cli", *args], timeout_s=timeout_s)
    if out.returncode != 0:
        raise RuntimeError(f"autohet {args[0]} exited {out.returncode}")
    return out.stdout


def last_json(text: str) -> dict:
    return json.loads([line for line in text.splitlines() if line.startswith("{")][-1])


def profile(work: str) -> str:
    path = os.path.join(work, "profile.json")
    cli("profile", "--cluster", bed.CLUSTER_PATH, "--model", MODEL, "--out", path)
    return path


def plans(work: str, profile_path: str, global_batch: int, seq_len: int, names=PLANS) -> dict:
    """name -> (plan file, predicted samples/s, predicted time breakdown) from the testbed's profile."""
    from autohet_ray.cluster.spec import load_cluster
    from autohet_ray.cost.breakdown import time_breakdown
    from autohet_ray.model.spec import load_model
    from autohet_ray.planner import plan_with_baselines
    from autohet_ray.profile.db import load_profile
    result, baselines = plan_with_baselines(cluster=load_cluster(bed.CLUSTER_PATH), model=load_model(MODEL),
                                            profile=load_profile(profile_path), global_batch=global_batch,
                                            seq_len=seq_len, time_limit_s=30)
    found = {"autohet": result} | baselines
    out = {}
    for name in names:
        r = found[name]
        if r.plan is None:
            print(f"  {name}: no plan ({r.reason})", file=sys.stderr)
            continue
        path = os.path.join(work, f"plan-{name}.json")
        with open(path, "w") as f:
            f.write(r.plan.to_json())
        out[name] = {"plan": path, "predicted_samples_per_s": r.evaluation.samples_per_s,
                     "breakdown": time_breakdown(r.plan, r.evaluation), "shape": describe(r.plan)}
        print(f"  {name}: {out[name]['shape']}, predicted {r.evaluation.samples_per_s:.2f} samples/s", file=sys.stderr)
    return out


def describe(plan) -> str:
    return " | ".join(f"{p.num_microbatches}x[" + " > ".join(f"{s.node}:{s.layers[0]}-{s.layers[1]}"
                                                            for s in p.stages) + "]" for p in plan.pipelines)


def train(work: str, name: str, plan_path: str, profile_path: str, args, repeat: int) -> dict:
    storage = os.path.join(work, f"storage-{name}-{repeat}")
    out = last_json(cli("train", "--cluster", bed.CLUSTER_PATH, "--model", MODEL, "--plan", plan_path,
                        "--profile", profile_path, "--global-batch", str(args.global_batch), "--seq-len",
                        str(args.seq_len), "--steps", str(args.steps), "--dtype", "float32", "--no-baselines",
                        "--storage", storage, "--checkpoint-every", str(args.steps), "--json"))
    return {"samples_per_s": args.global_batch / out["measured_iteration_s"],
            "predicted_samples_per_s": out["predicted_samples_per_s"], "load": os.getloadavg()[0]}


def throughput(work: str, found: dict, profile_path: str, args) -> dict:
    """Every plan, interleaved, `args.repeats` times: medians."""
    runs = {name: [] for name in found}
    for repeat in range(args.repeats):
        for name, info in found.items():
            r = train(work, name, info["plan"], profile_path, args, repeat)
            runs[name].append(r)
            print(f"  repeat {repeat}: {name} {r['samples_per_s']:.2f} samples/s measured vs "
                  f"{r['predicted_samples_per_s']:.2f} predicted (load {r['load']:.1f})", file=sys.stderr, flush=True)
    return {name: {"measured": statistics.median(r["samples_per_s"] for r in rs),
                   "runs": [round(r["samples_per_s"], 3) for r in rs],
                   "predicted": found[name]["predicted_samples_per_s"]} for name, rs in runs.items()}


def recovery(work: str, plan_path: str, rates: list[float], vanished: str, args) -> dict:
    """At each storage rate, one vanished node recovered local-first and one from S3 only (each a fresh job)."""
    out = {}
    for mbit in rates:
        pair = {}
        for mode in ("local_first", "cloud_only"):
            text = bed.drive([PY, os.path.abspath(__file__), "--inner-recover", mode, "--plan", plan_path,
                              "--vanish", vanished, "--storage-mbit", str(mbit),
                              "--profile", os.path.join(work, "profile.json"),
                              "--global-batch", str(args.global_batch), "--seq-len", str(args.seq_len)],
                             timeout_s=600).stdout
            pair[mode] = last_json(text)
            bed.revive(vanished)
            print(f"  storage {mbit} Mbit/s, {mode}: {json.dumps(pair[mode])}", file=sys.stderr, flush=True)
        local, cloud = pair["local_first"], pair["cloud_only"]
        out[str(mbit)] = {"local_first": local, "cloud_only": cloud,
                          "whole_recovery_ratio": cloud["whole_s"] / local["whole_s"]}
    return out


PHASES = ("detect_s", "replan_s", "restart_s", "fetch_s", "load_s", "first_step_s")


def inner_recover(args) -> int:
    """In the head's namespace: an elastic job on S3 trains 3 steps (every step committed to S3 at the full
    link), the S3 link drops to the rate under test, node `--vanish` vanishes mid-run, and the next step
    recovers (`--inner-recover` local_first or cloud_only). One JSON line: the phases, bytes, lost steps."""
    from autohet_ray.model.spec import load_model
    from autohet_ray.job.config import TrainJob
    from autohet_ray.orchestrate.controller import Controller
    from autohet_ray.orchestrate.session import ray_session
    from autohet_ray.cluster.spec import load_cluster
    from autohet_ray.storage.spec import storage_spec
    import ray  # noqa: F401
    plan = None
    if args.plan:
        with open(args.plan) as f:
            plan = json.load(f)
    state = bed.read_state()
    prefix = f"s3://{state['bucket']}/recover-{args.inner_recover}-{args.storage_mbit}-{time.time_ns()}"
    job = TrainJob(model=load_model(args.model).to_dict(), cluster=state["cluster"], plan=plan,
                   global_batch=args.global_batch, seq_len=args.seq_len, dtype="float32", elastic=True,
                   storage=storage_spec(prefix, endpoint_url=state["s3_endpoint"]), checkpoint_every=1,
                   profile=args.profile, baselines=False, collective_timeout_s=60, detect_timeout_s=60,
                   plan_time_limit_s=10)
    with ray_session(load_cluster(bed.CLUSTER_PATH), address=None, emulate=False):
        ctl = Controller(job)
        try:
            ctl.start()
            for _ in range(3):
                ctl.step()
            ctl.planning_ahead.wait(120)
            ctl.recovery.mode = args.inner_recover
            bed.set_storage_rate(float(args.storage_mbit))
            committed_before = max(ctl.committer.committed)
            vanished_at = bed.vanish(args.vanish)
            first = ctl.step()
            whole = time.time() - vanished_at
            rec = first["recovery"]
        finally:
            ctl.close()
    print(json.dumps({**{k: rec.get(k) for k in PHASES}, "whole_s": whole, "lost_nodes": rec["lost_nodes"],
                      "lost_steps": committed_before - rec["restored_step"], "restored_step": rec["restored_step"],
                      "committed_before": committed_before, "work_lost_steps": rec.get("lost_steps"),
                      "bytes_by_tier": rec["bytes_by_tier"], "loss_grace_s": job.loss_grace_s,
                      "storage_bytes": rec["bytes_by_tier"].get("storage", 0)}))
    return 0


def with_testbed(path: str, body):
    testbed = load_testbed(path)
    try:
        print(f"testbed {testbed.name}: up ...", file=sys.stderr, flush=True)
        bed.up(testbed)
        return body(testbed)
    finally:
        bed.down()


def bars(measured: dict, predicted: dict, efficiency: float | None, rec: dict) -> dict:
    auto = measured.get("autohet")
    speedup = {k: auto / v for k, v in measured.items() if k != "autohet" and auto and v}
    return {"speedup_over_megatron_ge_1.38": speedup.get("megatron", 0) >= 1.38,
            "baselines_never_above_autohet_by_3pct": all(s >= 0.97 for s in speedup.values()),
            "every_plan_within_10pct": all(abs(measured[k] / predicted[k] - 1) <= 0.10 for k in measured),
            "heterogeneous_efficiency_ge_0.90": efficiency is not None and efficiency >= 0.90,
            "zero_lost_steps": rec.get("lost_steps") == 0,
            "zero_storage_bytes_local_first": rec.get("storage_bytes_local_first") == 0}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--testbed", default=os.path.join(REPO, "jobs", "testbeds", "paper-mix.yaml"))
    ap.add_argument("--homogeneous", default=os.path.join(REPO, "jobs", "testbeds", "paper-mix-homogeneous.yaml"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--global-batch", type=int, default=40, help="a multiple of 5: Megatron-LM on all 5 devices "
                                                                     "is data-parallel 5")
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--storage-mbit", default="16,64,256")
    ap.add_argument("--vanish", default="h20", help="the node that vanishes")
    ap.add_argument("--skip", default="", help="comma-separated parts to skip: recovery, homogeneous")
    ap.add_argument("--inner-recover", choices=("local_first", "cloud_only"), help=argparse.SUPPRESS)
    ap.add_argument("--plan", help=argparse.SUPPRESS)
    ap.add_argument("--profile", default="analytic", help=argparse.SUPPRESS)
    ap.add_argument("--model", default=MODEL, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))      # the testbed is taken down on the way out
    signal.signal(signal.SIGINT, signal.default_int_handler)     # also when started in the background
    if args.inner_recover:
        return inner_recover(args)
    skip = set(filter(None, args.skip.split(",")))
    work = tempfile.mkdtemp(prefix="testbed-bench-")
    os.chmod(work, 0o755)
    loads = [os.getloadavg()]

    def mixed(testbed):
        prof = profile(work)
        found = plans(work, prof, args.global_batch, args.seq_len)
        tp = throughput(work, found, prof, args)
        loads.append(os.getloadavg())
        rates = [float(x) for x in args.storage_mbit.split(",")]
        with open(found["autohet"]["plan"]) as f:
            used = [s["node"] for p in json.load(f)["pipelines"] for s in p["stages"]]
        vanish = args.vanish if args.vanish in used[1:] else used[-1]     # a node the plan trains on
        rec = {} if "recovery" in skip else recovery(work, found["autohet"]["plan"], rates, vanish, args)
        loads.append(os.getloadavg())
        return testbed, found, tp, rec

    testbed, found, tp, rec = with_testbed(args.testbed, mixed)
    homog = None
    if "homogeneous" not in skip:
        hwork = os.path.join(work, "homogeneous")
        os.makedirs(hwork)

        def homogeneous(_testbed):
            prof = profile(hwork)
            hfound = plans(hwork, prof, args.global_batch, args.seq_len, names=("autohet",))
            return throughput(hwork, hfound, prof, args)["autohet"]
        homog = with_testbed(args.homogeneous, homogeneous)
        loads.append(os.getloadavg())
    measured = {k: round(v["measured"], 4) for k, v in tp.items()}
    predicted = {k: round(v["predicted"], 4) for k, v in tp.items()}
    efficiency = round(tp["autohet"]["measured"] / homog["measured"], 4) if homog else None
    recovery_key = {}
    if rec:
        locals_ = [r["local_first"] for r in rec.values()]
        recovery_key = {
            "detect_s": max(r["detect_s"] for r in locals_),
            "phases": {rate: {mode: {k: r[mode][k] for k in (*PHASES, "whole_s")} for mode in ("local_first", "cloud_only")}
                       for rate, r in rec.items()},
            "whole_recovery_ratio": {rate: round(r["whole_recovery_ratio"], 3) for rate, r in rec.items()},
            "lost_steps": max(r["lost_steps"] for r in locals_),          # committed steps, local-first
            "lost_steps_cloud_only": max(r["cloud_only"]["lost_steps"] for r in rec.values()),   # S3 lags
            "storage_bytes_local_first": max(r["storage_bytes"] for r in locals_),
            "loss_grace_s": locals_[0]["loss_grace_s"]}
    report = {"measured": measured, "predicted": predicted,
              "speedup_measured": {k: round(measured["autohet"] / v, 3) for k, v in measured.items() if k != "autohet"},
              "speedup_predicted": {k: round(predicted["autohet"] / v, 3) for k, v in predicted.items() if k != "autohet"},
              "max_abs_error": round(max(abs(measured[k] / predicted[k] - 1) for k in measured), 4),
              "errors": {k: round(measured[k] / predicted[k] - 1, 4) for k in measured},
              "runs": {k: v["runs"] for k, v in tp.items()},
              "heterogeneous_efficiency": efficiency,
              "homogeneous": {"measured": round(homog["measured"], 4), "predicted": round(homog["predicted"], 4),
                              "runs": homog["runs"]} if homog else None,
              "predicted_time_breakdown": {k: {p: round(s, 4) for p, s in v["breakdown"].items()}
                                           for k, v in found.items()},
              "plans": {k: v["shape"] for k, v in found.items()},
              "recovery": recovery_key, "testbed": testbed.to_dict(),
              "load_average": [round(x, 2) for x in loads[0]], "load_averages": [[round(x, 2) for x in l] for l in loads],
              "label": "testbed (CPU shares, shaped links; nothing paced)"}
    report["bars"] = bars(measured, predicted, efficiency, recovery_key)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
