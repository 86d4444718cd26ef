"""Optimality of the planner against an independent exhaustive search (tests/exhaustive.py), on tiny clusters.

Each instance: 2-3 GPU types on 3-6 GPUs, a model of 8-24 layers (a preset with num_layers set), a global batch,
a micro-batch size fixed by the user or left to the planner ("auto": every profiled size; the exhaustive
search then lets each pipeline pick its own size, as the planner may), and one schedule. The planner runs as
`autohet plan` runs it (`plan_with_baselines`); the exhaustive search shares only the cost model with it. The
gap is planner / optimum - 1; the bar is <= 1% on every instance. Also printed: the fluid lower bound
(planner/bounds/bound.py) and the optimum's gap to it.

A second table runs memory-tight instances (long sequences on 16-48 GB GPUs) under `--recompute auto`, where
the exhaustive search also tries every stage with and without activation recomputation.

All figures use the analytic profile: they are predictions of the cost model, not measurements. Ends with one
JSON line: {"instances", "max_gap", "failing": [...], "recompute": {...}, ...}.

    python -m benchmarks run optimality:plans [--quick]
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace

from autohet_ray.cluster import cluster_from_dict
from autohet_ray.model import PRESETS
from autohet_ray.planner import plan_with_baselines
from autohet_ray.planner.bounds.bound import lower_bound_iteration_s
from autohet_ray.profile import analytic_profile
from tests.exhaustive import exhaustive_best

BAR = 0.01
PROFILED_MICRO_BATCHES = (1, 2, 4)
_2T3 = (("H800", 2), ("H20", 1))
_3T3 = (("H800", 1), ("H20", 1), ("A100-80GB", 1))
_2T4 = (("H800", 2), ("H20", 2))
_2T4B = (("A100-40GB", 2), ("V100", 2))
_2T4C = (("H100", 2), ("L40S", 2))
_3T4 = (("H800", 1), ("H20", 2), ("L40S", 1))
_3T5 = (("A100-80GB", 1), ("H20", 2), ("L40S", 2))
_2T6 = (("H200", 2), ("V100", 4))
_3T6 = (("H800", 2), ("H20", 2), ("A100-80GB", 2))
# (nodes, model, layers, global batch, micro-batch or None for auto, schedule)
INSTANCES = [
    (_2T3, "gpt3-1.3b", 8, 8, None, "1f1b"), (_2T3, "gpt3-1.3b", 8, 8, None, "zb-h1"),
    (_2T3, "gpt3-1.3b", 16, 16, 2, "1f1b"), (_2T3, "gpt3-1.3b", 16, 16, 2, "zb-h1"),
    (_2T3, "llama-7b", 12, 8, 1, "1f1b"), (_2T3, "llama-7b", 12, 8, 1, "zb-h1"),
    (_3T3, "gpt3-1.3b", 24, 12, 1, "1f1b"), (_3T3, "gpt3-1.3b", 24, 12, 1, "zb-h1"),
    (_3T3, "llama-7b", 8, 6, None, "1f1b"), (_3T3, "llama-7b", 8, 6, None, "zb-h1"),
    (_3T3, "bert-large", 24, 24, 2, "1f1b"), (_3T3, "bert-large", 24, 24, 4, "zb-h1"),
    (_3T3, "llama-13b", 16, 6, 1, "1f1b"), (_3T3, "llama-13b", 16, 6, 1, "zb-h1"),
    (_2T4, "gpt3-1.3b", 8, 16, None, "1f1b"), (_2T4, "gpt3-1.3b", 8, 16, None, "zb-h1"),
    (_2T4, "llama-7b", 16, 8, 1, "1f1b"), (_2T4, "llama-7b", 16, 8, 1, "zb-h1"),
    (_2T4, "bert-large", 12, 32, 4, "1f1b"), (_2T4, "bert-large", 12, 32, 2, "zb-h1"),
    (_2T4B, "gpt3-1.3b", 12, 8, None, "1f1b"), (_2T4B, "gpt3-1.3b", 12, 8, 1, "zb-h1"),
    (_2T4B, "llama-13b", 8, 4, 1, "1f1b"), (_2T4B, "llama-13b", 8, 4, 1, "zb-h1"),
    (_2T4C, "gpt3-2.7b", 8, 8, 2, "1f1b"), (_2T4C, "gpt3-2.7b", 8, 8, 2, "zb-h1"),
    (_2T4C, "bert-large", 8, 16, None, "1f1b"), (_2T4C, "bert-large", 8, 16, None, "zb-h1"),
    (_3T4, "gpt3-1.3b", 8, 8, 1, "1f1b"), (_3T4, "gpt3-1.3b", 8, 8, 1, "zb-h1"),
    (_3T4, "llama-7b", 8, 8, 2, "1f1b"), (_3T4, "llama-7b", 8, 8, 2, "zb-h1"),
    (_3T5, "bert-large", 8, 8, 1, "1f1b"), (_3T5, "bert-large", 8, 8, 1, "zb-h1"),
    (_3T5, "gpt3-1.3b", 8, 8, 2, "1f1b"), (_3T5, "gpt3-1.3b", 8, 8, 2, "zb-h1"),
    (_2T6, "gpt3-1.3b", 8, 8, 1, "1f1b"), (_2T6, "gpt3-1.3b", 8, 8, 1, "zb-h1"),
    (_2T6, "llama-7b", 8, 6, 1, "1f1b"), (_2T6, "llama-7b", 8, 6, 1, "zb-h1"),
    (_3T6, "gpt3-1.3b", 8, 6, 1, "1f1b"), (_3T6, "gpt3-1.3b", 8, 6, 1, "zb-h1"),
]
QUICK = [0, 3, 12, 17, 23, 29]
_1A2V = (("A100-40GB", 1), ("V100", 2))
# (nodes, model, layers, seq_len, global batch, micro-batch or None for auto, schedule), planned with recompute=auto
RECOMPUTE_INSTANCES = [     # in each the optimum recomputes on some stage
    (_1A2V, "llama-7b", 8, 8192, 4, None, "1f1b"), (_1A2V, "llama-7b", 8, 40960, 4, None, "1f1b"),
    ((("A10", 2), ("V100", 1)), "gpt3-2.7b", 6, 65536, 4, None, "1f1b"),
    ((("A10", 2), ("V100", 2)), "llama-7b", 8, 40960, 4, 1, "1f1b"),
    ((("A10", 2), ("L40S", 1)), "llama-7b", 6, 65536, 4, None, "1f1b"),
]


def tiny_cluster(nodes):
    return cluster_from_dict({"name": "tiny", "network": {"inter_node_gbps": 200},
                              "nodes": [{"name": f"n{i}", "device": d, "count": c} for i, (d, c) in enumerate(nodes)]})


def describe(plan) -> list[dict]:
    """A plan's pipelines as plain data: micro-batches, size, and (node, type, TP, layers) per stage."""
    return [{"num_microbatches": p.num_microbatches, "micro_batch": plan.micro_batch_of(k),
             "stages": [f"{s.node}:{s.device_type}:tp{s.tp}:[{s.layers[0]},{s.layers[1]})" for s in p.stages]}
            for k, p in enumerate(plan.pipelines)]


def run_instance(instance, recompute: str = "none", seq_len: int | None = None,
                 micro_batches: tuple[int, ...] = PROFILED_MICRO_BATCHES) -> dict:
    nodes, name, layers, batch, micro_batch, schedule = instance
    cluster = tiny_cluster(nodes)
    model = replace(PRESETS[name], num_layers=layers, **({"max_seq_len": seq_len} if seq_len else {}))
    seq = model.max_seq_len
    profile = analytic_profile(model, cluster, seq, micro_batches=micro_batches)
    t0 = time.process_time()
    result, _ = plan_with_baselines(cluster=cluster, model=model, profile=profile, global_batch=batch, seq_len=seq,
                                    micro_batch=micro_batch, schedules=(schedule,), recompute=recompute)
    t1 = time.process_time()
    sizes = [micro_batch] if micro_batch else [s for s in micro_batches if s <= batch]
    best = exhaustive_best(cluster, model, profile, batch, seq, sizes, schedules=(schedule,),
                           mixed_micro_batches=micro_batch is None, recompute=recompute)
    t2 = time.process_time()
    bound = lower_bound_iteration_s(cluster=cluster, model=model, profile=profile, global_batch=batch,
                                    seq_len=seq, schedules=(schedule,), recompute=recompute)
    planner_s, optimum_s = result.evaluation.iteration_time_s, best[1].iteration_time_s
    return {"cluster": "+".join(f"{c}x{d}" for d, c in nodes), "model": name, "layers": layers, "batch": batch,
            "micro_batch": micro_batch or "auto", "schedule": schedule, "planner_s": planner_s,
            "optimum_s": optimum_s, "gap": planner_s / optimum_s - 1, "bound_s": bound,
            "optimum_over_bound": optimum_s / bound - 1, "planner_cpu_s": t1 - t0, "exhaustive_cpu_s": t2 - t1,
            "planner_plan": describe(result.plan), "optimum_plan": describe(best[0]),
            "recomputing_stages": sum(s.recompute for p in best[0].pipelines for s in p.stages)}


def run_recompute_instance(instance) -> dict:
    """One of RECOMPUTE_INSTANCES, planned and searched with recompute="auto" (micro-batch sizes 1 and 2)."""
    nodes, name, layers, seq, batch, micro_batch, schedule = instance
    return run_instance((nodes, name, layers, batch, micro_batch, schedule), recompute="auto", seq_len=seq,
                        micro_batches=(1, 2)) | {"seq_len": seq}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"only instances {QUICK}")
    args = parser.parse_args(argv)
    print("[analytic profile: predictions of the cost model]")
    rows = []
    for i in QUICK if args.quick else range(len(INSTANCES)):
        row = run_instance(INSTANCES[i])
        rows.append(row)
        flag = "" if row["gap"] <= BAR else "  <-- MISSED"
        print(f"  #{i:<2} {row['cluster']:<30} {row['model']:<10} L={row['layers']:<2} B={row['batch']:<2} "
              f"mb={row['micro_batch']!s:<4} {row['schedule']:<5} planner {row['planner_s']:.5f} s  optimum "
              f"{row['optimum_s']:.5f} s  gap {100 * row['gap']:+.2f}%  (bound +{100 * row['optimum_over_bound']:.0f}%"
              f"; cpu {row['planner_cpu_s']:.1f} + {row['exhaustive_cpu_s']:.1f} s){flag}", flush=True)
        if row["gap"] > BAR:
            print(f"       planner: {row['planner_plan']}\n       optimum: {row['optimum_plan']}", flush=True)
    print("memory-tight instances, --recompute auto (the exhaustive search tries each stage with and without):")
    recomputing = []
    for i, instance in enumerate(RECOMPUTE_INSTANCES[:2] if args.quick else RECOMPUTE_INSTANCES):
        row = run_recompute_instance(instance)
        recomputing.append(row)
        print(f"  r{i:<2} {row['cluster']:<30} {row['model']:<10} L={row['layers']:<2} seq={row['seq_len']:<6} "
              f"B={row['batch']:<2} mb={row['micro_batch']!s:<4} {row['schedule']:<5} planner {row['planner_s']:.5f} s"
              f"  optimum {row['optimum_s']:.5f} s ({row['recomputing_stages']} stages recompute)  gap "
              f"{100 * row['gap']:+.2f}%  (bound +{100 * row['optimum_over_bound']:.0f}%)"
              f"{'  <-- MISSED' if row['gap'] > BAR else ''}", flush=True)
    failing = [r for r in rows if r["gap"] > BAR]
    print(json.dumps({"instances": len(rows), "bar": BAR, "max_gap": max(r["gap"] for r in rows),
                      "within_bar": len(rows) - len(failing),
                      "max_optimum_over_bound": max(r["optimum_over_bound"] for r in rows),
                      "exhaustive_cpu_s": sum(r["exhaustive_cpu_s"] for r in rows),
                      "planner_cpu_s": sum(r["planner_cpu_s"] for r in rows),
                      "failing": failing,
                      "recompute": {"instances": len(recomputing), "max_gap": max(r["gap"] for r in recomputing),
                                    "within_bar": sum(r["gap"] <= BAR for r in recomputing),
                                    "failing": [r for r in recomputing if r["gap"] > BAR]}}))


if __name__ == "__main__":
    main()
