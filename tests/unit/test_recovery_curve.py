"""benchmarks/recovery_curve.py: the whole-recovery ratio per cloud bandwidth, the phase model fitted to it,
where local-first stops paying, and which point is the headline."""
from __future__ import annotations

import math
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))

import recovery_curve as rc  # noqa: E402

MiB = 1 << 20


def phases(total, fetch, *, detect=0.1, restart=0.3, first_step=2.0) -> dict:
    return {"total_s": total, "fetch_s": fetch, "detect_s": detect, "restart_s": restart, "first_step_s": first_step}


def point(mib_s, local_total, cloud_total, cloud_fetch, *, mib_per_rank=40.0, ranks=2, steady=1.8):
    return rc.curve_point(mib_s, phases(local_total, 0.1), phases(cloud_total, cloud_fetch),
                          cloud_bytes=int(mib_per_rank * ranks * MiB), ranks=ranks, steady_s=steady)


def test_bandwidths_take_mib_s_and_gbit_in_the_order_given():
    assert rc.parse_bandwidths("20, 10,1gbit,25GBIT") == pytest.approx([20, 10, 119.209, 2980.23], rel=1e-4)


@pytest.mark.parametrize("text, named", [("20,fast", "'fast'"), ("0", "'0'"), ("-5", "'-5'"), ("inf", "'inf'"),
                                         ("20,20", "repeat"), ("", "''")])
def test_a_bad_bandwidth_is_named(text, named):
    with pytest.raises(ValueError, match=named):
        rc.parse_bandwidths(text)


def test_a_point_is_the_ratio_of_whole_recoveries_and_names_what_limited_the_link():
    throttled = point(20, 4.0, 8.0, 2.0)               # 40 MiB per rank in 2 s: the throttle's 20 MiB/s
    assert throttled["speedup_total"] == 2.0
    assert throttled["delivered_mib_s_per_rank"] == 20.0 and throttled["limited_by"] == "throttle"
    capped = point(2980, 4.0, 7.0, 1.0)                # 40 MiB/s delivered of the 2980 asked: the S3 server
    assert capped["limited_by"] == "s3 server" and capped["delivered_mib_s_per_rank"] == 40.0


def test_speedup_to_normal_pace_counts_the_first_step_beyond_a_steady_one():
    p = point(20, 4.0, 8.0, 2.0, steady=1.5)           # first steps of 2.0 s: 0.5 s beyond a steady step
    assert p["speedup"] == pytest.approx((8.0 - 1.5) / (4.0 - 1.5), abs=1e-3)


def curve():
    """cloud-only = 5 s + 40 MiB / rate (ceiling 40 MiB/s), local-first = 4 s."""
    return [point(10, 4.0, 9.0, 4.0), point(20, 4.1, 7.0, 2.0), point(1000, 3.9, 6.0, 1.0)]


def test_the_model_is_fitted_from_the_measured_phases_and_reproduces_them():
    model = rc.fit_phase_model(curve())
    assert model == {"cloud_rest_s": 5.0, "local_first_s": 4.0, "mib_per_rank": 40.0,
                     "server_ceiling_mib_s_per_rank": 40.0, "cloud_rest_s_range": [5.0, 5.0],
                     "local_first_s_range": [3.9, 4.1]}
    check = rc.model_check(model, curve())
    assert [c["modelled"] for c in check] == [2.25, 1.75, 1.5]
    assert max(abs(c["error"]) for c in check) < 0.03
    assert rc.model_ratio(model, 2980, server_ceiling=False) == pytest.approx((5 + 40 / 2980) / 4)


def test_local_first_stops_paying_where_the_modelled_ratio_falls_to_the_gain():
    model = {"cloud_rest_s": 3.0, "local_first_s": 4.0, "mib_per_rank": 40.0, "server_ceiling_mib_s_per_rank": 40.0}
    where = rc.stops_paying(model)
    assert where["ratio_1_1_above_mib_s_per_rank"] == pytest.approx(40 / (1.1 * 4 - 3), abs=0.1)
    assert where["ratio_1_0_above_mib_s_per_rank"] == 40.0
    assert rc.model_ratio(model, 40 / (1.1 * 4 - 3), server_ceiling=False) == pytest.approx(1.1)
    assert where["asymptote"] == 0.75


def test_a_ratio_that_stays_above_the_gain_at_any_bandwidth_says_so():
    where = rc.stops_paying(rc.fit_phase_model(curve()))       # rest 5 s > 1.1 x 4 s
    assert where["ratio_1_1_above_mib_s_per_rank"] is None and where["ratio_1_0_above_mib_s_per_rank"] is None
    assert rc.rate_at_ratio(rc.fit_phase_model(curve()), 1.1) == math.inf


def test_the_headline_is_the_measured_point_at_25_gbit_with_the_rate_the_server_delivered():
    head = rc.headline(curve() + [point(rc.TARGET_MIB_S, 4.0, 6.5, 1.0)], rc.fit_phase_model(curve()))
    assert head["speedup_total"] == 1.625 and head["target_measured"] and head["measured"]
    assert head["delivered_mib_s_per_rank"] == 40.0 and head["limited_by"] == "s3 server"
    assert head["speedup_total_at_target_modelled"] == pytest.approx((5 + 40 / rc.TARGET_MIB_S) / 4, abs=1e-3)


def test_without_a_25_gbit_point_the_headline_is_the_fastest_link_and_says_so():
    head = rc.headline(curve(), rc.fit_phase_model(curve()))
    assert head["speedup_total"] == round(6.0 / 3.9, 3) and not head["target_measured"]
    assert head["cloud_link"].startswith("1000 MiB/s")


def test_sensitivity_replaces_one_phase_in_both_recoveries():
    local, cloud = phases(4.0, 0.1, detect=0.1, first_step=2.0), phases(8.0, 3.0, detect=0.2, first_step=2.5)
    moved = rc.sensitivity(local, cloud)
    assert moved["measured"] == 2.0
    assert moved["detect_3s_vanished_node"] == round((8.0 - 0.2 + 3) / (4.0 - 0.1 + 3), 3)
    assert moved["first_step_0s_fast_gpus"] == round(5.5 / 2.0, 3)
    assert moved["restart_30s_1000_ranks"] < moved["detect_3s_vanished_node"] < moved["measured"]
