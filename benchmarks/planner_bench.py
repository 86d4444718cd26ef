"""Planner benchmark: optimality vs exhaustive search, the whole `autohet plan` command's wall time (baselines
included) beside the solve time vs cluster size, gains over Megatron-LM on all GPUs, Megatron-LM on the best
GPU subset and Whale on the paper's 24-GPU mixes, and efficiency vs each GPU type's sub-cluster alone.

All figures use the analytic profile (derived from the device catalog), so they are predictions of the cost
model, not measurements on GPUs. Ends with one JSON line.

The gains table gives every model the same tokens per global batch (GAIN_TOKENS; LLM recipes state batches in
tokens), so BERT-Large (512-token sequences) runs 4x the sequences of the 2048-token models. A second table
runs BERT-Large at 1/4 and 1/2 of that: with fewer micro-batches per pipeline, the fill/drain of every
pipeline and the coarser split of the batch weigh more against each GPU type alone (pure data parallelism).

    python -m benchmarks run planner -- [--quick] [--only deep]

`--only deep` compares the search with and without the deep pipeline templates (planner/candidates/templates.py).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import subprocess
import sys
import time


from autohet_ray.cluster import cluster_from_dict, load_cluster
from autohet_ray.cost.breakdown import breakdown_line, time_breakdown
from autohet_ray.model import PRESETS
from autohet_ray.planner import plan_with_baselines, strongest_baseline
from autohet_ray.planner.search import plan_training, token_cap_sizes
from autohet_ray.profile import analytic_profile
from tests.exhaustive import exhaustive_best

CLUSTERS = pathlib.Path(__file__).resolve().parents[1] / "jobs" / "clusters"
PAPER = {("bert-large", "megatron"): 1.38, ("gpt3-1.3b", "megatron"): 1.53, ("gpt3-1.3b", "whale"): 1.27,
         ("llama-7b", "megatron"): 1.79, ("llama-7b", "whale"): 1.51}

# (nodes as (device, GPUs), model, global batch): 2-3 types, 3-6 GPUs, so that exhaustive search finishes
SMALL = [
    ((("H800", 2), ("H20", 2)), "gpt3-1.3b", 32), ((("H800", 2), ("H20", 2)), "llama-7b", 16),
    ((("H800", 2), ("H20", 2)), "bert-large", 64), ((("A100-80GB", 2), ("H20", 2)), "gpt3-2.7b", 16),
    ((("A100-40GB", 2), ("H20", 2)), "llama-7b", 16), ((("H800", 1), ("A100-80GB", 2)), "gpt3-1.3b", 24),
    ((("H800", 1), ("H20", 1), ("A100-80GB", 1)), "gpt3-1.3b", 24),
    ((("H800", 1), ("H20", 1), ("A100-80GB", 1)), "llama-7b", 12),
    ((("H800", 1), ("H20", 1), ("A100-80GB", 1)), "bert-large", 48),
    ((("H100", 2), ("L40S", 2)), "gpt3-1.3b", 16), ((("H100", 2), ("L40S", 2)), "bert-large", 32),
    ((("A100-40GB", 2), ("V100", 2)), "bert-large", 32), ((("A100-40GB", 2), ("V100", 2)), "gpt3-1.3b", 16),
    ((("H200", 1), ("RTX-4090", 2)), "gpt3-1.3b", 16), ((("H20", 2), ("L20", 2)), "gpt3-2.7b", 16),
    ((("H800", 2), ("A10", 2)), "bert-large", 32), ((("H800", 1), ("H20", 2), ("L40S", 1)), "gpt3-1.3b", 16),
    ((("A100-80GB", 1), ("H20", 1), ("L40S", 2)), "bert-large", 32),
    ((("H800", 2), ("H20", 1), ("A100-40GB", 1)), "llama-7b", 8),
    ((("H100", 1), ("A100-80GB", 1), ("H20", 1)), "gpt3-6.7b", 8),
]
# whole-command bars (issue 17): <= 5 s up to 64 GPUs, <= 20 s at 256, <= 60 s at 1024
SCALE = [("a100-h20-v100-12", "llama-7b", 512), ("h100-l40s-a10-14", "llama-7b", 512),
         ("three-type-64", "llama-13b", 1024), ("four-type-256", "gpt3-13b", 2048), ("mixed-1024", "llama-13b", 4096)]
QUICK_SCALE = 3
# issue 34's whole-command bars: <= 5 s at 64 GPUs (llama2-70b: both objectives), <= 60 s at 1024
PRICED = ["--prices", str(pathlib.Path(__file__).resolve().parents[1] / "jobs" / "clusters" / "prices.yaml")]
MONEY_SCALE = [("three-type-64", "llama-13b", 1024, ["--objective", "cost"]),
               ("a100-40gb-l40s-64", "llama2-70b", 1024, ["--recompute", "auto"]),
               ("a100-40gb-l40s-64", "llama2-70b", 1024, ["--recompute", "auto", "--objective", "cost"]),
               ("mixed-1024", "llama-13b", 4096, ["--objective", "cost"])]
MIXES = ["paper-24", "uneven-4-4-16", "uneven-16-4-4"]
MODELS = ["bert-large", "gpt3-1.3b", "llama-7b"]
GAIN_TOKENS = 768 * 2048     # tokens per global batch (1.57 M; GPT-3 trained its 1.3B-6.7B models on 1-2 M)
SWEEP_MODEL, SWEEP_BATCHES = "bert-large", (768, 1536)   # sequences of 512 tokens: 0.4 M and 0.8 M tokens


def _tiny(nodes):
    return cluster_from_dict({"name": "small", "network": {"inter_node_gbps": 200},
                              "nodes": [{"name": f"n{i}", "device": d, "count": c} for i, (d, c) in enumerate(nodes)]})


def optimality(quick: bool) -> list[dict]:
    rows = []
    for nodes, model_name, batch in SMALL[:4] if quick else SMALL:
        cluster, model = _tiny(nodes), PRESETS[model_name]
        profile = analytic_profile(model, cluster, model.max_seq_len, micro_batches=(1, 2))
        t0 = time.perf_counter()
        result, _ = plan_with_baselines(cluster=cluster, model=model, profile=profile, global_batch=batch,
                                        seq_len=model.max_seq_len)
        solve = time.perf_counter() - t0
        found = exhaustive_best(cluster, model, profile, batch, model.max_seq_len, [1, 2])
        best = found[1].iteration_time_s
        gap = result.evaluation.iteration_time_s / best - 1
        rows.append({"cluster": "+".join(f"{c}x{d}" for d, c in nodes), "model": model_name, "batch": batch,
                     "planner_s": result.evaluation.iteration_time_s, "exhaustive_s": best, "gap": gap,
                     "solve_time_s": solve})
        print(f"  {rows[-1]['cluster']:<34} {model_name:<11} B={batch:<3} planner {rows[-1]['planner_s']:.4f} s "
              f"exhaustive {best:.4f} s gap {100 * gap:+.3f}%  ({solve:.1f} s)", flush=True)
    return rows


def _whole_command(name: str, model_name: str, batch: int, extra: tuple = ()) -> tuple[dict, float, float]:
    """`autohet plan --json` as a user runs it: its report, wall seconds and CPU seconds (children's)."""
    cli = pathlib.Path(sys.executable).with_name("autohet")
    before, t0 = os.times(), time.perf_counter()
    out = subprocess.run([str(cli), "plan", "--cluster", str(CLUSTERS / f"{name}.yaml"), "--model", model_name,
                          "--global-batch", str(batch), "--plan-time-limit-s", "300", "--json", *extra],
                         capture_output=True, text=True, check=True)
    wall, after = time.perf_counter() - t0, os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return json.loads(out.stdout), wall, cpu


def scaling(quick: bool) -> list[dict]:
    rows = []
    for name, model_name, batch in SCALE[:QUICK_SCALE] if quick else SCALE:
        gpus = load_cluster(str(CLUSTERS / f"{name}.yaml")).num_gpus
        doc, wall, cpu = _whole_command(name, model_name, batch)
        rows.append({"cluster": name, "gpus": gpus, "model": model_name, "global_batch": batch,
                     "wall_time_s": wall, "cpu_time_s": cpu, "solve_time_s": doc["solve_time_s"],
                     "load_avg_1m": os.getloadavg()[0], "hit_time_limit": doc["hit_time_limit"],
                     "samples_per_s": doc["predicted"]["samples_per_s"],
                     "gain_strongest": doc["gains"].get(doc["strongest_baseline"]),
                     "bound_gap": _bound_gap(doc)})
        growth = ""
        if len(rows) > 1 and 2 * rows[-2]["gpus"] <= gpus:
            prev = rows[-2]
            growth = (f", growth x{wall / prev['wall_time_s']:.1f} wall for x{gpus / prev['gpus']:.0f} GPUs "
                      f"(~GPUs^{math.log(wall / prev['wall_time_s']) / math.log(gpus / prev['gpus']):.2f})")
        print(f"  {name:<17} {gpus:>5} GPUs {model_name:<10} B={batch:<5} whole command {wall:6.1f} s wall, "
              f"{cpu:6.1f} s CPU (solve {doc['solve_time_s']:.1f} s; load {rows[-1]['load_avg_1m']:.1f})"
              f"{' TIME LIMIT HIT' if doc['hit_time_limit'] else ''}{growth}", flush=True)
        if rows[-1]["bound_gap"] is not None:
            print(f"  {'':<17} plan {100 * rows[-1]['bound_gap']:+.1f}% above the proven lower bound "
                  f"({doc['lower_bound_iteration_s']:.3f} s/iteration)", flush=True)
    return rows


def money_scaling(quick: bool) -> list[dict]:
    """Issue 34's commands (prices, cost objective, llama2-70b with --recompute auto) as a user runs them."""
    rows = []
    for name, model_name, batch, extra in MONEY_SCALE[:3] if quick else MONEY_SCALE:
        doc, wall, cpu = _whole_command(name, model_name, batch, (*PRICED, *extra))
        rows.append({"cluster": name, "model": model_name, "global_batch": batch, "options": " ".join(extra),
                     "wall_time_s": round(wall, 2), "cpu_time_s": round(cpu, 2), "load_avg_1m": os.getloadavg()[0],
                     "hit_time_limit": doc["hit_time_limit"], "samples_per_s": doc["predicted"]["samples_per_s"],
                     "usd_per_million_tokens": doc["money"]["plan"]["usd_per_million_tokens"]})
        print(f"  {name:<17} {model_name:<10} B={batch:<5} {' '.join(extra):<34} {wall:6.1f} s wall, {cpu:6.1f} s "
              f"CPU (load {rows[-1]['load_avg_1m']:.1f})", flush=True)
    return rows


def _bound_gap(doc: dict) -> float | None:
    """How far the plan's predicted iteration lies above the proven lower bound (planner/bounds/bound.py)."""
    bound = doc.get("lower_bound_iteration_s")
    return doc["predicted"]["iteration_time_s"] / bound - 1 if bound else None


def _sub_cluster(cluster, device):
    raw = cluster.to_dict()
    raw["nodes"] = [n for n in raw["nodes"] if n["device"] == device]
    return cluster_from_dict(raw)


def _best_alone(cluster, model, batch):
    total = 0.0
    for device in cluster.device_types():
        sub = _sub_cluster(cluster, device)
        try:
            r = plan_training(cluster=sub, model=model, profile=analytic_profile(model, sub, model.max_seq_len),
                              global_batch=batch, seq_len=model.max_seq_len, time_limit_s=60)
            total += r.evaluation.samples_per_s
        except ValueError:
            pass                       # this type cannot hold the model on its own
    return total


def gain_batch(model) -> int:
    """Sequences per global batch: GAIN_TOKENS tokens at the model's sequence length."""
    return GAIN_TOKENS // model.max_seq_len


def _gain_row(mix: str, model_name: str, batch: int) -> dict:
    cluster, model = load_cluster(str(CLUSTERS / f"{mix}.yaml")), PRESETS[model_name]
    profile = analytic_profile(model, cluster, model.max_seq_len,
                               micro_batches=tuple(token_cap_sizes(model.max_seq_len)))
    result, baselines = plan_with_baselines(cluster=cluster, model=model, profile=profile,
                                            global_batch=batch, seq_len=model.max_seq_len)
    row = {"cluster": mix, "model": model_name, "global_batch": batch,
           "samples_per_s": result.evaluation.samples_per_s, "solve_time_s": result.solve_time_s}
    for name, b in baselines.items():
        row[f"gain_{name}"] = (b.evaluation.iteration_time_s / result.evaluation.iteration_time_s
                               if b.evaluation else None)
    strongest = strongest_baseline(baselines)
    row["strongest_baseline"], row["gain_strongest"] = strongest, row.get(f"gain_{strongest}")
    row["efficiency"] = result.evaluation.samples_per_s / _best_alone(cluster, model, batch)
    row["time_breakdown"] = {k: round(v, 4) for k, v in time_breakdown(result.plan, result.evaluation).items()}
    fmt = lambda g: "  n/a " if g is None else f"{g:5.2f}x"  # noqa: E731
    print(f"  {mix:<14} {model_name:<11} B={batch:<5} {row['samples_per_s']:8.1f} samples/s  vs Megatron "
          f"{fmt(row['gain_megatron'])} (paper {PAPER.get((model_name, 'megatron'), '-')})  vs Megatron on the "
          f"best subset {fmt(row['gain_megatron-subset'])}  vs Whale {fmt(row['gain_whale'])} "
          f"(paper {PAPER.get((model_name, 'whale'), '-')})  efficiency {row['efficiency']:.3f}", flush=True)
    print(f"  {'':<14} {breakdown_line(row['time_breakdown'])}", flush=True)
    return row


def gains(quick: bool) -> list[dict]:
    return [_gain_row(mix, name, gain_batch(PRESETS[name]))
            for mix in (MIXES[:1] if quick else MIXES) for name in MODELS]


def batch_sweep(quick: bool) -> list[dict]:
    """BERT-Large at fewer tokens per batch than the gains table: how efficiency falls as pipelines get
    fewer micro-batches (fill/drain) and the batch splits more coarsely."""
    return [_gain_row(mix, SWEEP_MODEL, batch)
            for mix in (MIXES[:1] if quick else MIXES) for batch in (SWEEP_BATCHES[:1] if quick else SWEEP_BATCHES)]


# (cluster, model, global batch, sequence length, recompute): where deep templates (planner/candidates/templates.py) pay
DEEP = [("v100-16gb-a100-24", "llama-13b", 256, 2048, "auto"), ("a100-40gb-l40s-64", "llama2-70b", 512, 1024, "none"),
        ("three-type-64", "llama-13b", 1024, 2048, "none"), ("a100-40gb-l40s-64", "llama2-70b", 1024, 4096, "auto")]


def deep_search(quick: bool) -> list[dict]:
    """The planner's best plan and its CPU seconds without and with the deep templates (plan_training only)."""
    from autohet_ray.planner.candidates import templates
    rows, deepest = [], templates.DEEP_STAGES_UP_TO
    for name, model_name, batch, seq, recompute in DEEP[:2] if quick else DEEP:
        model, cluster = PRESETS[model_name], load_cluster(str(CLUSTERS / f"{name}.yaml"))
        profile = analytic_profile(model, cluster, seq, micro_batches=tuple(token_cap_sizes(seq)))
        row = {"cluster": name, "model": model_name, "global_batch": batch, "seq_len": seq, "recompute": recompute}
        for label, depth in (("shallow", 0), ("deep", deepest)):
            templates.DEEP_STAGES_UP_TO = depth
            cpu = time.process_time()
            r = plan_training(cluster=cluster, model=model, profile=profile, global_batch=batch, seq_len=seq,
                              time_limit_s=300, recompute=recompute)
            row[label] = {"samples_per_s": round(r.evaluation.samples_per_s, 3),
                          "cpu_s": round(time.process_time() - cpu, 2), "hit_time_limit": r.hit_time_limit,
                          "stages": [len(p.stages) for p in r.plan.pipelines]}
        templates.DEEP_STAGES_UP_TO = deepest
        rows.append(row)
        print(f"  {name:<17} {model_name:<10} B={batch:<5} S={seq:<5} {row['shallow']} -> {row['deep']}", flush=True)
    return rows


def _rounded(row: dict) -> dict:
    return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a few rows of each table")
    ap.add_argument("--only", choices=["optimality", "scaling", "money", "gains", "sweep", "deep"],
                    help="run one table")
    args = ap.parse_args(argv)
    if args.only:
        table = {"optimality": optimality, "scaling": scaling, "money": money_scaling, "gains": gains,
                 "sweep": batch_sweep, "deep": deep_search}[args.only]
        rows = table(args.quick)
        print(json.dumps({args.only: rows}))
        return
    print("[analytic profile: predictions of the cost model]\nOptimality vs exhaustive search:")
    opt = optimality(args.quick)
    print("Whole-command time (autohet plan, baselines included) vs cluster size:")
    scale = scaling(args.quick)
    print(f"Gains over baselines ({GAIN_TOKENS / 1e6:.2f} M tokens per global batch):")
    gain = gains(args.quick)
    print(f"{SWEEP_MODEL} at smaller global batches:")
    sweep = batch_sweep(args.quick)
    print(json.dumps({
        "profile": "analytic",
        "optimality": {"instances": len(opt), "max_gap": max(r["gap"] for r in opt),
                       "within_1pct": sum(r["gap"] <= 0.01 for r in opt)},
        "whole_command_wall_s": {r["cluster"]: round(r["wall_time_s"], 2) for r in scale},
        "whole_command_cpu_s": {r["cluster"]: round(r["cpu_time_s"], 2) for r in scale},
        "solve_time_s": {r["cluster"]: round(r["solve_time_s"], 2) for r in scale},
        "bound_gap": {r["cluster"]: None if r["bound_gap"] is None else round(r["bound_gap"], 4) for r in scale},
        "gains": [_rounded(r) for r in gain],
        "batch_sweep": [_rounded(r) for r in sweep],
    }))


if __name__ == "__main__":
    main()
