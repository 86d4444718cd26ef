"""Cost-model accuracy on this CPU, not circular: a measured CPU profile, real unpaced runs.

1. Profile the CPU with `autohet profile --local --ranks <cores>` (one thread per rank, as each rank runs):
   it times every entry in situ (runtime/in_situ_cost.py): the runtime's own stage of a few layers on all
   cores at once, micro-batch after micro-batch as a step runs them, the TP2 entry's collectives in a real
   2-rank gloo group, and the update (norm, clip, AdamW) on every rank at once; each rep counts the slowest
   rank (TP group), as a synchronous step waits for it, and the profile keeps the median rep. Measure what the
   cost model needs beside it: the gloo loopback link as the profiler measures it (profile/link_probe.py)
   and, for the catalog entry only, the memory bandwidth and the fp32 matmul rate.
2. Describe the machine as a cluster of CPU "devices": one node with one device per core. Ranks are never
   more than cores: a second rank on a core would halve both ranks' speed, which the profile (measured one
   rank per core) does not describe.
3. Run each plan with the real runtime (Engine, gloo, one spawned process per rank, no pacer), paired with
   its profile: after every step, the same processes run what the profiler times in situ (one rep of each TP
   degree the plan uses, then one update) with the profiler's own code, and the run is priced (`evaluate_plan`,
   fp32) with the profile of those reps, summed up as the profiler does. Measured: the median step (max over
   ranks). Why paired: this VM's speed drifts by 10-50% within tens of seconds (in-situ figures a minute apart
   differ that much), so a profile taken before a run measures the drift, not the cost model; interleaved step
   by step, both see the same host. The price with the `autohet profile --local` profile of step 1, taken
   minutes before, is printed beside it to show that drift. Each plan runs --passes times, interleaved; a
   plan's error is the mean of its per-pass errors.
   The figures need an otherwise idle machine: the load average is printed before and after; `--nice -15`
   (root only) raises this run's CPU priority (inherited by the ranks) so that it gets its cores on a shared
   machine.
Plan shapes on 2 cores: PP2 (even split), PP2 with other stage boundaries (uneven split), TP2, DP2, and with
sharded optimizer state DP2 and DP2 with 3 against 1 micro-batches. Two
pipelines of several stages each need at least 4 cores; with more cores, raise --cores and the plan list grows
by a pair of two-stage pipelines with different boundaries.
Ends with one JSON line: max_abs_error (the largest |measured / predicted - 1|, each the mean over passes) and
the per-plan figures of every pass.
Run: python -m benchmarks run cost-model-accuracy -- [--steps 12] [--passes 2] [--cores 2] [--nice -15]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist
import yaml

from autohet_ray.cluster import cluster_from_dict
from autohet_ray.cost import allreduce_time, evaluate_plan
from autohet_ray.cost.sharding import GLOO_SHARES
from autohet_ray.model.spec import model_from_dict
from autohet_ray.plan.schema import Pipeline, Plan, Stage
from autohet_ray.profile.db import LinkProfile, ProfileDB, load_profile, profile_from_dict
from autohet_ray.profile.link_probe import probe_link
from autohet_ray.runtime import Engine, run_world
from autohet_ray.runtime.in_situ_cost import WARMUP_REPS as IN_SITU_WARMUP
from autohet_ray.runtime.in_situ_cost import InSituTimer, kind_costs, update_s_per_param_in_situ, with_kind_costs
from autohet_ray.runtime.update_rate import UpdateTimer

MODEL = {"name": "acc-gpt", "family": "gpt", "num_layers": 8, "hidden": 256, "num_heads": 8, "num_kv_heads": 8,
         "ffn_hidden": 1024, "vocab_size": 2048, "max_seq_len": 64}
MICRO_BATCH, MICROBATCHES = 2, 4          # per plan: 4 micro-batches of 2 samples (split over pipelines in DP2)
DEVICE = "CPU"


def _pipeline(m: int, splits, first_device: int = 0) -> Pipeline:
    stages, d = [], first_device
    for start, end, tp in splits:
        stages.append(Stage(layers=(start, end), tp=tp, device_type=DEVICE, node="cpu", devices=tuple(range(d, d + tp))))
        d += tp
    return Pipeline(num_microbatches=m, stages=tuple(stages))


def plan_shapes(cores: int) -> dict[str, tuple[Pipeline, ...]]:
    n, m = MODEL["num_layers"], MICROBATCHES
    shapes = {"pp2": (_pipeline(m, [(0, n // 2, 1), (n // 2, n, 1)]),),
              "pp2_uneven": (_pipeline(m, [(0, 3 * n // 8, 1), (3 * n // 8, n, 1)]),),
              "tp2": (_pipeline(m, [(0, n, 2)]),),
              "dp2": (_pipeline(m // 2, [(0, n, 1)]), _pipeline(m // 2, [(0, n, 1)], 1))}
    if cores >= 4:
        shapes["two_pipelines_different_boundaries"] = (
            _pipeline(m // 2, [(0, 3 * n // 8, 1), (3 * n // 8, n, 1)]),
            _pipeline(m // 2, [(0, 5 * n // 8, 1), (5 * n // 8, n, 1)], 2))
    # sharded optimizer state (runtime/shard_sync.py): DP2, and an asymmetric pair (3 against 1 micro-batch;
    # with 4 cores, different stage boundaries too)
    shapes["dp2_sharded"] = tuple(_sharded(p) for p in shapes["dp2"])
    shapes["dp2_uneven_sharded"] = (_sharded(_pipeline(m - 1, [(0, n, 1)])), _sharded(_pipeline(1, [(0, n, 1)], 1)))
    if cores >= 4:
        shapes["different_boundaries_sharded"] = tuple(
            _sharded(p) for p in shapes["two_pipelines_different_boundaries"])
    return shapes


def _sharded(p: Pipeline) -> Pipeline:
    return replace(p, stages=tuple(replace(s, shard_optimizer=True) for s in p.stages))


def make_plan(pipelines: tuple[Pipeline, ...]) -> Plan:
    total = sum(p.num_microbatches for p in pipelines) * MICRO_BATCH
    return Plan(model=MODEL["name"], model_spec=MODEL, global_batch=total, micro_batch=MICRO_BATCH,
                seq_len=MODEL["max_seq_len"], pipelines=pipelines, cluster="this-cpu")


def profile_cpu(workdir: Path, cores: int) -> Path:
    """`autohet profile --local --ranks <cores>`, one thread per rank (each rank of a run has one core)."""
    model_file, out = workdir / "model.yaml", workdir / "cpu-profile.json"
    model_file.write_text(yaml.safe_dump(MODEL))
    cli = Path(sys.executable).parent / "autohet"
    cmd = [str(cli), "profile", "--local", "--model", str(model_file), "--device-type", DEVICE, "--tp", "1,2",
           "--micro-batch", str(MICRO_BATCH), "--seq-len", str(MODEL["max_seq_len"]), "--ranks", str(cores),
           "--out", str(out)]
    subprocess.run(cmd, check=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    return out


def _probe(rank: int, world_size: int, num_bytes: int, reps: int) -> dict:
    return probe_link(rank, num_bytes, reps)


def _all_reduces(rank: int, world_size: int, numel: int, reps: int) -> list[float]:
    buf, times = torch.zeros(numel), []
    for _ in range(reps):
        start = time.perf_counter()
        dist.all_reduce(buf)
        times.append(time.perf_counter() - start)
    return times


def all_reduce_seconds(numel: int) -> tuple[float, float, float]:
    """(fastest, median, mean) seconds of a 2-rank gloo all-reduce of `numel` fp32 elements: the TP
    collective."""
    times = sorted(run_world(_all_reduces, 2, numel, 100)[0])
    return times[0], times[len(times) // 2], sum(times) / len(times)


def _shard_collectives(rank: int, world_size: int, numel: int, reps: int) -> dict:
    """Seconds of an all-reduce, a reduce-scatter of the same input and the all-gather back, each rep."""
    full, half, out = torch.randn(numel), torch.empty(numel // 2), torch.empty(numel)
    times = {"all_reduce": [], "reduce_scatter": [], "all_gather": []}
    for _ in range(reps):
        for name, run in (("all_reduce", lambda: dist.all_reduce(full)),
                          ("reduce_scatter", lambda: dist.reduce_scatter_tensor(half, full)),
                          ("all_gather", lambda: dist.all_gather_into_tensor(out, half))):
            dist.barrier()
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return times


def shard_collective_shares(numel: int = 7 << 20, reps: int = 7) -> dict:
    """gloo's reduce-scatter and all-gather (2 ranks, `numel` fp32 elements) as shares of the all-reduce of the
    same bucket, medians: what cost/sharding.GLOO_SHARES prices (a ring would take 0.5 each)."""
    times = {k: sorted(v)[len(v) // 2] for k, v in run_world(_shard_collectives, 2, numel, reps)[0].items()}
    return {k: round(times[k] / times["all_reduce"], 2) for k in ("reduce_scatter", "all_gather")}


def measure_link() -> LinkProfile:
    """The gloo loopback link as the profiler measures it: mean one-way latency and bandwidth, and the fixed
    overhead of a collective (profile/link_probe.py)."""
    return LinkProfile(**run_world(_probe, 2, 4 << 20, 100)[0])


def link_line(link: LinkProfile) -> str:
    return (f"{link.latency_s * 1e6:.0f} us + {link.bandwidth_Bps / 1e9:.2f} GB/s, all-reduce "
            f"{link.allreduce_bandwidth_Bps / 1e9:.2f} GB/s + {link.collective_overhead_s * 1e6:.0f} us")


def measure_memory_and_flops() -> tuple[float, float]:
    """(memory bandwidth GB/s of c = a + b, fp32 matmul TFLOPS), one thread, best of a few."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, b, c = (torch.rand(2**23) for _ in range(3))
        x, y = torch.rand(512, 512), torch.rand(512, 512)
        copy, mm = [], []
        for _ in range(5):
            t0 = time.perf_counter()
            torch.add(a, b, out=c)
            t1 = time.perf_counter()
            x @ y
            mm.append(time.perf_counter() - t1)
            copy.append(t1 - t0)
        return 3 * a.numel() * 4 / min(copy) / 1e9, 2 * 512**3 / min(mm) / 1e12
    finally:
        torch.set_num_threads(threads)


def cpu_cluster(cores: int, hbm_gbps: float, tflops: float, link: LinkProfile) -> dict:
    memory_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9 / cores
    device = {"bf16_tflops": tflops, "fp32_tflops": tflops, "memory_gb": memory_gb, "hbm_gbps": hbm_gbps,
              "link_gbps": 2 * link.bandwidth_Bps / 1e9, "link_kind": "pcie", "nic_gbps": 10,
              "source": "measured on this machine (benchmarks/cost_model_accuracy.py)"}
    return {"name": "this-cpu", "devices": {DEVICE: device},
            "nodes": [{"name": "cpu", "device": DEVICE, "count": cores}]}


def _paired_rank(rank: int, world_size: int, plan: Plan, steps: int, tps: tuple[int, ...]) -> dict:
    """The plan's steps, each followed by what `autohet profile --local` times in situ (one rep of every TP
    degree the plan uses, then one update, on every rank at once), so the profile and the run see the same
    host."""
    spec = model_from_dict(MODEL)
    engine = Engine(plan=plan, model_spec=spec, rank=rank, lr=1e-4)
    timers = {tp: InSituTimer(rank, world_size, spec, tp, MICRO_BATCH, plan.seq_len, torch.float32) for tp in tps}
    update = UpdateTimer(spec, "cpu")
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, MODEL["vocab_size"], (plan.global_batch, plan.seq_len), generator=g)
    batch = {"input_ids": ids, "labels": ids.roll(-1, dims=1)}
    out = {"steps": [], "in_situ": {tp: {label: [] for label in t.chains} for tp, t in timers.items()},
           "update_s": [], "update_params": update.params}
    for i in range(IN_SITU_WARMUP + steps):
        timings = engine.train_step(batch)["timings"]
        reps = {tp: t.rep() for tp, t in timers.items()}
        update_s = update.rep()
        if i < IN_SITU_WARMUP:
            continue
        out["steps"].append(timings)
        for tp, rep in reps.items():
            for label, seconds in rep.items():
                out["in_situ"][tp][label].append(seconds)
        out["update_s"].append(update_s)
    return out


def paired_profile(base: ProfileDB, per_rank: list[dict]) -> ProfileDB:
    """`base` with the in-situ entries and the update's rate of a paired run, summed up as the profiler does
    (runtime/in_situ_cost.py)."""
    profile = profile_from_dict(base.to_dict())
    for tp in per_rank[0]["in_situ"]:
        key = (DEVICE, tp, MICRO_BATCH)
        profile.entries[key] = with_kind_costs(profile.entries[key], kind_costs([r["in_situ"][tp] for r in per_rank], tp))
    profile.optimizer_s_per_param[DEVICE] = update_s_per_param_in_situ(per_rank)
    return profile


def median_step(per_rank: list[dict]) -> tuple[float, list[dict]]:
    """(the median step's time, max over ranks; every rank's op seconds in that step)."""
    steps = len(per_rank[0]["steps"])
    order = sorted(range(steps), key=lambda s: max(r["steps"][s]["step"] for r in per_rank))
    middle = order[steps // 2]
    return max(r["steps"][middle]["step"] for r in per_rank), [r["steps"][middle] for r in per_rank]


def _ops_line(timings: list[dict]) -> str:
    return " | ".join(", ".join(f"{op} {t * 1e3:.0f}" for op, t in sorted(r.items())) for r in timings)


def profile_this_cpu(workdir: Path, cores: int) -> ProfileDB:
    """`autohet profile --local` (the layers in situ, the TP2 collectives in a 2-rank group, the update's
    rate) and the link as the profiler probes it."""
    profile = load_profile(str(profile_cpu(workdir, cores)))
    profile.links[f"intra:{DEVICE}"] = measure_link()
    profile.save(str(workdir / "cpu-profile.json"))
    return profile


def run_plan(name: str, plan: Plan, steps: int, cluster, model, base: ProfileDB) -> dict:
    """One paired run of a plan: its measured median step against its price with the profile of the same
    run (and, to show what host drift does, with the `autohet profile --local` profile taken before)."""
    tps = tuple(sorted({s.tp for p in plan.pipelines for s in p.stages}))
    per_rank = run_world(_paired_rank, plan.num_devices, plan, steps, tps)
    seconds, ops = median_step(per_rank)
    profile = paired_profile(base, per_rank)
    predicted = evaluate_plan(plan, cluster, model, profile).iteration_time_s
    with_cli = evaluate_plan(plan, cluster, model, base).iteration_time_s
    layer = profile.layer(DEVICE, tps[0], MICRO_BATCH, "layer")
    ranks_layer = [[statistics.median(rep["layer"][part] for rep in r["in_situ"][tps[0]]["with"]) * 1e3
                    for part in (0, 1)] for r in per_rank]
    print(f"{name}: measured {seconds:.3f} s, predicted {predicted:.3f} s ({100 * (seconds / predicted - 1):+.1f}%; "
          f"with the profile taken before {with_cli:.3f} s, {100 * (seconds / with_cli - 1):+.1f}%); in situ "
          f"tp={tps[0]} layer {layer.fwd_s * 1e3:.2f}/{layer.bwd_s * 1e3:.2f} ms (each rank's median "
          f"{', '.join(f'{f:.2f}/{b:.2f}' for f, b in ranks_layer)}); update "
          f"{profile.optimizer_s_per_param[DEVICE] * 1e9:.2f} ns/param; median step per rank, ms: {_ops_line(ops)}",
          flush=True)
    return {"predicted": predicted, "measured": seconds, "predicted_with_profile_before": with_cli}


def plan_errors(runs: list[dict]) -> dict:
    """A plan's figures over the passes; its error is the mean of the per-pass errors."""
    errors = [r["measured"] / r["predicted"] - 1 for r in runs]
    before = [r["measured"] / r["predicted_with_profile_before"] - 1 for r in runs]
    return {"predicted_s": [round(r["predicted"], 4) for r in runs], "measured_s": [round(r["measured"], 4) for r in runs],
            "error": round(sum(errors) / len(errors), 4),
            "error_with_profile_before": round(sum(before) / len(before), 4)}


def print_tp_diagnostics(profile: ProfileDB) -> dict:
    """What a TP2 all-reduce costs, priced from the link and timed bare; what a layer's collectives cost in the
    profile (measured in a 2-rank group)."""
    numel = MICRO_BATCH * MODEL["max_seq_len"] * MODEL["hidden"]
    fastest, median, mean = all_reduce_seconds(numel)
    priced = allreduce_time(numel * 4, 2, profile.links[f"intra:{DEVICE}"])
    print(f"TP all-reduce of one micro-batch's hidden states ({numel * 4 / 1e3:.0f} kB): priced {priced * 1e6:.0f} us, "
          f"measured {fastest * 1e6:.0f} us fastest, {median * 1e6:.0f} us median, {mean * 1e6:.0f} us mean",
          flush=True)
    layer = profile.layer(DEVICE, 2, MICRO_BATCH, "layer")
    if layer.tp_comm_fwd_s is not None:
        print(f"TP2 collectives of one layer and micro-batch in the last profile, measured in a 2-rank group: "
              f"forward {layer.tp_comm_fwd_s * 1e3:.2f} ms, backward {layer.tp_comm_bwd_s * 1e3:.2f} ms (from the "
              f"link: {2 * priced * 1e3:.2f} ms each)", flush=True)
    return {"priced": round(priced * 1e6), "fastest": round(fastest * 1e6), "median": round(median * 1e6),
            "mean": round(mean * 1e6)}


def raise_priority(nice: int) -> None:
    """Add `nice` to this process's nice value (the profiler and the ranks inherit it). With autogroup
    scheduling (Linux's default for desktop and container sessions) a nice value only ranks processes inside
    their session's group, so the session's group gets the same nice value."""
    try:
        os.nice(nice)
        group = Path("/proc/self/autogroup")
        if group.exists() and Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1":
            group.write_text(str(nice))
    except PermissionError:
        raise SystemExit(f"--nice={nice}: a negative nice value needs root (CAP_SYS_NICE)") from None


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12, help="timed steps per run (after the warm-up ones)")
    parser.add_argument("--passes", type=int, default=2, help="runs of every plan, interleaved")
    parser.add_argument("--cores", type=int, default=min(2, os.cpu_count() or 1),
                        help="CPU devices (ranks) to use; at most this machine's cores")
    parser.add_argument("--nice", type=int, default=0, help="add this to the run's nice value (negative: root)")
    parser.add_argument("--plans", help="comma-separated subset of the plan shapes (default: all)")
    parser.add_argument("--workdir", help="where the profile and cluster files go (default: a temporary dir)")
    args = parser.parse_args(argv)
    if args.cores > (os.cpu_count() or 1) or args.cores < 2:
        raise SystemExit(f"--cores={args.cores}: need 2 <= cores <= {os.cpu_count()} (one rank per core)")
    if args.nice:
        raise_priority(args.nice)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="cost-accuracy-"))
    workdir.mkdir(parents=True, exist_ok=True)
    hbm_gbps, tflops = measure_memory_and_flops()
    shapes = {name: make_plan(pipelines) for name, pipelines in plan_shapes(args.cores).items()}
    if args.plans:
        shapes = {n: p for n, p in shapes.items() if n in args.plans.split(",")}
    model, load_before = model_from_dict(MODEL), os.getloadavg()[0]
    profile = profile_this_cpu(workdir, args.cores)
    link = profile.links[f"intra:{DEVICE}"]
    raw_cluster = cpu_cluster(args.cores, hbm_gbps, tflops, link)
    (workdir / "cpu-cluster.yaml").write_text(yaml.safe_dump(raw_cluster))
    cluster = cluster_from_dict(raw_cluster)
    print(f"link {link_line(link)}; optimizer {profile.optimizer_s_per_param[DEVICE] * 1e9:.2f} ns/param; "
          f"memory {hbm_gbps:.1f} GB/s; matmul {tflops * 1e3:.1f} GFLOPS (one thread); files in {workdir}", flush=True)
    runs = {name: [] for name in shapes}
    for pass_index in range(args.passes):
        print(f"pass {pass_index + 1}", flush=True)
        for name, plan in shapes.items():
            runs[name].append(run_plan(name, plan, args.steps, cluster, model, profile))
    tp_us = print_tp_diagnostics(profile)
    shares = shard_collective_shares()
    print(f"gloo reduce-scatter / all-gather of a 28 MB bucket as shares of its all-reduce: {shares} "
          f"(priced: {dict(zip(('reduce_scatter', 'all_gather'), GLOO_SHARES))})", flush=True)
    plans = {name: plan_errors(r) for name, r in runs.items()}
    for name, figures in plans.items():
        print(f"{name:<36} predicted {figures['predicted_s']} s  measured {figures['measured_s']} s  "
              f"error {100 * figures['error']:+.1f}% (mean over passes; with the profile taken before the runs "
              f"{100 * figures['error_with_profile_before']:+.1f}%)", flush=True)
    worst = max(abs(p["error"]) for p in plans.values())
    load = {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2)}
    print(f"load average (1 min) before {load['before']}, after {load['after']} on {os.cpu_count()} cores")
    print(json.dumps({"max_abs_error": round(worst, 4), "cores": args.cores, "profile": "measured (this CPU, fp32)",
                      "method": "each run paired step by step with the profiler's in-situ reps",
                      "compute": profile.meta.get("compute", {}),
                      "tp_collectives": profile.meta.get("tp_collectives", {}), "steps": args.steps,
                      "passes": args.passes, "tp_all_reduce_us": tp_us, "gloo_shard_collective_shares": shares, "nice": os.nice(0), "load_average": load,
                      "plans": plans}))

if __name__ == "__main__":
    main()
