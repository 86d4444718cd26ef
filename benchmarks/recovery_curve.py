"""The recovery curve of benchmarks/recovery_bench.py as plain data: the whole-recovery ratio (cloud-only reload
over local-first recovery, each counted from the loss to the end of the first step after it) per cloud bandwidth,
a model that reprices each measured pair's cloud fetch at other bandwidths (checked leave-one-out against the
measured points), where local-first stops paying, and the headline.

Every figure here is computed from measured recovery phases (the dicts of recovery_bench.phases); what the
model adds is labelled "modelled". No Ray, no processes: the unit tier tests it.
"""
from __future__ import annotations

import math
import statistics

MiB = 1 << 20
GBIT_MIB_S = 1e9 / 8 / MiB                 # 1 Gb/s in MiB/s (119.2)
TARGET_MIB_S = 25 * GBIT_MIB_S             # 25 Gb/s per node: what benchmarks/spot_replay.py assumes for S3
PAYS_GAIN = 1.1                            # below a 10% gain, a single run on this host cannot tell the two apart
MODELLED_RATES = (20.0, 100.0, GBIT_MIB_S, 10 * GBIT_MIB_S, TARGET_MIB_S)   # the curve without the S3 ceiling
SERVER_BOUND = 0.8                         # delivered < 80% of the throttle: the S3 server set the rate, not it


def parse_bandwidths(text: str) -> list[float]:
    """'10,20,1gbit,25gbit' -> MiB/s per rank, in the order given; a token is MiB/s or N'gbit' (N Gb/s)."""
    values = []
    for token in (t.strip().lower() for t in text.split(",")):
        try:
            value = float(token[:-4]) * GBIT_MIB_S if token.endswith("gbit") else float(token)
        except ValueError:
            raise ValueError(f"bandwidth {token!r}: give MiB/s per rank (20) or Gb/s as e.g. 25gbit") from None
        if not value > 0 or math.isinf(value):
            raise ValueError(f"bandwidth {token!r} must be a positive, finite rate")
        values.append(value)
    if len(set(values)) != len(values):
        raise ValueError(f"bandwidths {text!r} repeat a value; give each once")
    return values


def describe_rate(mib_s: float) -> str:
    return f"{mib_s:.4g} MiB/s ({mib_s / GBIT_MIB_S:.3g} Gb/s)"


def resumed_s(phases: dict, steady_s: float) -> float:
    """Loss until training runs at its normal pace again: the first step counts only beyond a normal step."""
    return phases["total_s"] - phases["first_step_s"] + max(0.0, phases["first_step_s"] - steady_s)


def curve_point(mib_s: float, local: dict, cloud: dict, *, cloud_bytes: int, ranks: int, steady_s: float) -> dict:
    """One bandwidth's pair, measured side by side: `local`/`cloud` are the phases of the local-first and the
    cloud-only recovery of the same node loss; `cloud_bytes` what the cloud-only one read over `ranks` ranks."""
    assert cloud_bytes > 0 and ranks > 0 and cloud["fetch_s"] > 0, (cloud_bytes, ranks, cloud)
    delivered = cloud_bytes / ranks / MiB / cloud["fetch_s"]
    return {"cloud_mib_s_per_rank": round(mib_s, 3), "cloud_link": describe_rate(mib_s),
            "delivered_mib_s_per_rank": round(delivered, 2),
            "limited_by": "s3 server" if delivered < SERVER_BOUND * mib_s else "throttle",
            "speedup_total": round(cloud["total_s"] / local["total_s"], 3),
            "speedup": round(resumed_s(cloud, steady_s) / resumed_s(local, steady_s), 3),
            "local_first_s": local["total_s"], "cloud_only_s": cloud["total_s"],
            "local_first_step_s": local["first_step_s"], "cloud_first_step_s": cloud["first_step_s"],
            "cloud_fetch_s": cloud["fetch_s"], "local_fetch_s": local["fetch_s"],
            "cloud_mib_per_rank": round(cloud_bytes / ranks / MiB, 2)}


def _rest_and_local(point: dict, first_step: bool) -> tuple[float, float]:
    """The cloud-only recovery less its fetch, and the local-first one (without their first steps if asked)."""
    cloud = point["cloud_only_s"] - point["cloud_fetch_s"] - (0 if first_step else point["cloud_first_step_s"])
    return cloud, point["local_first_s"] - (0 if first_step else point["local_first_step_s"])


def repriced(point: dict, mib_s: float, *, first_step: bool = True) -> float:
    """The pair's whole-recovery ratio had its cloud fetch run at `mib_s` per rank (modelled): every other phase
    of both recoveries as measured side by side; without `first_step`, the first step is left out of both."""
    rest, local = _rest_and_local(point, first_step)
    return (rest + point["cloud_mib_per_rank"] / mib_s) / local


def server_ceiling(points: list[dict]) -> float:
    """The best rate per rank the S3 server here delivered to a restore."""
    return max(p["delivered_mib_s_per_rank"] for p in points)


def modelled(points: list[dict], mib_s: float, *, first_step: bool = True) -> dict:
    """The ratio at `mib_s` per rank without this host's S3 ceiling (modelled): each pair repriced, their
    median and range."""
    ratios = [repriced(p, mib_s, first_step=first_step) for p in points]
    return {"cloud_link": describe_rate(mib_s), "speedup_total": round(statistics.median(ratios), 3),
            "range": [round(min(ratios), 3), round(max(ratios), 3)]}


def model_check(points: list[dict]) -> list[dict]:
    """Leave one out: each measured point against the model of the other pairs at its throttle, capped at the
    rate the S3 server delivered to those others."""
    if len(points) < 2:
        return []
    checks = []
    for j, point in enumerate(points):
        others = points[:j] + points[j + 1:]
        rate = min(point["cloud_mib_s_per_rank"], server_ceiling(others))
        predicted = statistics.median(repriced(p, rate) for p in others)
        checks.append({"cloud_mib_s_per_rank": point["cloud_mib_s_per_rank"], "measured": point["speedup_total"],
                       "modelled": round(predicted, 3), "error": round(predicted / point["speedup_total"] - 1, 3)})
    return checks


def rate_at_ratio(point: dict, ratio: float, *, first_step: bool = True) -> float:
    """The per-rank bandwidth above which the pair's repriced ratio is below `ratio`; inf: never (local-first
    keeps paying at least that much at any bandwidth)."""
    cloud_rest, local = _rest_and_local(point, first_step)
    room = ratio * local - cloud_rest
    return point["cloud_mib_per_rank"] / room if room > 0 else math.inf


def stops_paying(points: list[dict], *, first_step: bool = True) -> dict:
    """Where local-first stops paying (modelled): the bandwidth per rank above which the whole-recovery ratio
    falls below 1.1 (a gain one run on this host cannot tell from noise) and below 1.0, median over the pairs."""
    def where(ratio):
        rates = [rate_at_ratio(p, ratio, first_step=first_step) for p in points]
        median = statistics.median(rates)
        return {"mib_s_per_rank": None if math.isinf(median) else round(median, 1),
                "range": [None if math.isinf(r) else round(r, 1) for r in (min(rates), max(rates))]}
    return {"below_1_1": where(PAYS_GAIN), "below_1_0": where(1.0),
            "note": "null: the ratio stays above that value at any bandwidth"}


def ratio_with(local: dict, cloud: dict, phase: str, seconds: float) -> float:
    """The whole-recovery ratio had `phase` taken `seconds` in both recoveries (the rest as measured)."""
    def total(phases):
        return phases["total_s"] - phases[phase] + seconds
    return round(total(cloud) / total(local), 3)


def sensitivity(local: dict, cloud: dict) -> dict:
    """How the measured ratio of one pair moves when a phase set by this host takes what it would elsewhere
    (modelled: that phase replaced in both recoveries, every other phase as measured)."""
    return {"measured": round(cloud["total_s"] / local["total_s"], 3),
            "detect_3s_vanished_node": ratio_with(local, cloud, "detect_s", 3.0),
            "restart_30s_1000_ranks": ratio_with(local, cloud, "restart_s", 30.0),
            "first_step_0s_fast_gpus": ratio_with(local, cloud, "first_step_s", 0.0),
            "first_step_2x_slower_host": ratio_with(local, cloud, "first_step_s", 2 * cloud["first_step_s"])}


def headline(points: list[dict], target_mib_s: float = TARGET_MIB_S) -> dict:
    """The headline: the measured whole-recovery ratio at the target bandwidth (else the highest measured),
    named with the rate the S3 server delivered, beside the model's figure at the target without the ceiling."""
    at = [p for p in points if math.isclose(p["cloud_mib_s_per_rank"], target_mib_s, rel_tol=1e-3)]
    point = at[0] if at else max(points, key=lambda p: p["cloud_mib_s_per_rank"])
    return {"speedup_total": point["speedup_total"], "measured": True,
            "cloud_link": point["cloud_link"], "delivered_mib_s_per_rank": point["delivered_mib_s_per_rank"],
            "limited_by": point["limited_by"], "target_measured": bool(at),
            "at_target_modelled": modelled(points, target_mib_s), "target": describe_rate(target_mib_s)}


def storage_bytes(bytes_by_tier: dict) -> int:
    """Bytes read from the storage tier; runs before 2026-12-05 named that tier "cloud"."""
    return bytes_by_tier.get("storage", 0) + bytes_by_tier.get("cloud", 0)


def ranks_of(summary: dict) -> int:
    """The ranks of a recovery: its report's num_ranks, else counted from its plan ('node:GPUxTP[a,b)')."""
    if "num_ranks" in summary:
        return summary["num_ranks"]
    return sum(int(stage.split("x")[-1].split("[")[0]) for pipeline in summary["plan"] for stage in pipeline)


def curve_report(pairs: list[tuple[float, dict, dict]], steady_s: float) -> dict:
    """The curve from the measured pairs [(MiB/s per rank, local-first summary, cloud-only summary)] (summaries:
    {"phases", "bytes_by_tier", "plan", ...}): each point, the model checked against them, the curve without
    this host's S3 ceiling, where local-first stops paying, and the headline with its pair's sensitivity."""
    points = [curve_point(mib_s, local["phases"], cloud["phases"], cloud_bytes=storage_bytes(cloud["bytes_by_tier"]),
                          ranks=ranks_of(cloud), steady_s=steady_s) for mib_s, local, cloud in pairs]
    # the first step does the same work in both modes: the run's median first step in both (modelled) takes
    # out the noise of one step on this shared host
    first = statistics.median(r["phases"]["first_step_s"] for _, lf, cr in pairs for r in (lf, cr))
    for point, (_, local, cloud) in zip(points, pairs):
        point["speedup_total_same_first_step"] = ratio_with(local["phases"], cloud["phases"], "first_step_s", first)
    head = headline(points)
    _, local, cloud = next(pair for pair, p in zip(pairs, points) if p["cloud_link"] == head["cloud_link"])
    return {"speedup_total": head["speedup_total"], "headline": head, "curve": points,
            "model_check": model_check(points), "server_ceiling_mib_s_per_rank": server_ceiling(points),
            "curve_modelled_without_s3_ceiling": [modelled(points, r) for r in MODELLED_RATES],
            "same_first_step_s": first, "stops_paying_modelled": stops_paying(points),
            "stops_paying_modelled_without_first_step": stops_paying(points, first_step=False),
            "sensitivity_modelled": sensitivity(local["phases"], cloud["phases"]),
            "speedup": next(p["speedup"] for p in points if p["cloud_link"] == head["cloud_link"]),
            "local_first": local, "cloud_reload": cloud, "steady_step_s": round(steady_s, 3),
            "lost_steps_max": max(r["lost_steps"] for _, lf, cr in pairs for r in (lf, cr)),
            "cloud_bytes_after_single_node_loss": max(storage_bytes(lf["bytes_by_tier"]) for _, lf, _ in pairs)}


def pairs_from_saved(saved: dict) -> list[tuple[float, dict, dict]]:
    """The measured pairs of a saved recovery_bench.py JSON line (to assemble its report again)."""
    return [(p["cloud_mib_s_per_rank"], p["local_first"], p["cloud_reload"]) for p in saved["pairs"]]
