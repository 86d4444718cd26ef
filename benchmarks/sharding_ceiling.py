"""How much sharded optimizer state could ever gain, in the cost model's own terms: two ceilings.

Sharding (cost/sharding.py) changes only three things against the same plan unsharded: (1) a stage keeps
weight + gradient + (master + moments) / holders per parameter; (2) it updates its slice only; (3) the all-reduce
becomes a reduce-scatter of the fp32 gradients, overlapped as the all-reduce was, plus an all-gather of the new
bf16 weights after the update: half the all-reduce's ring bytes, then a quarter (3 bytes per element, not 4).
Each ceiling is the planner's best plan for a relaxed fleet that grants more than any sharding can: the
optimizer step free (0 s per parameter on every device type) and the whole gradient sync priced at 3 bytes per
element, overlapped as the all-reduce is, with
- `zero1`: (master + moments) taking no memory at all (infinitely many holders): 6 bytes per parameter in
  bf16 (weight 2, fp32 gradient 4) instead of 18; activations, the reserve and capacity as modeled. No ZeRO-1
  plan, whatever its holders and slices, needs more memory or time than its unsharded copy priced here.
- `memory`: besides, memory never binding (every device type's memory raised to CEILING_MEMORY_GB through the
  cluster's `devices:` override, same names, so the profile is unchanged): an upper bound on any memory
  saving (activations, ZeRO-2/3 included), not only the optimizer state's.
Both searches are seeded with the `none` and `auto` plans (sharding and uneven slices stripped; the memory
ceiling also drops recomputation): each ceiling >= none and >= auto by construction, and the script asserts,
per plan, that its stripped copy priced on the relaxed fleet is no slower than its own price. If zero1 / none
< 1.15 on a fleet, no optimizer-state sharding can make it 15% faster in this cost model and search space.
`bound`: the planner's proven fluid bound (planner/bounds/bound.py: no bubbles, links or sync) on the relaxed fleet,
a bound on every plan, not only the searched ones.

Beside them, where each `none` plan's time goes, averaged over its GPUs (shares of the iteration, adding to 1):
compute (math of forward, backward, W), recompute (the forward again), tp_comm (TP collectives inside the
stages), bubble (idle inside its pipeline before its last gradient: fill/drain, links, slower stages),
dp_sync (gradient sync past its last gradient), optimizer (its update; sharded: with its all-gather),
wait (after its own update, for the slowest stage's).

    python -m benchmarks run sharding-ceiling -- [--time-limit 300] [--rows 0,1,2] [--global-batch N] [--seq-len S]
                                          [--no-auto] [--activation-scale 1.23]
Ends with one JSON line. Predictions of the analytic profile (bf16), not measurements.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import replace

from autohet_ray import ConfigError
from autohet_ray.cluster import load_cluster
from autohet_ray.cost.evaluate import best_schedule
from autohet_ray.cost.sharding import RING_SHARES
from autohet_ray.cost.terms import plan_tables
from autohet_ray.model import PRESETS
from autohet_ray.planner.bounds.bound import lower_bound_iteration_s
from autohet_ray.planner.search import plan_training, token_cap_sizes
from autohet_ray.profile import analytic_profile
from autohet_ray.profile.analytic import with_micro_batches
from autohet_ray.profile.precision import PRECISIONS
from benchmarks.sharding_gains import CLUSTERS, FLEETS

CEILING_MEMORY_GB = 1e6            # 1 PB per device: no plan of these models comes near it
ZERO1_DTYPE = "bfloat16-zero1-ceiling"
CEILINGS = ("zero1", "memory")
PARTS = ("compute", "recompute", "tp_comm", "bubble", "dp_sync", "optimizer", "wait")


def _register_zero1_precision() -> None:
    """bf16 priced with (master + moments) resident nowhere, an update that moves no bytes, and a gradient sync
    that moves what a sharded one does: the reduce-scatter's fp32 half plus the all-gather's half in bf16
    (RING_SHARES), 3 bytes per element instead of the all-reduce's 4."""
    bf16 = PRECISIONS["bfloat16"]
    scatter, gather = RING_SHARES
    PRECISIONS.setdefault(ZERO1_DTYPE, replace(
        bf16, state_bytes_per_param=bf16.state_bytes_per_param - bf16.optimizer_state_bytes,
        optimizer_state_bytes=0, sharded_state_bytes=0, optimizer_bytes_per_param=0,
        grad_sync_bytes=scatter * bf16.grad_sync_bytes + gather * bf16.activation_bytes))


def unbounded_memory(cluster, memory_gb: float = CEILING_MEMORY_GB):
    """The cluster with every device type's memory raised to `memory_gb` (same names, links and speeds)."""
    raised = {d: replace(cluster.device(d), memory_gb=memory_gb) for d in cluster.device_types()}
    return replace(cluster, custom_devices={**cluster.custom_devices, **raised})


def relaxed(kind: str, cluster, profile):
    """(cluster, profile) of a ceiling: the zero1 precision (`_register_zero1_precision`), the optimizer step
    free, and for "memory" every device type's memory unbounded."""
    _register_zero1_precision()
    free = replace(profile, optimizer_s_per_param={d: 0.0 for d in cluster.device_types()},
                   meta={**profile.meta, "dtype": ZERO1_DTYPE})
    assert kind in CEILINGS, kind
    return (unbounded_memory(cluster) if kind == "memory" else cluster), free


def plain(plan, keep_recompute: bool):
    """The plan unsharded with equal slices (and without recomputation unless `keep_recompute`)."""
    out = plan.with_optimizer_sharding(False).with_slice_weights([[1.0] * len(p.stages) for p in plan.pipelines])
    return out if keep_recompute else out.with_recompute(False)


def time_parts(plan, ev, cluster, model, profile) -> dict[str, float]:
    """Shares of the iteration per part of PARTS, averaged over the plan's GPUs (each counts once)."""
    total, gpus, T = dict.fromkeys(PARTS, 0.0), 0, ev.iteration_time_s
    for k, (pipeline, table) in enumerate(zip(plan.pipelines, plan_tables(plan, cluster, model, profile))):
        p, m = len(pipeline.stages), pipeline.num_microbatches
        for j, stage in enumerate(pipeline.stages):
            first, last, n = j == 0, j == p - 1, len(stage.devices)
            base = table.get(stage.device_type, stage.tp, False)
            used = table.get(stage.device_type, stage.tp, stage.recompute)
            per_mb = sum(ev.stage_parts_s[k][j])
            recompute = used.stage_time(stage.num_layers, first, last) - base.stage_time(stage.num_layers, first, last)
            tp = base.stage_tp_comm_s(stage.num_layers, first, last)
            synced, opt = ev.stage_sync_end_s[k][j], ev.stage_optimizer_s[k][j]
            exposed = ev.sync_exposed_s[f"{stage.node}:{stage.devices[0]}"]
            parts = {"compute": m * (per_mb - recompute - tp), "recompute": m * recompute, "tp_comm": m * tp,
                     "bubble": synced - exposed - m * per_mb, "dp_sync": exposed, "optimizer": opt,
                     "wait": T - synced - opt}
            for part, seconds in parts.items():
                total[part] += n * seconds
            gpus += n
    return {part: round(seconds / (gpus * T), 4) for part, seconds in total.items()}


def _summary(r, cluster, model, profile) -> dict:
    stages = [s for p in r.plan.pipelines for s in p.stages]
    return {"samples_per_s": r.evaluation.samples_per_s, "iteration_s": r.evaluation.iteration_time_s,
            "pipelines": len(r.plan.pipelines), "stages": len(stages), "tp": sorted({s.tp for s in stages}),
            "micro_batch": r.plan.micro_batch, "schedule": r.plan.schedule,
            "recompute_stages": sum(s.recompute for s in stages),
            "sharded_stages": sum(s.shard_optimizer for s in stages), "hit_time_limit": r.hit_time_limit,
            "peak_memory_gb": round(max(r.evaluation.memory_bytes.values()) / 1e9, 1),
            "time_parts": time_parts(r.plan, r.evaluation, cluster, model, profile)}


def ceiling_row(kind, model, cluster, profile, batch, seq, found, limit) -> dict:
    """The `kind` ceiling's best plan (seeded with the plans `found`), the proven bound there, and each found
    plan's stripped copy priced there (asserted no slower than its own price, and no faster than the ceiling)."""
    fleet, prof = relaxed(kind, cluster, profile)
    keep = kind == "zero1"
    start = time.perf_counter()
    r = plan_training(cluster=fleet, model=model, profile=prof, global_batch=batch, seq_len=seq,
                      time_limit_s=limit, recompute="none" if kind == "memory" else "auto",
                      optimizer_sharding="none", incumbents=tuple(plain(f.plan, keep) for f in found.values()))
    out = _summary(r, fleet, model, prof) | {"wall_s": time.perf_counter() - start}
    bound_s = lower_bound_iteration_s(cluster=fleet, model=model, profile=prof, global_batch=batch, seq_len=seq,
                                      recompute="none" if kind == "memory" else "auto", optimizer_sharding="none")
    out["bound_samples_per_s"] = batch / bound_s
    out["seeds_relaxed_s"] = {}
    for mode, f in found.items():
        priced = best_schedule(plain(f.plan, keep), fleet, model, prof)[1]
        assert priced.feasible and priced.iteration_time_s <= f.evaluation.iteration_time_s * (1 + 1e-9), mode
        assert r.evaluation.iteration_time_s <= priced.iteration_time_s * (1 + 1e-9), mode
        out["seeds_relaxed_s"][mode] = priced.iteration_time_s
    return out


def scaled_activations(profile, scale: float):
    """The profile with every transformer layer's kept activations times `scale` (a what-if for the memory
    model: benchmarks/sharding_activation_check.py measured the runtime's llama blocks keeping ~1.2x)."""
    if scale == 1.0:
        return profile
    entries = {key: {kind: replace(lp, activation_bytes=int(lp.activation_bytes * scale)) if kind == "layer" else lp
                     for kind, lp in kinds.items()} for key, kinds in profile.entries.items()}
    return replace(profile, entries=entries)


def fleet_row(name, fleet, batch, seq, why, limit, with_auto: bool, activation_scale: float = 1.0) -> dict:
    model, cluster = PRESETS[name], load_cluster(str(CLUSTERS / f"{fleet}.yaml"))
    profile = scaled_activations(analytic_profile(model, cluster, seq, with_micro_batches(*token_cap_sizes(seq))),
                                 activation_scale)
    found, row = {}, {"model": name, "fleet": fleet, "global_batch": batch, "seq_len": seq, "why": why}
    for mode in ("none", "auto") if with_auto else ("none",):
        start = time.perf_counter()
        try:
            found[mode] = plan_training(cluster=cluster, model=model, profile=profile, global_batch=batch,
                                        seq_len=seq, time_limit_s=limit, recompute="auto", optimizer_sharding=mode)
        except ConfigError as err:
            row[mode] = {"feasible": False, "reason": str(err)[:160]}
            continue
        row[mode] = _summary(found[mode], cluster, model, profile) | {"wall_s": time.perf_counter() - start}
    for kind in CEILINGS:
        row[kind] = ceiling_row(kind, model, cluster, profile, batch, seq, found, limit)
    if "none" in found:
        for key in CEILINGS + (("auto",) if "auto" in found else ()):
            row[f"{key}_over_none"] = row[key]["samples_per_s"] / row["none"]["samples_per_s"]
    return row


def _line(row) -> str:
    none, auto = row["none"], row.get("auto")
    sps = lambda x: f"{x['samples_per_s']:8.2f}" if x and x.get("samples_per_s") else f"{'-':>8}"  # noqa: E731
    ratio = lambda key: f"{row[key]:6.3f}" if row.get(key) else f"{'-':>6}"  # noqa: E731
    plan = lambda c: (f"pp{c['pipelines']:>2} tp{','.join(map(str, c['tp'])):<5} mb{c['micro_batch']:<2} "  # noqa: E731
                      f"rc{c['recompute_stages']:>2}/{c['stages']:<2} {c['peak_memory_gb']:6.1f}GB")
    parts = none.get("time_parts") if none else None
    shown = " ".join(f"{100 * parts[p]:4.1f}" for p in PARTS) if parts else "(none infeasible)"
    return (f"{row['model']:<11} {row['fleet']:<18} {row['global_batch']:>4} {row['seq_len']:>5} "
            f"{sps(none)} {sps(auto)} {sps(row['zero1'])} {ratio('zero1_over_none')} {sps(row['memory'])} "
            f"{ratio('memory_over_none')} {row['zero1']['bound_samples_per_s']:8.2f}  "
            f"{plan(none) if none and 'pipelines' in none else '-'} | {plan(row['zero1'])} | {plan(row['memory'])}"
            f" | {shown}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--time-limit", type=float, default=300.0, help="seconds per search")
    ap.add_argument("--global-batch", type=int)
    ap.add_argument("--seq-len", type=int)
    ap.add_argument("--rows", default="0,1,2", help="comma-separated rows of sharding_gains.FLEETS")
    ap.add_argument("--no-auto", action="store_true", help="skip the `auto` search (ceiling seeded with none)")
    ap.add_argument("--activation-scale", type=float, default=1.0,
                    help="what-if: every layer's kept activations times this (default 1: as modeled)")
    args = ap.parse_args(argv)
    rows = []
    print(f"{'model':<11} {'fleet':<18} {'B':>4} {'S':>5} {'none':>8} {'auto':>8} {'zero1':>8} {'z/none':>6} "
          f"{'memory':>8} {'m/none':>6} {'bound z':>8}  plans of none | zero1 | memory (pipelines, TP degrees, "
          "micro-batch, recomputing/stages, peak memory) | none's GPU time %: " + " ".join(PARTS))
    for i in args.rows.split(","):
        name, fleet, batch, seq, why = FLEETS[int(i)]
        row = fleet_row(name, fleet, args.global_batch or batch, args.seq_len or seq, why, args.time_limit,
                        not args.no_auto, args.activation_scale)
        rows.append(row)
        print(_line(row), flush=True)
    print(json.dumps({"bench": "sharding_ceiling", "time_limit_s": args.time_limit,
                      "activation_scale": args.activation_scale,
                      "ceiling_memory_gb": CEILING_MEMORY_GB, "load_average": os.getloadavg(), "rows": rows}))


if __name__ == "__main__":
    main()
