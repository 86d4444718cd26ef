"""Spot replay, simulated: real AWS spot availability traces replayed on a 1024-GPU mix through the cost model
and the real planner (no Ray), for ours (local-first recovery, re-plan at every change), checkpoint-restart
(cloud checkpoints every N minutes) and no re-planning, all on one clock.

- Pools: one per GPU type of the cluster file; a pool follows a trace (scaled: nodes = round(pool nodes x
  instances / requested instances)), or runs on demand (all nodes alive) when no trace is given for it.
  Defaults for jobs/clusters/mixed-1024.yaml (32 nodes x 8 GPUs per type): A100-80GB <- aws-g4dn-us-east-1c
  (the busiest trace, on the cheapest type the plan uses), H800 <- aws-g4dn-us-east-1d (5.6 h long: repeated
  over the window), H100 <- aws-p2-us-east-1e, H20 on demand. Each trace starts at its first grant; the window
  is the g4dn-us-east-1c trace's 18.5 h.
- At each new availability state the planner runs as the controller's re-plan does (plan_training, the job's
  time limit, the job's profile: analytic here, so every samples/s is a cost-model prediction); its wall time
  here is charged the first time each state is planned: the controller keeps a plan per availability state and
  reuses it when the state recurs (--no-plan-cache charges every re-plan).
- Recovery phases: detect, re-plan, restart, restore (bytes of the fullest node / a stated bandwidth), warm-up;
  detect and restart are the stated assumptions for ~1000 ranks (3 s, 30 s): no measurement at that scale
  exists. The emulated replay's medians (benchmarks/measured/emulated_replay.json: 0.27 s, 7.44 s on one host)
  are reported beside them (`emulated_phases`), or used with --emulated-phases. Each phase's basis is in the
  JSON line (`phase_basis`), with the restart that would still give 0.90.
- Ours pays a per-step snapshot overhead per plan: the bytes its busiest GPU snapshots (the runtime's writer
  assignment: one writer per unique chunk and node-store copy, spot_replay_snapshot.py) per second of step, priced
  by the one H200 measurement scaled linearly (an extrapolation; `snapshot_overhead_sweep`, `snapshot_rate_runtime`).
- Checkpoint-restart: by default a join does not restart it (--join-policy; `checkpoint_restart_by_join_policy`).
- Cost: USD per million tokens for ours, checkpoint-restart and the same job on on-demand GPUs only
  (jobs/clusters/prices.yaml); every alive node of the fleet is billed, whole (its instance), to the systems
  replayed on it.
- Plan-ahead, on by default as in the controller (--no-plan-ahead; `plan_ahead_option`): a join's, and a
  noticed removal's, plan, workers and process groups are built while the current plan trains; the switch pays
  switch_s (default: the emulated prepared switch of spot_replay_switch_cost.py, labelled; swept 1/3/10/30 s in
  `notice_ahead`), no planning, no restart. Single-node losses are planned ahead per pool. A removal without a
  notice is a loss (detect + restart as stated). Notices: --notice-s 120 by default (AWS's 2 minutes); the
  figure without notices is reported beside the headline (`bar`, `notice_ahead`).

Ends with one JSON line; writes a PNG timeline (GPUs alive per type, ideal and achieved samples/s).

    python -m benchmarks run spot-replay -- [--quick] [--no-plan-cache] [--notice-s 120] [--png out.png]
    python -m benchmarks run spot-replay -- --plans-in benchmarks/measured/spot_replay_plans_2026-12-05.json \
        [--emulated-phases] [--snapshot-overhead 0.05] [--join-policy save_then_restart] [--no-plan-ahead]
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
from dataclasses import replace

from autohet_ray import ConfigError
from autohet_ray.cluster.spec import cluster_from_dict, load_cluster
from autohet_ray.model.spec import load_model
from autohet_ray.plan.schedule import PLAN_SCHEDULES
from autohet_ray.planner import check_request
from autohet_ray.profile.analytic import analytic_profile
from autohet_ray.replay.phases import (DEFAULT_PHASES, GB, last_json_line, phases_from_emulated_replay,
                                     phases_from_recovery_bench, restart_from_fit)
from autohet_ray.replay.figures import (H200_FILE, H200_OVERHEAD_PER_GB_S, RUNTIME_RATE_BASIS, SNAPSHOT_OVERHEAD,
                                        SNAPSHOT_OVERHEAD_BASIS, costed_figures)
from autohet_ray.replay.notice_figures import bar_row, measured_switch, notice_figures
from autohet_ray.replay.planning import PlanCache, pool_sizes, real_planner
from autohet_ray.replay.prices import fleet_cost_usd, load_prices, node_usd_per_s
from autohet_ray.replay.run import (goodput_of, ideal_series, restart_s_for_goodput, run_systems, variants,
                                    young_daly_period_s)
from autohet_ray.replay.systems import JOIN_POLICIES, CheckpointRestart, ReplayConfig
from autohet_ray.replay.timeline import build_timeline
from autohet_ray.replay.traces import PoolTrace, load_trace
from benchmarks.spot_replay_join_cost import join_cost_medians
from benchmarks.spot_replay_plot import plot

ROOT = pathlib.Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "traces"
MEASURED_PHASES = ROOT / "benchmarks" / "measured" / "emulated_replay.json"
JOIN_COST = ROOT / "benchmarks" / "measured" / "spot_replay_join_cost_2026-12-05.json"
SWITCH_COST = ROOT / "benchmarks" / "measured" / "spot_replay_switch_cost_2026-12-05.json"
DEFAULT_POOLS = ["A100-80GB=aws-g4dn-us-east-1c", "H800=aws-g4dn-us-east-1d", "H100=aws-p2-us-east-1e"]
BAMBOO_OVER_CHECKPOINTING = 3.7


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--emulate", action="store_true",
                    help="the emulated replay on Ray instead (benchmarks/spot_replay_emulated.py, its own options)")
    ap.add_argument("--quick", action="store_true", help="4 nodes per pool, a 3 h window, global batch 512")
    ap.add_argument("--cluster", default=str(ROOT / "jobs/clusters/mixed-1024.yaml"))
    ap.add_argument("--model", default="llama-13b")
    ap.add_argument("--global-batch", type=int, default=4096)
    ap.add_argument("--seq-len", type=int, default=None, help="default: the model's max_seq_len")
    ap.add_argument("--pool", action="append", metavar="GPU=TRACE[@OFFSET_H]",
                    help=f"a pool's trace (file stem in --traces or a path); default {DEFAULT_POOLS}; "
                         "GPU types without one run on demand")
    ap.add_argument("--traces", default=str(TRACES))
    ap.add_argument("--window-h", type=float, default=None, help="default: the first pool's trace length")
    ap.add_argument("--nodes-per-pool", type=int, default=None, help="keep only this many nodes per GPU type")
    ap.add_argument("--time-limit", type=float, default=10.0, help="planner time limit (the job's default)")
    ap.add_argument("--no-plan-cache", dest="plan_cache", action="store_false",
                    help="plan every re-plan anew (the controller reuses a state's plan when it recurs)")
    ap.add_argument("--notice-s", type=float, default=120.0,
                    help="spot notice before each removal (ours; 0: every removal unannounced). Default: AWS's 2 "
                         "minutes; the JSON gives the figure without notices beside it (notice_ahead, bar)")
    ap.add_argument("--checkpoint-every-min", type=float, default=30.0, help="checkpoint-restart's period")
    ap.add_argument("--snapshot-overhead", type=float, default=None,
                    help="ours: a fixed step time the per-step node-store snapshot adds (fraction); default: each "
                         "plan's own snapshot rate priced by the H200 measurement (plans saved with their structure), "
                         f"else {SNAPSHOT_OVERHEAD}")
    ap.add_argument("--join-cost-json", default=str(JOIN_COST),
                    help="spot_replay_join_cost.py's JSON line: the emulated join with and without plan-ahead")
    ap.add_argument("--join-policy", choices=sorted(JOIN_POLICIES), default="ignore",
                    help="what a join does to checkpoint-restart: " +
                         "; ".join(f"{k}: {v}" for k, v in JOIN_POLICIES.items()))
    ap.add_argument("--no-plan-ahead", dest="plan_ahead", action="store_false",
                    help="ours without plan-ahead (the controller plans ahead by default: a join's plan and "
                         "workers are made while the current plan trains; single-node losses are planned ahead)")
    ap.add_argument("--snapshot-every", type=int, default=1,
                    help="ours: snapshot every N steps (modelled; the runtime snapshots every step)")
    ap.add_argument("--switch-s", type=float,
                    help="plan-ahead: the switch onto prepared workers and groups (default: the emulated median of "
                         "--switch-cost-json, else the restart; see switch_s_basis)")
    ap.add_argument("--switch-cost-json", default=str(SWITCH_COST),
                    help="spot_replay_switch_cost.py's JSON line: the emulated prepared switches ('' for none)")
    ap.add_argument("--emulated-json", default=str(MEASURED_PHASES),
                    help="spot_replay_emulated.py's JSON line: its measured detect and restart medians "
                         "(default: the committed run in benchmarks/measured/)")
    ap.add_argument("--emulated-phases", action="store_true",
                    help="cost detect and restart by the emulated replay's medians, not the stated assumptions")
    ap.add_argument("--recovery-json", help="recovery_bench.py output: its measured detect time")
    ap.add_argument("--restart-s", type=float, help="override the restart phase")
    ap.add_argument("--restart-fit", help="benchmarks/restart_scaling.py output: the restart phase from its "
                                          "fitted phases at this cluster's GPU count (instead of the stated 30 s)")
    ap.add_argument("--process-start-s", type=float, default=5.0,
                    help="with --restart-fit: stated seconds to start a replacement node's worker processes")
    ap.add_argument("--local-gbps", type=float, help="override the local-first restore bandwidth (Gb/s per node)")
    ap.add_argument("--cloud-gbps", type=float, help="override the cloud restore/upload bandwidth (Gb/s per node)")
    ap.add_argument("--plans-out", help="save the planned states (JSON) for a later --plans-in")
    ap.add_argument("--plans-in", help="reuse planned states saved by --plans-out for the same request "
                                       "(their planning times are the ones measured then)")
    ap.add_argument("--prices", default=str(ROOT / "jobs/clusters/prices.yaml"))
    ap.add_argument("--png", default=str(ROOT / "out/spot_replay.png"))
    args = ap.parse_args(argv)
    if args.snapshot_every < 1:
        ap.error(f"--snapshot-every {args.snapshot_every}: a snapshot period must be 1 step or more")
    if args.quick:
        args.nodes_per_pool = args.nodes_per_pool or 4
        args.window_h = args.window_h or 3.0
        args.global_batch = 512
    return args


def load_job(args):
    cluster = load_cluster(args.cluster)
    if args.nodes_per_pool:
        raw = cluster.to_dict()
        raw["nodes"] = [n for i, n in enumerate(raw["nodes"])
                        if sum(m["device"] == n["device"] for m in raw["nodes"][:i]) < args.nodes_per_pool]
        cluster = cluster_from_dict(raw)
    model = load_model(args.model)
    seq_len = args.seq_len or model.max_seq_len
    profile = analytic_profile(model, cluster, seq_len)
    check_request(model, profile, args.global_batch, seq_len, PLAN_SCHEDULES)
    return cluster, model, seq_len, profile


def pool_traces(args, cluster) -> list[PoolTrace]:
    types = cluster.device_types()
    sizes = dict(zip(types, pool_sizes(cluster, tuple(types))))
    given = {}
    for spec in args.pool or DEFAULT_POOLS:
        device, _, rest = spec.partition("=")
        name, _, offset = rest.partition("@")
        if device not in sizes or not name:
            raise ConfigError(f"--pool {spec!r}: expected GPU=TRACE[@OFFSET_H] with GPU one of {types}")
        path = pathlib.Path(name) if name.endswith(".csv") else pathlib.Path(args.traces) / f"{name}.csv"
        given[device] = PoolTrace(pool=device, nodes=sizes[device], trace=load_trace(path),
                                  offset_s=float(offset or 0) * 3600)
    return [given.get(d) or PoolTrace(pool=d, nodes=sizes[d], trace=None) for d in types]


def phase_model(args, cluster):
    phases = phases_from_emulated_replay(args.emulated_json) if args.emulated_phases else DEFAULT_PHASES
    if args.recovery_json:
        phases = phases_from_recovery_bench(args.recovery_json, phases)
    basis = dict(phases.basis)
    if not args.local_gbps:
        nic = min(cluster.nic_bytes_per_s(n.name) for n in cluster.nodes)
        phases = replace(phases, local_Bps=nic)
        basis["local_Bps"] = (f"assumed: every byte a node needs read from a peer over the cluster file's NIC "
                              f"({nic * 8 / GB:g} Gb/s per node); reads from the node's own RAM store are faster")
    if args.switch_s is not None:
        phases, basis["switch_s"] = replace(phases, switch_s=args.switch_s), f"given: --switch-s {args.switch_s}"
    elif (switch := switch_measurement(args)) is not None:
        phases = replace(phases, switch_s=switch["switch_s"])
        basis["switch_s"] = (f"{switch['label']}: the median job-stopped time of a prepared switch ({switch['mode']}, "
                             f"flush + stop the old workers + restore into workers whose process groups were built "
                             f"ahead), {switch['file']}; the restore is charged again by bytes")

    if args.restart_fit:
        restart, basis["restart_s"] = restart_from_fit(last_json_line(args.restart_fit), cluster.num_gpus,
                                                       args.process_start_s)
        phases = replace(phases, restart_s=restart)
    if args.restart_s is not None:
        phases, basis["restart_s"] = replace(phases, restart_s=args.restart_s), f"given: --restart-s {args.restart_s}"
    if args.local_gbps:
        phases = replace(phases, local_Bps=args.local_gbps * GB / 8)
        basis["local_Bps"] = f"given: --local-gbps {args.local_gbps}"
    if args.cloud_gbps:
        phases = replace(phases, cloud_Bps=args.cloud_gbps * GB / 8, cloud_upload_Bps=args.cloud_gbps * GB / 8)
        basis["cloud_Bps"] = basis["cloud_upload_Bps"] = f"given: --cloud-gbps {args.cloud_gbps}"
    return replace(phases, basis=basis)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--emulate" in argv:               # the emulated replay on Ray takes its own options
        from benchmarks import spot_replay_emulated  # lazy: Ray, for --emulate only
        return spot_replay_emulated.main([a for a in argv if a != "--emulate"])
    args = parse_args(argv)
    wall0 = time.perf_counter()
    cluster, model, seq_len, profile = load_job(args)
    pools = pool_traces(args, cluster)
    first = next((p.trace for p in pools if p.trace is not None), None)
    window = args.window_h * 3600 if args.window_h else (first.duration_s if first else 3600.0)
    timeline = build_timeline(pools, window)
    names = tuple(p.pool for p in pools)
    say = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    say(f"{cluster.num_gpus} GPUs, {model.name}, batch {args.global_batch}; {len(timeline.events)} events, "
        f"{len(timeline.distinct_states())} states over {window / 3600:.2f} h; planning each state "
        f"(time limit {args.time_limit} s)")
    plans = PlanCache(real_planner(cluster=cluster, pools=names, model=model, profile=profile,
                                   global_batch=args.global_batch, seq_len=seq_len, time_limit_s=args.time_limit),
                      progress=say)
    meta = {"cluster": cluster.to_dict(), "model": model.to_dict(), "global_batch": args.global_batch,
            "seq_len": seq_len, "time_limit_s": args.time_limit, "pools": list(names)}
    if args.plans_in:
        plans.load(args.plans_in, meta)
        say(f"reusing {len(plans.plans)} planned states from {args.plans_in}")
    phases = phase_model(args, cluster)
    try:
        for state in timeline.distinct_states():
            plans.get(state)
        if any(p.plan is not None and p.snapshot_bytes_per_gpu is None for p in plans.plans.values()):
            from benchmarks.spot_replay_snapshot import with_snapshot_bytes  # lazy: torch and the runtime, for new plans only
            with_snapshot_bytes(plans, cluster, names, model, say)
    finally:                               # planning is the slow part: keep what was planned, even on Ctrl-C
        if args.plans_out:
            plans.save(args.plans_out, meta)
    per_plan = args.snapshot_overhead is None and all(
        p.snapshot_bytes_per_gpu is not None for p in plans.plans.values() if p.samples_per_s > 0)
    fixed = SNAPSHOT_OVERHEAD if args.snapshot_overhead is None else args.snapshot_overhead
    config = ReplayConfig(global_batch=args.global_batch, phases=phases, plan_cache=args.plan_cache,
                          notice_s=args.notice_s, checkpoint_every_s=args.checkpoint_every_min * 60,
                          snapshot_overhead=fixed,
                          snapshot_overhead_per_gb_s=H200_OVERHEAD_PER_GB_S if per_plan else None,
                          join_policy=args.join_policy, plan_ahead=args.plan_ahead,
                          snapshot_every_steps=args.snapshot_every)
    out = run_systems(timeline, plans, config)
    report = build_report(args, cluster, model, timeline, pools, plans, config, out)
    gpn = tuple(next(n.count for n in cluster.nodes if n.device == p) for p in names)
    report["phases"] = "emulated (--emulated-phases)" if args.emulated_phases else "assumed (stated, ~1000 ranks)"
    report["snapshot_overhead_basis"] = (
        f"per plan: {RUNTIME_RATE_BASIS}; priced x(1 + {H200_OVERHEAD_PER_GB_S:.4f} per GB/s), the H200's x1.198 at "
        f"2.538 GB/s scaled linearly (an extrapolation from one measurement: {H200_FILE})" if per_plan else
        SNAPSHOT_OVERHEAD_BASIS + " (these plans were saved without their structure: a fixed factor)"
        if args.snapshot_overhead is None else f"given: --snapshot-overhead {args.snapshot_overhead}")
    report.update(costed_figures(timeline, plans, config, emulated=phases_from_emulated_replay(args.emulated_json),
                                 gpus_per_node=gpn, spot_pools=tuple(p.trace is not None for p in pools),
                                 prices=load_prices(args.prices), seq_len=seq_len, ledgers=out["ledgers"],
                                 planning_cap_s=args.time_limit, join_cost=join_cost_medians(args.join_cost_json)))
    report["notice_ahead"] = notice_figures(timeline, plans, config, fleet_usd=report["cost_per_token"]["fleet_usd"],
                                            seq_len=seq_len, switch=switch_measurement(args))
    report["bar"] = bar_row(report["bar"]["ours_goodput"], config, report["notice_ahead"])
    series = ideal_series(timeline, plans)
    series["achieved"] = {n: ledger.intervals for n, ledger in out["ledgers"].items()}
    series["on_demand"] = {p.pool for p in pools if p.trace is None}
    series["traces"] = {p.pool: p.trace.name for p in pools if p.trace is not None}
    plot(args.png, timeline, series, gpn)
    report["png"] = args.png
    report["bench_wall_s"] = round(time.perf_counter() - wall0, 1)
    print_table(report)
    print(json.dumps(report))
    return 0


def build_report(args, cluster, model, timeline, pools, plans, config, out) -> dict:
    summary, ledgers = out["summary"], out["ledgers"]
    ours, ckpt = summary["ours"], summary["checkpoint_restart"]
    names = timeline.pools
    gpn = tuple(next(n.count for n in cluster.nodes if n.device == p) for p in names)
    prices = load_prices(args.prices)
    fleet = fleet_cost_usd(timeline, gpn, tuple(p.trace is not None for p in pools), prices)
    restarts = sum(1 for r in ledgers["checkpoint_restart"].records if r["event"] is not None)
    period = young_daly_period_s(timeline, plans, config, restarts)
    yd = goodput_of(CheckpointRestart, timeline, plans, replace(config, checkpoint_every_s=period)) \
        if restarts else None
    cases = variant_cases(config)
    if restarts:
        cases["checkpoint-restart on losses only, Young/Daly period"] = {
            "config": {"join_policy": "ignore", "checkpoint_every_s": period}, "baseline_policy": True}
    rows = variants(timeline, plans, config, cases)
    policies = {name for name, case in cases.items() if case.get("baseline_policy")}
    best = max([{"variant": "default", "checkpoint_restart": ckpt["goodput"]}] +
               [r for r in rows if r["variant"] in policies], key=lambda r: r["checkpoint_restart"])
    strongest = {"variant": best["variant"], "goodput": round(best["checkpoint_restart"], 4)}
    per_state = [{"state": list(s), "planning_s": round(p.planning_s, 2), "planning_cpu_s": _round(p.planning_cpu_s, 2),
                  "samples_per_s": round(p.samples_per_s, 1),
                  "gpus_used": p.gpus_used, "hit_time_limit": p.hit_time_limit,
                  "bytes_per_node_GB": round(p.bytes_per_node / GB, 1)} for s, p in plans.plans.items()]
    full = plans.get(timeline.pool_nodes)
    od_node_usd = [3600 * c for c in node_usd_per_s(prices, names, gpn, (False,) * len(names))]   # per node-hour
    samples_od_usd = sum(n * c for n, c in zip(timeline.pool_nodes, od_node_usd))
    return {
        "simulated": True, "profile": "analytic (every samples/s is a cost-model prediction)",
        "cluster": cluster.name, "gpus": cluster.num_gpus, "model": model.name, "global_batch": args.global_batch,
        "window_h": round(timeline.window_s / 3600, 3),
        "pools": [{"gpu": p.pool, "nodes": p.nodes, "gpus_per_node": g,
                   "trace": p.trace.name if p.trace else "on-demand", "requested": p.trace.requested if p.trace else None,
                   "offset_h": p.offset_s / 3600, "repeated": bool(p.trace and p.cycle and
                                                                p.trace.duration_s < timeline.window_s)}
                  for p, g in zip(pools, gpn)],
        "scaling": "nodes alive = round(pool nodes x trace instances / requested instances)",
        "events": len(timeline.events), "distinct_states": len(plans.plans),
        "goodput": round(ours["goodput"], 4), "checkpoint_restart_goodput": round(ckpt["goodput"], 4),
        "no_replan_goodput": round(summary["no_replan"]["goodput"], 4),
        "ours_over_checkpoint_restart": round(ours["goodput"] / ckpt["goodput"], 3) if ckpt["goodput"] else None,
        "bamboo_anchor_over_checkpointing": BAMBOO_OVER_CHECKPOINTING,
        "lost_steps": ours["lost_steps"], "checkpoint_restart_lost_steps": ckpt["lost_steps"],
        "systems": summary, "ideal_samples": round(out["ideal_samples"]),
        "plan_cache": config.plan_cache,
        "planning_charged": "once per state (plan cache)" if config.plan_cache else
        "at every re-plan, the state's measured planning time (the controller has no plan cache; the simulator "
        "plans each state once and charges that measured time again)",
        "planning_time_limit_s": args.time_limit,
        "planning_s": {"mean": round(sum(p.planning_s for p in plans.plans.values()) / len(plans.plans), 2),
                       "max": round(max(p.planning_s for p in plans.plans.values()), 2),
                       "hit_time_limit": sum(p.hit_time_limit for p in plans.plans.values())},
        "per_state": per_state,
        "notice_s": config.notice_s, "checkpoint_every_min": config.checkpoint_every_s / 60,
        "young_daly_checkpoint_every_min": round(period / 60, 1) if restarts else None,
        "checkpoint_restart_goodput_young_daly": round(yd, 4) if yd is not None else None,
        "snapshot_overhead": config.snapshot_overhead,
        "phase_defaults": {k: getattr(config.phases, k) for k in
                           ("detect_s", "restart_s", "local_Bps", "cloud_Bps", "cloud_upload_Bps", "warmup_iterations")},
        "phase_basis": config.phases.basis,
        "rules": ["a removal hits a plan when it takes a node of a pool the plan uses (the plan's nodes first)",
                  "ours: every step is committed to node stores + a peer: an unannounced loss costs the step in flight",
                  "every join re-plans ours; no-replan waits for its first plan's node counts",
                  "checkpoint-restart: background uploads (no stall), durable after bytes/upload bandwidth; "
                  "every hit restarts from the newest durable checkpoint, restored from the cloud; a join does "
                  f"what --join-policy says ({config.join_policy}: {JOIN_POLICIES[config.join_policy]}); "
                  "a normal end keeps all work"],
        "per_event": ledgers["ours"].records,
        "variants": rows,
        "strongest_checkpoint_restart": strongest,
        "ours_over_strongest_checkpoint_restart": round(ours["goodput"] / strongest["goodput"], 3)
        if strongest["goodput"] else None,
        "restart_s_for_goodput_0.90": _round(restart_s_for_goodput(timeline, plans, config, 0.90), 2),
        "restart_s_for_goodput_0.90_with_plan_cache":
            _round(restart_s_for_goodput(timeline, plans, replace(config, plan_cache=True), 0.90), 2),
        "cost": {"fleet_usd": round(fleet, 2),
                 "usd_per_million_samples": {n: round(fleet / s["committed_samples"] * 1e6, 2) if s["committed_samples"]
                                             else None for n, s in summary.items()},
                 "on_demand_full_cluster_usd_per_million_samples":
                     round(samples_od_usd / 3600 / full.samples_per_s * 1e6, 2) if full.samples_per_s else None,
                 "prices": args.prices},
    }


def variant_cases(config) -> dict[str, dict]:
    """Other assumptions the JSON line reports goodput under (stated, not tuned); `baseline_policy` marks the
    checkpoint-restart policies the strongest baseline is chosen from."""
    gbps = lambda g: {"cloud_Bps": g * GB / 8, "cloud_upload_Bps": g * GB / 8}  # noqa: E731
    return {"restart_s=10": {"phases": {"restart_s": 10.0}}, "restart_s=60": {"phases": {"restart_s": 60.0}},
            f"notice_s={0 if config.notice_s else 120} (0: every removal unannounced)":
                {"config": {"notice_s": 0.0 if config.notice_s else 120.0}},
            f"plan_cache={not config.plan_cache}": {"config": {"plan_cache": not config.plan_cache}},
            "cloud 10 Gb/s per node": {"phases": gbps(10)}, "cloud 100 Gb/s per node": {"phases": gbps(100)},
            "checkpoint every 10 min": {"config": {"checkpoint_every_s": 600.0}, "baseline_policy": True},
            "checkpoint-restart saves, then restarts on every join": {"config": {"join_policy": "save_then_restart"},
                                                                      "baseline_policy": True},
            "checkpoint-restart restarts on every join unsaved (before issue 34)":
                {"config": {"join_policy": "restart_unsaved"}},
            "checkpoint-restart on losses only, checkpoint every 10 min":
                {"config": {"join_policy": "ignore", "checkpoint_every_s": 600.0}, "baseline_policy": True},
            "plan_cache=True, restart_s=10": {"config": {"plan_cache": True}, "phases": {"restart_s": 10.0}}}


def switch_measurement(args) -> dict | None:
    """The emulated prepared switch of --switch-cost-json (None: no file given or found)."""
    path = args.switch_cost_json
    return measured_switch(_relative(path)) if path and pathlib.Path(path).exists() else None


def _relative(path: str) -> str:
    """A path as the JSON states it: relative to the repository when inside it."""
    resolved = pathlib.Path(path).resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else path


def _round(x, digits=1):
    return None if x is None else round(x, digits)


def print_table(report: dict) -> None:
    print(f"[simulated, analytic profile] {report['gpus']} GPUs, {report['model']}, {report['events']} events, "
          f"{report['distinct_states']} states, {report['window_h']} h")
    for name, s in report["systems"].items():
        print(f"  {name:<19} goodput {s['goodput']:.4f}  lost steps {s['lost_steps']:>6}  down {s['recovery_down_s']:>8.0f} s"
              f"  waiting {s['wait_s']:>8.0f} s  planning charged {s['planning_charged_s']:>7.0f} s  "
              f"USD/M samples {report['cost']['usd_per_million_samples'][name]}")
    cost = report["cost_per_token"]["usd_per_million_tokens"]
    print(f"  phases {report['phases']}; snapshot overhead x{report['snapshot_overhead_factor']}; checkpoint-restart "
          f"join policy {report['join_policy']}; USD per million tokens: ours {cost['ours']}, checkpoint-restart "
          f"{cost['checkpoint_restart']}, on demand only {cost['on_demand_only']}")
    bar = report["bar"]
    print(f"  bar: ours {bar['ours_goodput']} >= 0.90: {bar['met']} ({bar['headline_assumes']}); without notices "
          f"{bar['ours_goodput_without_notices']} ({bar['met_without_notices']})")
    print(f"  bar: ours {report['bar']['ours_goodput']} >= 0.90: {report['bar']['met']} (plan-ahead "
          f"{report['plan_ahead']}); without plan-ahead {report['plan_ahead_option']['ours_goodput_without_plan_ahead']}"
          f", with it {report['plan_ahead_option']['ours_goodput']}; emulated phases {report['emulated_phases']['goodput']}")
    print(f"  ours / checkpoint-restart: {report['ours_over_checkpoint_restart']}x (Bamboo's anchor "
          f"{BAMBOO_OVER_CHECKPOINTING}x over checkpointing); planning per state mean {report['planning_s']['mean']} s, "
          f"max {report['planning_s']['max']} s; wrote {report['png']}")


if __name__ == "__main__":
    sys.exit(main())
