"""The recovery curve of benchmarks/recovery_bench.py as plain data: the whole-recovery ratio (cloud-only reload
over local-first recovery, each counted from the loss to the end of the first step after it) per cloud bandwidth,
a phase model fitted to the measured points, where local-first stops paying, and the headline.

Every figure here is computed from measured recovery phases (the dicts of recovery_bench.phases); what the
phase model adds is labelled "modelled". No Ray, no processes: the unit tier tests it.
"""
from __future__ import annotations

import math
import statistics

MiB = 1 << 20
GBIT_MIB_S = 1e9 / 8 / MiB                 # 1 Gb/s in MiB/s (119.2)
TARGET_MIB_S = 25 * GBIT_MIB_S             # 25 Gb/s per node: what benchmarks/spot_replay.py assumes for S3
PAYS_GAIN = 1.1                            # below a 10% gain, a single run on this host cannot tell the two apart
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
            "cloud_fetch_s": cloud["fetch_s"], "local_fetch_s": local["fetch_s"],
            "cloud_mib_per_rank": round(cloud_bytes / ranks / MiB, 2)}


def fit_phase_model(points: list[dict]) -> dict:
    """cloud-only(bw) = R + B / min(bw, S), local-first = L: R the median of the cloud-only recoveries less
    their fetch, B the MiB each rank reads, S the best rate the S3 server here delivered, L the median
    local-first recovery. The ranges of R and L over the pairs show this host's noise."""
    assert points
    rest = [p["cloud_only_s"] - p["cloud_fetch_s"] for p in points]
    local = [p["local_first_s"] for p in points]
    return {"cloud_rest_s": round(statistics.median(rest), 3), "local_first_s": round(statistics.median(local), 3),
            "mib_per_rank": statistics.median(p["cloud_mib_per_rank"] for p in points),
            "server_ceiling_mib_s_per_rank": max(p["delivered_mib_s_per_rank"] for p in points),
            "cloud_rest_s_range": [round(min(rest), 3), round(max(rest), 3)],
            "local_first_s_range": [round(min(local), 3), round(max(local), 3)]}


def model_ratio(model: dict, mib_s: float, *, server_ceiling: bool = True) -> float:
    """The modelled whole-recovery ratio at `mib_s` per rank, with this host's S3 ceiling or without it."""
    rate = min(mib_s, model["server_ceiling_mib_s_per_rank"]) if server_ceiling else mib_s
    return (model["cloud_rest_s"] + model["mib_per_rank"] / rate) / model["local_first_s"]


def rate_at_ratio(model: dict, ratio: float) -> float:
    """The per-rank bandwidth above which the modelled ratio (no S3 ceiling) is below `ratio`; inf: never,
    the ratio stays above it at any bandwidth (local-first keeps paying that much)."""
    room = ratio * model["local_first_s"] - model["cloud_rest_s"]
    return model["mib_per_rank"] / room if room > 0 else math.inf


def model_check(model: dict, points: list[dict]) -> list[dict]:
    """The model against each measured point (with the measured S3 ceiling)."""
    return [{"cloud_mib_s_per_rank": p["cloud_mib_s_per_rank"], "measured": p["speedup_total"],
             "modelled": round(model_ratio(model, p["cloud_mib_s_per_rank"]), 3),
             "error": round(model_ratio(model, p["cloud_mib_s_per_rank"]) / p["speedup_total"] - 1, 3)}
            for p in points]


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


def stops_paying(model: dict) -> dict:
    """Where local-first stops paying (modelled, without this host's S3 ceiling)."""
    def rate(ratio):
        r = rate_at_ratio(model, ratio)
        return None if math.isinf(r) else round(r, 1)
    return {"ratio_1_1_above_mib_s_per_rank": rate(PAYS_GAIN), "ratio_1_0_above_mib_s_per_rank": rate(1.0),
            "asymptote": round(model["cloud_rest_s"] / model["local_first_s"], 3),
            "note": "null: the modelled ratio stays above that value at any bandwidth"}


def headline(points: list[dict], model: dict, target_mib_s: float = TARGET_MIB_S) -> dict:
    """The headline: the measured whole-recovery ratio at the target bandwidth (else the highest measured),
    named with the rate the S3 server delivered, beside the model's figure at the target without the ceiling."""
    at = [p for p in points if math.isclose(p["cloud_mib_s_per_rank"], target_mib_s, rel_tol=1e-3)]
    point = at[0] if at else max(points, key=lambda p: p["cloud_mib_s_per_rank"])
    return {"speedup_total": point["speedup_total"], "measured": True,
            "cloud_link": point["cloud_link"], "delivered_mib_s_per_rank": point["delivered_mib_s_per_rank"],
            "limited_by": point["limited_by"], "target_measured": bool(at),
            "speedup_total_at_target_modelled": round(model_ratio(model, target_mib_s, server_ceiling=False), 3),
            "target": describe_rate(target_mib_s)}
