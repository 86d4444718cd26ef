"""Cost model vs reality, emulated: on the paper's 24-GPU mix (8x A100-80GB + 8x H800 + 8x H20), run the
planner's plan and the Megatron-LM plan side by side through the real Ray path (driver actor, placement
groups, 24 stage actors, gloo p2p/TP/grad sync, the runtime's schedule), for a GPT-3-shaped and a LLaMA-shaped
model; and the planner's plan under the other pipeline schedule (1F1B vs zero-bubble H1), to check that the
runtime's schedule gains what the cost model predicts. The model that runs is scaled down to fit 2 CPU cores
(the real layer count, tiny hidden size and sequence); every op is paced to what the analytic profile of the *real-size* model predicts for the emulated
GPU or link (times a time scale), so the emulated clock reflects the real GPUs. All figures are emulated.

    python benchmarks/e2e_bench.py [--models gpt3-6.7b,llama-7b] [--global-batch 96] [--steps 4] [--data DIR]

With `--data DIR` (a dataset from `autohet data prepare`) the plans train on it, and each plan reports the
share of its steps' wall time that the step waited for its batch (`data_wait_share`: the loader on the
critical path; the next batch is prepared in the background while a step runs).

Measured iteration = the best of the steps: pacing only ever fills an op up to its target, so other
processes on the shared cores can only lengthen a step (one-sided noise); the median of the steps after the
first is reported too. Ends with one JSON line: predicted and measured iteration time per plan, predicted and
measured speedup, the machine's load average.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import replace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from autohet_ray.cluster.spec import load_cluster  # noqa: E402
from autohet_ray.cost.evaluate import evaluate_plan  # noqa: E402
from autohet_ray.model.spec import PRESETS, ModelSpec  # noqa: E402
from autohet_ray.orchestrate.controller import Controller  # noqa: E402
from autohet_ray.job.config import TrainJob  # noqa: E402
from autohet_ray.orchestrate.session import ray_session  # noqa: E402
from autohet_ray.planner import plan_with_baselines  # noqa: E402
from autohet_ray.profile.analytic import analytic_profile  # noqa: E402

PAPER_SPEEDUPS = "1.38x / 1.53x / 1.79x"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN_SEQ_LEN = 16


def scaled_down(spec: ModelSpec, vocab_size: int = 256) -> ModelSpec:
    """Same family and layer count, tiny widths that every TP degree up to 8 divides."""
    return replace(spec, name=f"{spec.name}-emu", hidden=64, num_heads=8, num_kv_heads=8, ffn_hidden=128,
                   vocab_size=vocab_size, max_seq_len=RUN_SEQ_LEN)


def run_vocab_size(data: str | None) -> int:
    """The scaled-down model's vocabulary: 256, or the dataset's (rounded up to a multiple of 8 for TP)."""
    if data is None:
        return 256
    from autohet_ray.data import Dataset
    return -(-Dataset.open(data).index.vocab_size // 8) * 8


def plans_for(cluster, spec: ModelSpec, global_batch: int, seq_len: int, time_limit_s: float):
    profile = analytic_profile(spec, cluster, seq_len)
    result, baselines = plan_with_baselines(cluster=cluster, model=spec, profile=profile, global_batch=global_batch,
                                            seq_len=seq_len, time_limit_s=time_limit_s)
    megatron = baselines["megatron"]
    if megatron.plan is None:
        raise SystemExit(f"Megatron has no plan for {spec.name} at global batch {global_batch}: {megatron.reason}; "
                         "pick another --global-batch")
    plans = {"autohet": (result.plan, result.evaluation), "megatron": (megatron.plan, megatron.evaluation)}
    other = "1f1b" if result.plan.schedule == "zb-h1" else "zb-h1"
    alt = result.plan.with_schedule(other)
    ev = evaluate_plan(alt, cluster, spec, profile)
    if ev.feasible:                  # the same layout under the other schedule
        plans[f"autohet-{other}"] = (alt.with_predicted(ev.predicted()), ev)
    return profile, plans


def time_scale_for(ev, wall_s: float) -> float:
    """Wall seconds per emulated second, so that one iteration of this plan lasts about `wall_s` on the wall
    clock: long enough for 24 processes' real CPU work on 2 shared cores to fit inside the paced ops."""
    return wall_s / ev.iteration_time_s


def _print_step(m: dict) -> None:
    print(f"    step {m['step']}: {m['iteration_s']:.3f} s emulated (wall {m['wall_s']:.3f} s), loss {m['loss']:.4f}, "
          f"overruns {m['overruns_by_op']}, load {os.getloadavg()[0]:.1f}", flush=True)


def run_plan(cluster, spec, run_spec, plan, args, time_scale: float, seq_len: int) -> dict:
    job = TrainJob(model=run_spec.to_dict(), priced_as=spec.to_dict(), global_batch=plan.global_batch,
                   cluster=cluster.to_dict(), plan=plan.to_dict(), seq_len=RUN_SEQ_LEN, priced_seq_len=seq_len,
                   time_scale=time_scale, setup_timeout_s=300, collective_timeout_s=600, baselines=False,
                   data=args.data, dtype="bf16")     # the dtype the plans were priced in (bf16, fp32 masters)
    start = time.perf_counter()
    ctl = Controller(job)
    try:
        ctl.start()
        history = [ctl.step() for _ in range(args.steps)]
        for m in history:
            _print_step(m)
    finally:
        ctl.close()
    times = [m["iteration_s"] for m in history]
    steady = times[1:] or times
    return {"measured_iteration_s": min(times), "median_steady_iteration_s": statistics.median(steady),
            "step_iteration_s": times, "steps": len(history),
            "loss": history[-1]["loss"], "run_s": time.perf_counter() - start,
            "overruns": sum(m["overruns"] for m in history[1:]),
            "data_wait_share": max(m["data_wait_s"] / m["wall_s"] for m in history[1:] or history)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cluster", default=os.path.join(REPO, "jobs/clusters/paper-24.yaml"))
    ap.add_argument("--models", default="gpt3-6.7b,llama-7b")
    ap.add_argument("--global-batch", type=int, default=96)
    ap.add_argument("--seq-len", type=int, default=2048, help="sequence length the real-size model is priced at")
    ap.add_argument("--steps", type=int, default=4, help="steps per plan; the first is warm-up")
    ap.add_argument("--iteration-wall-s", type=float, default=20.0,
                    help="wall seconds per emulated iteration of each plan (sets its time scale)")
    ap.add_argument("--plan-time-limit", type=float, default=30.0)
    ap.add_argument("--data", default=None, help="a prepared dataset to train on (default: synthetic tokens)")
    args = ap.parse_args()
    cluster = load_cluster(args.cluster)
    rows, out = [], {"emulated": True, "cluster": cluster.name, "gpus": cluster.num_gpus, "models": {}}
    with ray_session(cluster, address=None, emulate=True):
        for name in args.models.split(","):
            spec = PRESETS[name]
            profile, plans = plans_for(cluster, spec, args.global_batch, args.seq_len, args.plan_time_limit)
            result = {}
            for kind, (plan, ev) in plans.items():
                scale = time_scale_for(ev, args.iteration_wall_s)
                print(f"{name} {kind}: {plan.num_devices} GPUs, {len(plan.pipelines)} pipelines, predicted "
                      f"{ev.iteration_time_s:.3f} s/iteration; time scale {scale:.2f} (emulated)", flush=True)
                measured = run_plan(cluster, spec, scaled_down(spec, run_vocab_size(args.data)), plan, args, scale,
                                    args.seq_len)
                result[kind] = {"predicted_iteration_s": ev.iteration_time_s, "time_scale": scale, **measured,
                                "error": measured["measured_iteration_s"] / ev.iteration_time_s - 1}
            result["predicted_speedup"] = (result["megatron"]["predicted_iteration_s"] /
                                           result["autohet"]["predicted_iteration_s"])
            result["measured_speedup"] = (result["megatron"]["measured_iteration_s"] /
                                          result["autohet"]["measured_iteration_s"])
            alt = next((k for k in result if k.startswith("autohet-")), None)
            if alt:
                zb, one = ("autohet", alt) if alt == "autohet-1f1b" else (alt, "autohet")
                result["schedule_gain"] = {
                    "predicted": result[one]["predicted_iteration_s"] / result[zb]["predicted_iteration_s"],
                    "measured": result[one]["measured_iteration_s"] / result[zb]["measured_iteration_s"]}
            out["models"][name] = result
            rows.append((name, result))
    out["data"] = args.data or "synthetic"
    out["load_average"] = os.getloadavg()
    print(f"\n{'model':<11} {'plan':<14} {'predicted s':>11} {'best s':>8} {'error':>7} {'median s':>9}   "
          f"(all emulated; load average {out['load_average'][0]:.1f} on {os.cpu_count()} cores)")
    for name, r in rows:
        for kind in [k for k in r if k.startswith(("autohet", "megatron"))]:
            p = r[kind]
            print(f"{name:<11} {kind:<14} {p['predicted_iteration_s']:>11.3f} {p['measured_iteration_s']:>8.3f} "
                  f"{p['error']:>+7.1%} {p['median_steady_iteration_s']:>9.3f}")
        if args.data:
            worst = max(r[k]["data_wait_share"] for k in r if k.startswith(("autohet", "megatron")))
            print(f"{name:<11} loader on the critical path: at most {worst:.2%} of a step's wall time")
        print(f"{name:<11} speedup over Megatron: predicted {r['predicted_speedup']:.2f}x, measured "
              f"{r['measured_speedup']:.2f}x (emulated); the paper reports {PAPER_SPEEDUPS}")
        if "schedule_gain" in r:
            g = r["schedule_gain"]
            print(f"{name:<11} zero-bubble H1 over 1F1B on the same layout: predicted {g['predicted']:.3f}x, "
                  f"measured {g['measured']:.3f}x (emulated)")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
