"""Which plans sharded optimizer state makes better: predicted samples/s with `--optimizer-sharding none` vs
`auto` (recomputation "auto" both ways, so each plan recomputes only where it must), on issue 33's fleets and
two where no gain is expected.

Predictions of the cost model with the analytic profile (bf16), not measurements. `auto` runs the very search
`none` runs, with the same time limit, then the sharded searches (planner/passes/sharding.py), each with that limit
too; so where no search of a row hits its limit (the `hit` column; the search is deterministic then) auto is
never slower than none. Beside each row: the planner's proven upper bound on samples/s (planner/bounds/bound.py) with
sharding "none" and "auto", pipelines, recomputing and sharded stages, and each mode's planning wall seconds.
Ends with one JSON line.

    python -m benchmarks run sharding-gains -- [--time-limit 300] [--global-batch N] [--seq-len S] [--rows 0,2]

Each plan's JSON also gives its TP degrees and where its GPUs' time goes (cost/breakdown.py: compute, stage
imbalance, pipeline fill/drain, waiting for other pipelines, sync+optimizer tail), to tell a gain that comes
from a smaller bubble from one that comes from fitting a faster layout.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import time

from autohet_ray.cluster import load_cluster
from autohet_ray.cost.breakdown import time_breakdown
from autohet_ray.model import PRESETS
from autohet_ray.planner.bounds.bound import lower_bound_iteration_s
from autohet_ray.planner.search import plan_training, token_cap_sizes
from autohet_ray.profile import analytic_profile
from autohet_ray.profile.analytic import with_micro_batches
from autohet_ray import ConfigError

CLUSTERS = pathlib.Path(__file__).resolve().parents[1] / "jobs" / "clusters"
# (model, cluster file, global batch, sequence length, why it is here)
FLEETS = [
    ("llama-13b", "v100-16gb-a100-24", 256, 2048, "issue 33"),
    ("llama-7b", "a10-l40s-h100-20", 256, 2048, "issue 33"),
    ("llama2-70b", "a100-40gb-l40s-64", 256, 4096, "issue 33"),
    ("gpt3-6.7b", "paper-24", 256, 2048, "issue 33"),
    ("gpt3-1.3b", "h200-8", 256, 2048, "no gain expected: 141 GB per GPU, state never binds"),
    ("bert-large", "paper-24", 1024, 512, "no gain expected: 0.34 B parameters on 80-96 GB GPUs"),
]


def _plan(model, cluster, profile, batch, seq, mode, limit):
    start = time.perf_counter()
    try:
        r = plan_training(cluster=cluster, model=model, profile=profile, global_batch=batch, seq_len=seq,
                          time_limit_s=limit, recompute="auto", optimizer_sharding=mode)
    except ConfigError as err:
        return {"feasible": False, "reason": str(err)[:160], "wall_s": time.perf_counter() - start}
    stages = [s for p in r.plan.pipelines for s in p.stages]
    return {"feasible": True, "samples_per_s": r.evaluation.samples_per_s,
            "iteration_s": r.evaluation.iteration_time_s, "pipelines": len(r.plan.pipelines),
            "stages": len(stages), "recompute_stages": sum(s.recompute for s in stages),
            "sharded_stages": sum(s.shard_optimizer for s in stages), "micro_batch": r.plan.micro_batch,
            "hit_time_limit": r.hit_time_limit, "tp": sorted({s.tp for s in stages}),
            "gpu_time": {k: round(v, 4) for k, v in time_breakdown(r.plan, r.evaluation).items()},
            "wall_s": time.perf_counter() - start}


def _cell(x: dict) -> str:
    if not x["feasible"]:
        return f"{'infeasible':>40}"
    return (f"{x['samples_per_s']:8.2f} pp {x['pipelines']:>2} rc {x['recompute_stages']:>2}/{x['stages']:<2} "
            f"sh {x['sharded_stages']:>2} {x['wall_s']:5.0f}s{'*' if x['hit_time_limit'] else ' '}")


def _bound(model, cluster, profile, batch, seq, mode) -> float:
    """The planner's proven upper bound on samples/s (recomputation allowed, sharding `mode`)."""
    t = lower_bound_iteration_s(cluster=cluster, model=model, profile=profile, global_batch=batch, seq_len=seq,
                                recompute="auto", optimizer_sharding=mode)
    return batch / t


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--time-limit", type=float, default=300.0, help="seconds per search (none: one; auto: several)")
    ap.add_argument("--global-batch", type=int, help="every fleet at this global batch (default: each its own)")
    ap.add_argument("--seq-len", type=int, help="every fleet at this sequence length (default: each its own)")
    ap.add_argument("--rows", help="comma-separated row indices to run (default: all)")
    args = ap.parse_args(argv)
    picked = [FLEETS[int(i)] for i in args.rows.split(",")] if args.rows else FLEETS
    rows = []
    print(f"{'model':<11} {'fleet':<18} {'none s/s':>8} {'':>31}   {'auto s/s':>8} {'':>31}   gain    "
          f"bound none/auto   (pp pipelines, rc recomputing/stages, sh sharded stages, planning wall, * hit limit)")
    for name, fleet, batch, seq, why in picked:
        batch, seq = args.global_batch or batch, args.seq_len or seq
        model, cluster = PRESETS[name], load_cluster(str(CLUSTERS / f"{fleet}.yaml"))
        profile = analytic_profile(model, cluster, seq, with_micro_batches(*token_cap_sizes(seq)))
        none = _plan(model, cluster, profile, batch, seq, "none", args.time_limit)
        auto = _plan(model, cluster, profile, batch, seq, "auto", args.time_limit)
        bound = {m: _bound(model, cluster, profile, batch, seq, m) for m in ("none", "auto")}
        gain = (auto["samples_per_s"] / none["samples_per_s"] if none["feasible"] and auto["feasible"]
                else ("newly feasible" if auto["feasible"] else None))
        rows.append({"model": name, "fleet": fleet, "global_batch": batch, "seq_len": seq, "why": why,
                     "none": none, "auto": auto, "gain": gain, "bound_samples_per_s": bound})
        shown = f"{gain:.3f}x" if isinstance(gain, float) else str(gain)
        print(f"{name:<11} {fleet:<18} {_cell(none)}   {_cell(auto)}   {shown:<7} "
              f"{bound['none']:8.2f}/{bound['auto']:.2f}", flush=True)
    print(json.dumps({"bench": "sharding_gains", "time_limit_s": args.time_limit, "load_average": os.getloadavg(),
                      "rows": rows}))


if __name__ == "__main__":
    main()
