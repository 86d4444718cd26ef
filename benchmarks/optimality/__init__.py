"""Optimality of the planner against the independent exhaustive search (tests/exhaustive.py), which shares only the
cost model with it: one case, three parts on tiny instances (analytic profile: predictions of the cost model):
- plans (plans.py): the most samples/s, 42 instances, and 5 memory-tight ones under `--recompute auto`;
- money (money.py): $ per token and the most samples/s within a budget, nodes billed whole;
- sharding (sharding.py): `--optimizer-sharding auto`, 30 instances.
Each part's bar is <= 1% above the optimum on every instance. plans.py holds what the parts share (BAR,
tiny_cluster, describe). Without `--part` the three run in turn (`--quick`: a few instances each) and the last
line holds each part's result.

    python -m benchmarks run optimality [--quick]
    python -m benchmarks run optimality:money -- --goal budget
"""
from __future__ import annotations

import argparse
import json

from benchmarks.harness import run_module

PARTS = ("plans", "money", "sharding")
QUICK = {"plans": ["--quick"], "money": ["--only", "0,1"], "sharding": ["--rows", "0,3"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=PARTS, help="one part, with its own options after it (default: all three)")
    ap.add_argument("--quick", action="store_true", help=f"all parts on a few instances: {QUICK}")
    args, rest = ap.parse_known_args(argv)
    if args.part:
        return run_module(f"optimality.{args.part}", (QUICK[args.part] if args.quick else []) + rest)[0]
    results = {}
    for part in PARTS:
        code, results[part] = run_module(f"optimality.{part}", (QUICK[part] if args.quick else []) + rest)
        if code:
            return code
    print(json.dumps({"parts": results, "max_gap": max(r["max_gap"] for r in results.values())}))
    return 0
