"""Optimality of the planner with `--optimizer-sharding auto` against the independent exhaustive search
(tests/exhaustive.py, every stage with and without sharded state, equal slices), on tiny clusters.

Each instance: 2 GPU types on 3-4 GPUs with 16-48 GB (where the optimizer state weighs), a preset cut to 6-8
layers at 2048 tokens, global batch 8 in micro-batches of 1, one schedule. The planner runs as `autohet plan
--optimizer-sharding auto` runs it (`plan_with_baselines`); the gap is planner / optimum - 1 (negative where
its uneven slices beat the exhaustive search's equal ones); the bar is <= 1% on every instance. The first 15
are those where the optimum shards some stage (found by running the exhaustive search with and without
sharding on a grid of these clusters and models), the other 15 those where it does not (auto must not lose
there either). Also printed: the unsharded optimum, to show what sharding gains on each.

Analytic profile: predictions of the cost model, not measurements. Ends with one JSON line.

    python -m benchmarks run optimality:sharding [-- --rows 0,3,5]
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace

from autohet_ray.model import PRESETS
from autohet_ray.planner import plan_with_baselines
from autohet_ray.profile import analytic_profile
from benchmarks.optimality.plans import BAR, describe, tiny_cluster
from tests.exhaustive import exhaustive_best

SEQ_LEN, BATCH, MICRO_BATCH = 2048, 8, 1
_AV = (("A10", 2), ("V100-16GB", 2))
_RA = (("RTX-4090", 2), ("A10", 2))
_A4V = (("A100-40GB", 2), ("V100-16GB", 2))
_LA = (("L40S", 2), ("A10", 2))
_VA = (("V100-16GB", 2), ("A10", 1))
_RL = (("RTX-4090", 2), ("L40S", 1))
# (nodes, model, layers, schedule)
INSTANCES = [
    # the optimum shards
    (_AV, "gpt3-2.7b", 8, "1f1b"), (_AV, "gpt3-2.7b", 8, "zb-h1"), (_RA, "gpt3-2.7b", 8, "1f1b"),
    (_RA, "llama-7b", 8, "1f1b"), (_RA, "gpt3-6.7b", 8, "1f1b"), (_A4V, "gpt3-2.7b", 8, "1f1b"),
    (_A4V, "gpt3-2.7b", 8, "zb-h1"), (_A4V, "llama-7b", 8, "1f1b"), (_A4V, "llama-7b", 8, "zb-h1"),
    (_A4V, "gpt3-6.7b", 8, "1f1b"), (_A4V, "gpt3-6.7b", 8, "zb-h1"), (_A4V, "llama-13b", 6, "zb-h1"),
    (_LA, "llama-7b", 8, "1f1b"), (_LA, "gpt3-6.7b", 8, "1f1b"), (_VA, "gpt3-2.7b", 8, "1f1b"),
    # the optimum does not
    (_AV, "llama-7b", 8, "1f1b"), (_AV, "llama-7b", 8, "zb-h1"), (_RA, "gpt3-2.7b", 8, "zb-h1"),
    (_RA, "llama-7b", 8, "zb-h1"), (_RA, "gpt3-6.7b", 8, "zb-h1"), (_A4V, "llama-13b", 6, "1f1b"),
    (_LA, "gpt3-2.7b", 8, "1f1b"), (_LA, "gpt3-2.7b", 8, "zb-h1"), (_LA, "llama-7b", 8, "zb-h1"),
    (_LA, "gpt3-6.7b", 8, "zb-h1"), (_LA, "llama-13b", 6, "1f1b"), (_VA, "gpt3-2.7b", 8, "zb-h1"),
    (_VA, "llama-7b", 8, "1f1b"), (_RL, "gpt3-2.7b", 8, "1f1b"), (_RL, "llama-7b", 8, "1f1b"),
]
SHARDING_OPTIMUM = range(15)      # indices of INSTANCES whose optimum shards


def run_instance(instance) -> dict:
    nodes, name, layers, schedule = instance
    cluster = tiny_cluster(nodes)
    model = replace(PRESETS[name], num_layers=layers, max_seq_len=SEQ_LEN)
    profile = analytic_profile(model, cluster, SEQ_LEN, micro_batches=(MICRO_BATCH,))
    t0 = time.process_time()
    result, _ = plan_with_baselines(cluster=cluster, model=model, profile=profile, global_batch=BATCH,
                                    seq_len=SEQ_LEN, micro_batch=MICRO_BATCH, schedules=(schedule,),
                                    optimizer_sharding="auto")
    t1 = time.process_time()
    best = {mode: exhaustive_best(cluster, model, profile, BATCH, SEQ_LEN, [MICRO_BATCH], schedules=(schedule,),
                                  optimizer_sharding=mode) for mode in ("auto", "none")}
    t2 = time.process_time()
    plan, ev = best["auto"]
    planner_s, optimum_s = result.evaluation.iteration_time_s, ev.iteration_time_s
    sharded = lambda p: sum(s.shard_optimizer for q in p.pipelines for s in q.stages)  # noqa: E731
    return {"cluster": "+".join(f"{c}x{d}" for d, c in nodes), "model": name, "layers": layers,
            "schedule": schedule, "planner_s": planner_s, "optimum_s": optimum_s, "gap": planner_s / optimum_s - 1,
            "unsharded_optimum_s": best["none"][1].iteration_time_s if best["none"] else None,
            "optimum_sharded_stages": sharded(plan), "planner_sharded_stages": sharded(result.plan),
            "planner_cpu_s": t1 - t0, "exhaustive_cpu_s": t2 - t1,
            "planner_plan": describe(result.plan), "optimum_plan": describe(plan)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", help="comma-separated indices of INSTANCES (default: all)")
    args = ap.parse_args(argv)
    picked = [int(i) for i in args.rows.split(",")] if args.rows else range(len(INSTANCES))
    rows = []
    for i in picked:
        row = run_instance(INSTANCES[i])
        rows.append(row)
        none = row["unsharded_optimum_s"]
        print(f"#{i:<2} {row['cluster']:<22} {row['model']:<10} L={row['layers']} {row['schedule']:<5} planner "
              f"{row['planner_s']:.5f} s (sh {row['planner_sharded_stages']})  optimum {row['optimum_s']:.5f} s "
              f"(sh {row['optimum_sharded_stages']})  gap {100 * row['gap']:+.2f}%  unsharded optimum "
              f"{none if none is None else round(none, 5)}  cpu {row['planner_cpu_s']:.1f}+{row['exhaustive_cpu_s']:.1f} s"
              f"{'  <-- MISSED' if row['gap'] > BAR else ''}", flush=True)
    print(json.dumps({"bench": "sharding_optimality", "instances": len(rows), "bar": BAR,
                      "max_gap": max(r["gap"] for r in rows), "within_bar": sum(r["gap"] <= BAR for r in rows),
                      "optimum_shards": sum(r["optimum_sharded_stages"] > 0 for r in rows),
                      "failing": [r for r in rows if r["gap"] > BAR], "rows": rows}))


if __name__ == "__main__":
    main()
