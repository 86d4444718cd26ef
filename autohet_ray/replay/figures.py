"""The replay's figures with their costs in (issue 34): goodput under other phase figures, snapshot overheads,
checkpoint-restart join policies and plan-ahead, and USD per million tokens for ours, checkpoint-restart and
the same job on on-demand GPUs only. Every figure comes from the same cached plans (no planning runs here)."""
from __future__ import annotations

from dataclasses import replace

from autohet_ray.replay.accounting import ideal_samples
from autohet_ray.replay.phases import GB, PhaseModel
from autohet_ray.replay.planning import PlanCache
from autohet_ray.replay.prices import (Prices, fleet_cost_usd, held_cost_usd, on_demand_cost_usd,
                                      usd_per_million_tokens)
from autohet_ray.replay.run import goodput_of, on_demand_timeline
from autohet_ray.replay.systems import JOIN_POLICIES, CheckpointRestart, Ours, ReplayConfig, snapshot_overhead
from autohet_ray.replay.timeline import Timeline

OVERHEAD_FILE = "benchmarks/measured/recovery_bench_paced_overhead_4_runs.jsonl"
H200_FILE = "benchmarks/measured/h200_2026-12-04/snapshot_overhead_device.txt"
H200_OVERHEAD = 0.198              # background copy, every step: x1.198 ...
H200_GB_PER_S = 7.357 / 2.899      # ... with 7.357 GB of state per 2.899 s step (GB per second of step, one GPU)
SNAPSHOT_OVERHEAD = 0.20
SNAPSHOT_OVERHEAD_BASIS = (
    f"measured on one H200 ({H200_FILE}): x1.198 with every step's state (7.36 GB, gpt3-1.3b with 8 layers, "
    "48 micro-batches, a 2.9 s step) copied in the background, the only measurement with GPU compute. This "
    "replay's state rate per GPU is higher (snapshot_state_rate), so x1.20 is a lower bound for per-step "
    f"snapshots here. The emulated CPU runs ({OVERHEAD_FILE}: node stores only 1.032, 1.074, 1.105, 1.041 paced; "
    "1.08-1.18 unpaced in recovery_bench_stage_in_3_runs and recovery_bench_slow_host_2_runs) snapshot a 20M-"
    "parameter model, about 0.03 GB per second of step: not comparable")
SWEEP_FACTORS = (1.0, 1.05, 1.10, 1.20)


H200_OVERHEAD_PER_GB_S = H200_OVERHEAD / H200_GB_PER_S   # the extrapolation: overhead per GB/s one GPU snapshots
RUNTIME_RATE_BASIS = (
    "what the runtime snapshots: one writer per unique chunk and node-store copy (checkpoint/holdings.py "
    "snapshot_routes: tiling_holdings + place_copies, 2 copies), data-parallel and TP-replicated copies written "
    "once, not by every holder; the busiest rank's bytes per step (copied off its GPU or written to node stores, "
    "whichever is more; benchmarks/spot_replay_snapshot.py, checked against a real emulated run in "
    "tests/ray/test_plan_ahead.py) over the plan's iteration time")


def state_rate_gb_per_s(plan, gpus_per_node: int) -> float:
    """Checkpointed GB per second of step per GPU on the plan's fullest node, every pipeline's copy counted
    (the model before the runtime's writers were counted; restore bytes still use bytes_per_node)."""
    return plan.bytes_per_node / gpus_per_node / GB / plan.iteration_time_s


def runtime_rate_gb_per_s(plan) -> float | None:
    """GB per second of step the busiest GPU snapshots under `plan` (None: not computed for this plan)."""
    if plan.snapshot_bytes_per_gpu is None:
        return None
    return plan.snapshot_bytes_per_gpu / GB / plan.iteration_time_s


def runtime_rate_row(plans: PlanCache, full) -> dict:
    rates = [r for r in (runtime_rate_gb_per_s(p) for p in plans.plans.values() if p.samples_per_s > 0)
             if r is not None]
    if not rates:
        return {"computed": False}
    rate = runtime_rate_gb_per_s(full)
    return {"computed": True, "basis": RUNTIME_RATE_BASIS,
            "full_plan_GB_per_s_of_step_busiest_gpu": round(rate, 4),
            "full_plan_busiest_gpu_GB_per_step": round(full.snapshot_bytes_per_gpu / GB, 3),
            "max_over_states_GB_per_s": round(max(rates), 4), "min_over_states_GB_per_s": round(min(rates), 4),
            "overhead_factor_full_plan": round(1 + H200_OVERHEAD_PER_GB_S * rate, 4),
            "overhead_factor_max_over_states": round(1 + H200_OVERHEAD_PER_GB_S * max(rates), 4),
            "label": "extrapolated from one measurement: the H200's x1.198 at 2.538 GB/s per GPU scaled linearly "
                     "to each plan's busiest-GPU rate"}


def overhead_scaled_to(rate_gb_per_s: float) -> float:
    """The H200's per-step overhead scaled linearly to another state rate (an extrapolation, labelled so)."""
    return H200_OVERHEAD * rate_gb_per_s / H200_GB_PER_S


def goodputs(timeline: Timeline, plans: PlanCache, config: ReplayConfig) -> dict[str, float]:
    return {system.name: round(goodput_of(system, timeline, plans, config), 4) for system in (Ours, CheckpointRestart)}


def emulated_phases_row(timeline: Timeline, plans: PlanCache, config: ReplayConfig, emulated: PhaseModel) -> dict:
    """Ours and checkpoint-restart with the emulated replay's detect and restart (one host, labelled)."""
    phases = replace(config.phases, detect_s=emulated.detect_s, restart_s=emulated.restart_s)
    return {"label": "emulated single-GPU nodes on one host, not ~1000 ranks",
            "detect_s": round(emulated.detect_s, 3), "restart_s": round(emulated.restart_s, 3),
            "goodput": goodputs(timeline, plans, replace(config, phases=phases))}


def snapshot_sweep(timeline: Timeline, plans: PlanCache, config: ReplayConfig, factors) -> list[dict]:
    """Ours' goodput at fixed per-step factors (every plan the same), and at multiples of the per-plan
    extrapolation (sensitivity: the one H200 measurement may be off either way)."""
    fixed = replace(config, snapshot_overhead_per_gb_s=None)
    rows = [{"factor": f, "ours_goodput": round(goodput_of(Ours, timeline, plans,
                                                           replace(fixed, snapshot_overhead=f - 1.0)), 4)}
            for f in factors]
    if all(p.snapshot_bytes_per_gpu is not None for p in plans.plans.values() if p.samples_per_s > 0):
        rows += [{"per_plan_rate_times": k, "ours_goodput": round(goodput_of(Ours, timeline, plans, replace(
            config, snapshot_overhead_per_gb_s=H200_OVERHEAD_PER_GB_S * k)), 4)} for k in (1, 2, 5, 10)]
    return rows


def join_policy_rows(timeline: Timeline, plans: PlanCache, config: ReplayConfig) -> dict[str, dict]:
    rows, ideal = {}, ideal_samples(timeline, plans)
    for policy, meaning in JOIN_POLICIES.items():
        ledger = CheckpointRestart(timeline, plans, replace(config, join_policy=policy)).replay()
        rows[policy] = {"meaning": meaning, "goodput": round(ledger.committed_samples / ideal, 4),
                        "committed_samples": round(ledger.committed_samples),
                        "lost_samples": round(ledger.lost_samples), "lost_steps": ledger.lost_steps,
                        "replans": ledger.replans}
    return rows


PLAN_AHEAD_LABEL = (
    "built (orchestrate/controller.py check_joins, job/foresight.py): at a join the new state is planned in the "
    "background and the joined nodes' workers are started (process, imports) while the current plan trains; the "
    "switch at a step boundary then pays no planning and no process start, only the rebuild of the process groups "
    "over every rank (switch_s) + restore + warm-up. The states one node loss away are planned in the background "
    "once per pool (a pool's nodes are interchangeable), so such a loss pays no planning once they are planned. "
    "Notices: built too (check_notices, job/notice_ahead.py): the state without the noticed nodes is planned and "
    "its workers and process groups set up while the job trains, then switched to (notice_ahead)")


def scaled_switch_row(config: ReplayConfig, measured: dict | None, switch) -> dict | None:
    """The switch as the restart times the emulated ratio of a prepared join's restart to an unprepared one's
    (an extrapolation from 3 emulated nodes on one host to ~1000 ranks, labelled so)."""
    if not measured:
        return None
    ratio = measured["with_plan_ahead"]["restart_s"] / measured["without_plan_ahead"]["restart_s"]
    switch_s = config.phases.restart_s * ratio
    return {"ratio": round(ratio, 3), "switch_s": round(switch_s, 2), "ours_goodput": switch(switch_s),
            "label": "extrapolated: restart_s x (emulated restart with the joined node's workers started ahead / "
                     "without), medians of spot_replay_join_cost.py; not a measurement at ~1000 ranks"}


def restart_for(timeline: Timeline, plans: PlanCache, config: ReplayConfig, target: float) -> float | None:
    """The restart (and switch) at which ours reaches `target` with `config` (plan-ahead on)."""
    at = lambda r: goodput_of(Ours, timeline, plans, replace(  # noqa: E731
        config, phases=replace(config.phases, restart_s=r, switch_s=None)))
    if at(0.0) < target:
        return None
    low, high = 0.0, 600.0
    for _ in range(30):
        mid = (low + high) / 2
        low, high = (mid, high) if at(mid) >= target else (low, mid)
    return round(low, 2)


def plan_ahead_row(timeline: Timeline, plans: PlanCache, config: ReplayConfig, notice_s: float = 120.0,
                   measured: dict | None = None) -> dict:
    on = replace(config, plan_ahead=True)
    switch = lambda s: round(goodput_of(Ours, timeline, plans, replace(  # noqa: E731
        on, phases=replace(on.phases, switch_s=s))), 4)
    return {"label": PLAN_AHEAD_LABEL,
            "switch_s": config.phases.switch, "switch_s_basis": config.phases.basis.get("switch_s", ""),
            "ours_goodput": round(goodput_of(Ours, timeline, plans, on), 4),
            "ours_goodput_without_plan_ahead": round(goodput_of(Ours, timeline, plans,
                                                                replace(config, plan_ahead=False)), 4),
            "ours_goodput_by_switch_s": {f"{s:g}": switch(s) for s in (30.0, 10.0, 3.0)},
            "measured_in_emulation": measured,
            "switch_scaled_by_emulated_ratio": scaled_switch_row(config, measured, switch),
            "restart_s_for_goodput_0.90_with_plan_ahead": restart_for(timeline, plans, on, 0.90),
            f"ours_goodput_with_notice_{notice_s:g}s": round(goodput_of(Ours, timeline, plans,
                                                                        replace(on, notice_s=notice_s)), 4),
            f"ours_goodput_with_notice_{notice_s:g}s_without_plan_ahead":
                round(goodput_of(Ours, timeline, plans, replace(config, notice_s=notice_s, plan_ahead=False)), 4),
            "notice_basis": "AWS sends a spot interruption notice 2 minutes ahead (best effort); the traces do not "
                            "record whether one came (see notice_ahead for the figure with and without)"}


def cost_figures(timeline: Timeline, plans: PlanCache, config: ReplayConfig, *, gpus_per_node: tuple[int, ...],
                 spot_pools: tuple[bool, ...], prices: Prices, seq_len: int, ledgers: dict) -> dict:
    """USD per million tokens: the spot fleet (every alive node billed whole, spot pools at the spot price) for ours
    and checkpoint-restart; every node on demand for the whole window for the same job on on-demand GPUs, run
    by checkpoint-restart (no loss to recover from, no snapshot overhead), its launch paid."""
    fleet = fleet_cost_usd(timeline, gpus_per_node, spot_pools, prices)
    on_demand = on_demand_cost_usd(timeline, gpus_per_node, prices)
    od_ledger = CheckpointRestart(on_demand_timeline(timeline), plans, config).replay()
    names = ("ours", "checkpoint_restart")
    per_m = {name: usd_per_million_tokens(fleet, ledgers[name].committed_samples, seq_len) for name in names}
    per_m["on_demand_only"] = usd_per_million_tokens(on_demand, od_ledger.committed_samples, seq_len)
    held = {name: held_cost_usd(ledgers[name].held, timeline.pools, gpus_per_node, spot_pools, prices)
            for name in names}
    held["on_demand_only"] = held_cost_usd(od_ledger.held, timeline.pools, gpus_per_node,
                                           (False,) * len(timeline.pools), prices)
    samples = {name: ledgers[name].committed_samples for name in names} | \
        {"on_demand_only": od_ledger.committed_samples}
    return {"usd_per_million_tokens": per_m, "fleet_usd": round(fleet, 2), "on_demand_usd": round(on_demand, 2),
            "on_demand_tokens": round(od_ledger.committed_samples * seq_len),
            "billing": "spot fleet: every alive node billed per second to every system replayed on it (the fleet "
                       "request holds them, used or not); on demand: every node for the whole window",
            "usd_per_million_tokens_held_nodes_only": {
                name: usd_per_million_tokens(held[name], samples[name], seq_len) for name in held},
            "held_usd": {name: round(usd, 2) for name, usd in held.items()},
            "billing_held_nodes_only": "each system billed only for the nodes its plan holds while restoring and "
                                       "running (the others released at once; plan-ahead's background build "
                                       "not billed); on demand: the full-cluster plan's nodes only"}


def gap_closers(timeline: Timeline, plans: PlanCache, config: ReplayConfig,
                periods=(1, 2, 4, 8, 16, 32)) -> list[dict]:
    """Ours' goodput with snapshots every k steps (the overhead divided by k; an unannounced loss goes back to
    the newest snapshot; modelled, the runtime snapshots every step), with and without plan-ahead."""
    rows, full = [], plans.get(timeline.pool_nodes)
    for k in periods:
        for ahead in (False, True):
            varied = replace(config, snapshot_every_steps=k, plan_ahead=ahead)
            ledger = Ours(timeline, plans, varied).replay()
            rows.append({"snapshot_every_steps": k, "plan_ahead": ahead, "lost_steps": ledger.lost_steps,
                         "snapshot_factor_full_plan": round(1 + snapshot_overhead(full, config) / k, 4),
                         "ours_goodput": round(ledger.committed_samples / ideal_samples(timeline, plans), 4)})
    return rows


def capped_planning_row(timeline: Timeline, plans: PlanCache, config: ReplayConfig, cap_s: float) -> dict:
    """Ours with each state's planning charged at most `cap_s` (the planner's time limit): the wall times
    measured on a loaded host include waiting for a CPU."""
    def unplanned(state):
        raise AssertionError(f"state {state} was not planned")
    capped = PlanCache(unplanned)
    capped.plans = {s: replace(p, planning_s=min(p.planning_s, cap_s)) for s, p in plans.plans.items()}
    return {"cap_s": cap_s, "ours_goodput": round(goodput_of(Ours, timeline, capped, config), 4),
            "ours_goodput_plan_ahead": round(goodput_of(Ours, timeline, capped, replace(config, plan_ahead=True)), 4)}


def costed_figures(timeline: Timeline, plans: PlanCache, config: ReplayConfig, *, emulated: PhaseModel,
                   gpus_per_node: tuple[int, ...], spot_pools: tuple[bool, ...], prices: Prices,
                   seq_len: int, ledgers: dict, planning_cap_s: float, join_cost: dict | None = None) -> dict:
    """Goodput with its costs in: the emulated phases beside the stated ones, the snapshot overhead, the
    baseline's join policies, plan-ahead and the other gap closers, USD per million tokens, and the 0.90 bar."""
    ours = ledgers["ours"].committed_samples / ideal_samples(timeline, plans)
    full = plans.get(timeline.pool_nodes)
    rate = state_rate_gb_per_s(full, max(gpus_per_node))
    scaled = overhead_scaled_to(rate)
    return {
        "emulated_phases": emulated_phases_row(timeline, plans, config, emulated),
        "snapshot_model": "per plan, the runtime's writers (snapshot_rate_runtime)"
        if config.snapshot_overhead_per_gb_s is not None else "fixed factor (snapshot_overhead_basis)",
        "snapshot_overhead_factor": round(1 + snapshot_overhead(full, config), 4),
        "snapshot_rate_runtime": runtime_rate_row(plans, full),
        "snapshot_state_rate_every_holder": {
            "GB_per_s_of_step_per_gpu_full_plan": round(rate, 3),
            "h200_measured_GB_per_s_of_step": round(H200_GB_PER_S, 3),
            "per_node_GB_per_s_of_step": round(full.bytes_per_node / GB / full.iteration_time_s, 1),
            "factor_every_step_scaled": round(1 + scaled, 3),
            "note": "the previous model, kept for comparison: the full-cluster plan's fullest node, every "
                    "pipeline's copy of its stage counted (checkpointed bytes / GPUs / iteration); the runtime "
                    "writes each unique chunk once per node-store copy (snapshot_rate_runtime)"},
        "snapshot_overhead_sweep": snapshot_sweep(timeline, plans, config, SWEEP_FACTORS),
        "join_policy": config.join_policy,
        "checkpoint_restart_by_join_policy": join_policy_rows(timeline, plans, config),
        "plan_ahead": config.plan_ahead,
        "plan_ahead_option": plan_ahead_row(timeline, plans, config, measured=join_cost),
        "snapshot_every_steps": config.snapshot_every_steps,
        "gap_closers": {"basis": "the replay's snapshot model, divided by k for snapshots every k steps",
                        "rows": gap_closers(timeline, plans, config)},
        "planning_capped_at_time_limit": capped_planning_row(timeline, plans, config, planning_cap_s),
        "cost_per_token": cost_figures(timeline, plans, config, gpus_per_node=gpus_per_node, spot_pools=spot_pools,
                                       prices=prices, seq_len=seq_len, ledgers=ledgers),
        "bar": {"ours_goodput": round(ours, 4), "target": 0.90, "met": ours >= 0.90},
    }
