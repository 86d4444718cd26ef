"""One replay: plan every availability state, run the three systems on the same clock, report goodput."""
from __future__ import annotations

import math
from dataclasses import replace

from autohet_ray.replay.accounting import ideal_rate, ideal_samples
from autohet_ray.replay.planning import PlanCache
from autohet_ray.replay.systems import SYSTEMS, Ours, ReplayConfig
from autohet_ray.replay.timeline import Timeline


def run_systems(timeline: Timeline, plans: PlanCache, config: ReplayConfig) -> dict:
    """Goodput of ours, checkpoint-restart and no-replan; every state is planned (and timed) first."""
    ideal = ideal_samples(timeline, plans)
    ledgers = {cls.name: cls(timeline, plans, config).replay() for cls in SYSTEMS}
    return {"ideal_samples": ideal, "ledgers": ledgers,
            "summary": {name: ledger.summary(ideal) for name, ledger in ledgers.items()}}


def goodput_of(system, timeline: Timeline, plans: PlanCache, config: ReplayConfig) -> float:
    ideal = ideal_samples(timeline, plans)
    return system(timeline, plans, config).replay().committed_samples / ideal


def young_daly_period_s(timeline: Timeline, plans: PlanCache, config: ReplayConfig, interruptions: int) -> float:
    """Young/Daly's checkpoint period sqrt(2 * C * M): C = the cloud upload of the fullest node of the
    full-cluster plan, M = the replay's mean time between the baseline's restarts."""
    if interruptions == 0:
        return math.inf
    full = plans.get(timeline.pool_nodes)
    upload = full.bytes_per_node / config.phases.cloud_upload_Bps
    return math.sqrt(2 * upload * timeline.window_s / interruptions)


def variants(timeline: Timeline, plans: PlanCache, config: ReplayConfig, cases: dict[str, dict]) -> list[dict]:
    """Goodput of each system under other assumptions (the plans are cached: no planning runs here).
    `cases`: name -> {"phases": {field: value}, "config": {field: value}} (other keys are ignored)."""
    rows = []
    for name, case in cases.items():
        varied = replace(config, phases=replace(config.phases, **case.get("phases", {})), **case.get("config", {}))
        row = {"variant": name}
        for system in SYSTEMS:
            row[system.name] = round(goodput_of(system, timeline, plans, varied), 4)
        rows.append(row)
    return rows


def restart_s_for_goodput(timeline: Timeline, plans: PlanCache, config: ReplayConfig, target: float) -> float | None:
    """The restart phase at which ours' goodput reaches `target` (bisection; None if even 0 s falls short)."""
    at = lambda r: goodput_of(Ours, timeline, plans, replace(config, phases=replace(config.phases, restart_s=r)))  # noqa: E731
    low, high = 0.0, 600.0
    if at(low) < target:
        return None
    if at(high) >= target:
        return high
    for _ in range(30):
        mid = (low + high) / 2
        low, high = (mid, high) if at(mid) >= target else (low, mid)
    return low


def ideal_series(timeline: Timeline, plans: PlanCache) -> dict:
    """The ideal samples/s as a step series for a plot: one value from each segment's start."""
    segments = timeline.segments()
    return {"times_s": [a for a, _, _ in segments], "ideal": [ideal_rate(s, plans) for _, _, s in segments]}


def on_demand_timeline(timeline: Timeline) -> Timeline:
    """The same window with every node of every pool alive throughout (the job on on-demand GPUs)."""
    return replace(timeline, initial=timeline.pool_nodes, events=())
