"""The replay's figures for prepared switches (issue 34's bar): a removal with a spot notice, and a join, are
prepared while the job trains (the next plan planned, its workers and process groups built: the controller's
check_notices / check_joins with orchestrate/switch_ahead.py), so the job stands still only for the switch
(switch_s: flush, stop the old workers, restore into the standby ones), not for a restart. A removal without a
notice stays a loss: detect + restart at the stated phases. The headline's assumption is named beside it, and
the figure without notices is given with it."""
from __future__ import annotations

from dataclasses import replace

from autohet_ray import ConfigError
from autohet_ray.replay.accounting import ideal_samples
from autohet_ray.replay.phases import last_json_line
from autohet_ray.replay.planning import PlanCache
from autohet_ray.replay.prices import usd_per_million_tokens
from autohet_ray.replay.systems import Ours, ReplayConfig
from autohet_ray.replay.timeline import Timeline

NOTICE_SWEEP_S = (0.0, 30.0, 120.0)
SWITCH_SWEEP_S = (1.0, 3.0, 10.0, 30.0)
PREPARED_MODES = ("notice_prepared", "join_prepared_groups_ahead")
NOTICE_BASIS = (
    "AWS: a spot interruption notice comes 2 minutes before EC2 stops the instance (IMDSv2 "
    "spot/instance-action, best effort), polled every 5 s by the job's SpotWatcher; the traces do not record "
    "whether a notice came, so notices at 120 s assume every removal was an interruption with its notice (GCP "
    "gives 30 s: notice_s 30)")


def measured_switch(path: str) -> dict:
    """The emulated prepared switch (benchmarks/spot_replay_switch_cost.py medians): the dearer of a prepared
    notice's and a prepared join's (groups built ahead), with its label and the other modes beside it."""
    try:
        line = last_json_line(path)
        medians = line["medians"]
        by_mode = {m: float(medians[m]["switch_s"]) for m in PREPARED_MODES if m in medians}
    except (OSError, IndexError, KeyError, TypeError, ValueError) as err:
        raise ConfigError(f"{path}: not a spot_replay_switch_cost.py result with medians per mode ({err})") from None
    if not by_mode:
        raise ConfigError(f"{path}: no prepared switch was measured ({sorted(medians)})")
    mode = max(by_mode, key=by_mode.get)
    return {"switch_s": by_mode[mode], "mode": mode, "file": path, "command": line.get("command"),
            "label": line.get("label", "emulated"),
            "job_stopped_s_median_by_mode": {m: v["switch_s"] for m, v in medians.items()}}


def ours_row(timeline: Timeline, plans: PlanCache, config: ReplayConfig, *, fleet_usd: float, seq_len: int) -> dict:
    ledger = Ours(timeline, plans, config).replay()
    return {"ours_goodput": round(ledger.committed_samples / ideal_samples(timeline, plans), 4),
            "ours_usd_per_million_tokens": usd_per_million_tokens(fleet_usd, ledger.committed_samples, seq_len),
            "lost_steps": ledger.lost_steps}


def with_phases(config: ReplayConfig, *, notice_s: float, switch_s: float | None) -> ReplayConfig:
    return replace(config, plan_ahead=True, notice_s=notice_s, phases=replace(config.phases, switch_s=switch_s))


def notice_figures(timeline: Timeline, plans: PlanCache, config: ReplayConfig, *, fleet_usd: float, seq_len: int,
                   switch: dict | None) -> dict:
    """Ours with prepared switches: the headline cases (no notices, notices at 120 s, the figure before), the
    grid over notice_s and switch_s, and the bar with the assumption that sets it."""
    row = lambda notice, s: ours_row(timeline, plans, with_phases(config, notice_s=notice, switch_s=s),  # noqa: E731
                                     fleet_usd=fleet_usd, seq_len=seq_len)
    switch_s = config.phases.switch
    cases = {"no_notices": row(0.0, switch_s), "notices_120s": row(120.0, switch_s),
             "before (no notices, every switch a 30 s restart: the figure of 2026-12-05)": row(0.0, None)}
    grid = {f"notice_{n:g}s": {f"switch_{s:g}s": row(n, s)["ours_goodput"] for s in SWITCH_SWEEP_S}
            for n in NOTICE_SWEEP_S}
    return {"label": " ".join(__doc__.split()),
            "switch_s": switch_s, "switch_s_basis": config.phases.basis.get("switch_s", ""),
            "measured_switch": switch, "notice_basis": NOTICE_BASIS,
            "unnoticed_loss": f"detect {config.phases.detect_s:g} s + restart {config.phases.restart_s:g} s (stated)",
            "cases": cases, "goodput_by_notice_and_switch_s": grid,
            "notice_s_for_goodput_0.90": notice_needed(grid),
            "switch_s_for_goodput_0.90_with_notices_120s": switch_needed(
                lambda s: row(120.0, s)["ours_goodput"], config.phases.restart_s, 0.90)}


def switch_needed(goodput_at, high_s: float, target: float) -> float | None:
    """The largest switch_s (up to `high_s`) at which goodput_at(switch_s) >= target (None: not even at 0)."""
    if goodput_at(0.0) < target:
        return None
    if goodput_at(high_s) >= target:
        return high_s
    low, high = 0.0, high_s
    for _ in range(20):
        mid = (low + high) / 2
        low, high = (mid, high) if goodput_at(mid) >= target else (low, mid)
    return round(low, 2)


def notice_needed(grid: dict) -> dict:
    """Per switch_s, the smallest swept notice with goodput >= 0.90 (None: none of them)."""
    out = {}
    for s in SWITCH_SWEEP_S:
        met = [n for n in NOTICE_SWEEP_S if grid[f"notice_{n:g}s"][f"switch_{s:g}s"] >= 0.90]
        out[f"switch_{s:g}s"] = min(met) if met else None
    return out


def bar_row(headline: float, config: ReplayConfig, figures: dict) -> dict:
    """The 0.90 bar: the headline under the replay's own assumptions, named, and the figure without notices."""
    cases = figures["cases"]
    return {"ours_goodput": round(headline, 4), "target": 0.90, "met": headline >= 0.90,
            "headline_assumes": f"notice_s {config.notice_s:g} ({'every removal noticed' if config.notice_s else 'no notices'}"
                                f"), switch_s {config.phases.switch:g} ({config.phases.basis.get('switch_s', '')}), "
                                f"unnoticed loss: detect {config.phases.detect_s:g} s + restart "
                                f"{config.phases.restart_s:g} s",
            "ours_goodput_without_notices": cases["no_notices"]["ours_goodput"],
            "met_without_notices": cases["no_notices"]["ours_goodput"] >= 0.90,
            "ours_goodput_with_notices_120s": cases["notices_120s"]["ours_goodput"],
            "met_with_notices_120s": cases["notices_120s"]["ours_goodput"] >= 0.90}
