"""The planner against the independent exhaustive search (tests/exhaustive.py) under money goals
(cost/money.py), on tiny instances (MONEY_INSTANCES, 31): `cost` ($ per token; the planner may
leave GPUs out, and the searcher tries every subset of them) and `budget` (the most samples/s within 75% of
what all the nodes cost). The gap is planner key / optimum key - 1 (key: $ per iteration, or seconds under a
budget); the bar is <= 1% on every instance. Prices: TEST_PRICES below (on-demand list-like figures per GPU, spot
at 40%), with every instance's first node on spot; each node is billed whole, as an instance of its GPUs
(cost/money.py), so a plan that uses one GPU of a 2-GPU node pays for both. Analytic profile: predictions of the
cost model.

    python -m benchmarks run optimality:money [-- --goal cost|budget] [--only 0,3,...]
"""
from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import replace

from autohet_ray import ConfigError
from autohet_ray.cluster import cluster_from_dict
from autohet_ray.cost.money import Goal, Price, Prices, cluster_usd_per_hour
from autohet_ray.model import PRESETS
from autohet_ray.planner import plan_with_baselines
from autohet_ray.profile.analytic import analytic_profile
from benchmarks.optimality.plans import BAR, PROFILED_MICRO_BATCHES, describe
from tests.exhaustive import exhaustive_best

ON_DEMAND = {"H800": 12.29, "H100": 12.29, "H200": 14.0, "H20": 5.12, "A100-80GB": 5.12, "A100-40GB": 4.09,
             "V100": 3.06, "L40S": 3.77, "A10": 1.21}
TEST_PRICES = Prices.of_gpus({d: Price(on_demand=p, spot=round(0.4 * p, 2)) for d, p in ON_DEMAND.items()})
BUDGET_SHARE = 0.75
_2A1H = (("A100-80GB", 2), ("H20", 1))
_2H1A = (("H800", 2), ("A100-80GB", 1))
_2L1H = (("L40S", 2), ("H100", 1))
_1H2L = (("H100", 1), ("L40S", 2))
_2A2V = (("A100-40GB", 2), ("V100", 2))
_2H2H = (("H800", 2), ("H20", 2))
# (nodes, model, layers, global batch, micro-batch or None for auto, schedule): models big enough that the
# cheapest plan needs more than one GPU, batches up to 64, micro-batches up to 4, pipelines of 1-3 stages
MONEY_INSTANCES = [(nodes, model, layers, batch, mb, "1f1b")
                   for nodes in (_2A1H, _2H1A, _2L1H, _1H2L, _2A2V, _2H2H)
                   for model, layers, batch, mb in (("llama-13b", 16, 8, 1), ("llama-7b", 8, 32, 2),
                                                    ("llama-13b", 16, 64, 4), ("gpt3-6.7b", 16, 16, None),
                                                    ("llama-7b", 16, 32, 2))] + [
    (_2H2H, "gpt3-1.3b", 8, 64, 4, "1f1b")]       # (#22 fits nowhere: 31 instances, 30 with a plan)
# two GPUs of one type and one of another, global batch 32, micro-batch 2: where two pipelines of different depth
# sharing a type, with uneven micro-batch counts, beat the planner by up to 10.5% (closed by
# planner/candidates/enumerate_groupings.py and every stage order of short pipelines); also at batch 64, micro-batch 4
SHAPE_INSTANCES = [(nodes, model, 8, batch, mb, "1f1b")
                   for nodes in ((("H800", 2), ("H20", 1)), (("H20", 2), ("H800", 1)), _2A1H,
                                 (("A100-40GB", 2), ("V100", 1)), _2L1H, (("V100", 2), ("A100-80GB", 1)))
                   for model in ("gpt3-1.3b", "llama-7b") for batch, mb in ((32, 2), (64, 4))]


def money_cluster(nodes):
    """The tiny cluster of an instance, its first node on spot."""
    return cluster_from_dict({"name": "tiny", "network": {"inter_node_gbps": 200},
                              "nodes": [{"name": f"n{i}", "device": d, "count": c, "spot": i == 0}
                                        for i, (d, c) in enumerate(nodes)]})


def goal_for(kind: str, cluster) -> Goal:
    if kind == "throughput":
        return Goal(prices=TEST_PRICES)
    if kind == "cost":
        return Goal(objective="cost", prices=TEST_PRICES)
    return Goal(prices=TEST_PRICES, max_usd_per_hour=BUDGET_SHARE * cluster_usd_per_hour(cluster, TEST_PRICES))


def run_money_instance(instance, kind: str) -> dict:
    nodes, name, layers, batch, micro_batch, schedule = instance
    cluster = money_cluster(nodes)
    model = replace(PRESETS[name], num_layers=layers)
    seq = model.max_seq_len
    profile = analytic_profile(model, cluster, seq, micro_batches=PROFILED_MICRO_BATCHES)
    goal = goal_for(kind, cluster)
    t0 = time.process_time()
    try:
        result, _ = plan_with_baselines(cluster=cluster, model=model, profile=profile, global_batch=batch,
                                        seq_len=seq, micro_batch=micro_batch, schedules=(schedule,), goal=goal)
        mine, reason = goal.key(result.plan, cluster, result.evaluation.iteration_time_s), None
    except ConfigError as err:          # no plan: the exhaustive search must agree
        result, mine, reason = None, math.inf, str(err)
    t1 = time.process_time()
    sizes = [micro_batch] if micro_batch else [s for s in PROFILED_MICRO_BATCHES if s <= batch]
    best = exhaustive_best(cluster, model, profile, batch, seq, sizes, schedules=(schedule,),
                           mixed_micro_batches=micro_batch is None, goal=goal)
    t2 = time.process_time()
    optimum = goal.key(best[0], cluster, best[1].iteration_time_s) if best else math.inf
    return {"cluster": "+".join(f"{c}x{d}" for d, c in nodes), "model": name, "layers": layers, "batch": batch,
            "micro_batch": micro_batch or "auto", "schedule": schedule, "goal": kind, "planner_key": mine,
            "optimum_key": optimum, "gap": 0.0 if mine == optimum else mine / optimum - 1, "planner_cpu_s": t1 - t0,
            "exhaustive_cpu_s": t2 - t1, "planner_gpus": result.plan.num_devices if result else 0,
            "optimum_gpus": best[0].num_devices if best else 0, "planner_reason": reason,
            "planner_plan": describe(result.plan) if result else None,
            "optimum_plan": describe(best[0]) if best else None}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--goal", choices=("throughput", "cost", "budget"), default="cost")
    parser.add_argument("--shapes", action="store_true", help="SHAPE_INSTANCES instead of MONEY_INSTANCES")
    parser.add_argument("--only", help="comma-separated instance indices")
    args = parser.parse_args(argv)
    instances = SHAPE_INSTANCES if args.shapes else MONEY_INSTANCES
    indices = [int(i) for i in args.only.split(",")] if args.only else range(len(instances))
    rows = []
    for i in indices:
        row = run_money_instance(instances[i], args.goal)
        rows.append(row)
        print(f"  #{i:<2} {row['cluster']:<30} {row['model']:<10} L={row['layers']:<2} B={row['batch']:<2} "
              f"{row['schedule']:<5} gap {100 * row['gap']:+.2f}% gpus {row['planner_gpus']}/{row['optimum_gpus']} "
              f"cpu {row['planner_cpu_s']:.1f}+{row['exhaustive_cpu_s']:.1f} s"
              f"{'  <-- MISSED' if row['gap'] > BAR else ''}", flush=True)
        if row["gap"] > BAR:
            print(f"       planner: {row['planner_plan'] or row['planner_reason']}\n"
                  f"       optimum: {row['optimum_plan']}", flush=True)
    print(json.dumps({"goal": args.goal, "instances": len(rows), "max_gap": max(r["gap"] for r in rows),
                      "within_bar": sum(r["gap"] <= BAR for r in rows)}))


if __name__ == "__main__":
    main()
