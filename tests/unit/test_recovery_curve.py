"""benchmarks/recovery_curve.py: the whole-recovery ratio per cloud bandwidth, the phase model fitted to it,
where local-first stops paying, and which point is the headline."""
from __future__ import annotations

import math

import pytest

from benchmarks import recovery_curve as rc  # noqa: E402

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
    """Pairs whose cloud-only recovery is 5 s plus 40 MiB per rank at the rate delivered, local-first about 4 s."""
    return [point(10, 4.0, 9.0, 4.0), point(20, 4.1, 7.0, 2.0), point(1000, 3.9, 6.0, 1.0)]


def test_a_pair_repriced_at_another_bandwidth_keeps_its_other_phases():
    p = point(20, 4.0, 7.0, 2.0)
    assert rc.repriced(p, 20) == pytest.approx(7.0 / 4.0)
    assert rc.repriced(p, 40) == pytest.approx(6.0 / 4.0)
    assert rc.repriced(p, 40, first_step=False) == pytest.approx((6.0 - 2.0) / (4.0 - 2.0))


def test_the_model_is_checked_on_each_point_from_the_other_pairs_alone():
    check = rc.model_check(curve())
    assert [c["cloud_mib_s_per_rank"] for c in check] == [10, 20, 1000]
    # the 10 MiB/s point from the other two at 10 MiB/s: median of 9/4.1 and 9/3.9
    assert check[0]["modelled"] == round((9 / 4.1 + 9 / 3.9) / 2, 3)
    # the 1000 MiB/s point: the others delivered at most 20 MiB/s, so it is predicted at that ceiling
    assert check[2]["modelled"] == round((7 / 4.0 + 7 / 4.1) / 2, 3)
    assert check[2]["error"] == round(check[2]["modelled"] / check[2]["measured"] - 1, 3)
    assert rc.model_check(curve()[:1]) == []


def test_the_curve_without_the_s3_ceiling_is_the_median_and_range_of_the_repriced_pairs():
    at = rc.modelled(curve(), 2000)
    ratios = sorted([(5 + 0.02) / 4.0, (5 + 0.02) / 4.1, (5 + 0.02) / 3.9])
    assert at["speedup_total"] == round(ratios[1], 3) and at["range"] == [round(ratios[0], 3), round(ratios[2], 3)]


def test_local_first_stops_paying_where_the_repriced_ratio_falls_below_the_gain():
    pairs = [point(20, 4.0, 5.0, 2.0), point(20, 4.0, 5.0, 2.0), point(20, 8.0, 8.0, 1.0)]   # rests 3, 3, 7 s
    where = rc.stops_paying(pairs)
    assert where["below_1_1"]["mib_s_per_rank"] == round(40 / (1.1 * 4 - 3), 1)
    assert where["below_1_0"]["range"] == [40.0, 40.0 / (8 - 7)]
    assert rc.repriced(pairs[0], 40 / (1.1 * 4 - 3)) == pytest.approx(1.1)


def test_a_ratio_that_stays_above_the_gain_at_any_bandwidth_says_so():
    where = rc.stops_paying(curve())                    # every pair: 5 s of rest > 1.1 x ~4 s
    assert where["below_1_1"] == {"mib_s_per_rank": None, "range": [None, None]}
    assert rc.rate_at_ratio(curve()[0], 1.1) == math.inf
    without_first_step = rc.stops_paying(curve(), first_step=False)     # 3 s of rest, ~2 s local
    assert without_first_step["below_1_1"]["mib_s_per_rank"] is None


def test_the_headline_is_the_measured_point_at_25_gbit_with_the_rate_the_server_delivered():
    points = curve() + [point(rc.TARGET_MIB_S, 4.0, 6.5, 1.0)]
    head = rc.headline(points)
    assert head["speedup_total"] == 1.625 and head["target_measured"] and head["measured"]
    assert head["delivered_mib_s_per_rank"] == 40.0 and head["limited_by"] == "s3 server"
    # modelled at a real 25 Gb/s: each pair's fetch of 40 MiB repriced, the median of the middle two of four
    middle = sorted(rc.repriced(p, rc.TARGET_MIB_S) for p in points)[1:3]
    assert head["at_target_modelled"]["speedup_total"] == round(sum(middle) / 2, 3)


def test_without_a_25_gbit_point_the_headline_is_the_fastest_link_and_says_so():
    head = rc.headline(curve())
    assert head["speedup_total"] == round(6.0 / 3.9, 3) and not head["target_measured"]
    assert head["cloud_link"].startswith("1000 MiB/s")


def test_sensitivity_replaces_one_phase_in_both_recoveries():
    local, cloud = phases(4.0, 0.1, detect=0.1, first_step=2.0), phases(8.0, 3.0, detect=0.2, first_step=2.5)
    moved = rc.sensitivity(local, cloud)
    assert moved["measured"] == 2.0
    assert moved["detect_3s_vanished_node"] == round((8.0 - 0.2 + 3) / (4.0 - 0.1 + 3), 3)
    assert moved["first_step_0s_fast_gpus"] == round(5.5 / 2.0, 3)
    assert moved["restart_30s_1000_ranks"] < moved["detect_3s_vanished_node"] < moved["measured"]


def summary(total, fetch, cloud_mib, *, ranks_in_plan=True):
    plan = [["a:H800x1[0,2)", "c:H20x1[2,4)"]]
    out = {"phases": phases(total, fetch), "bytes_by_tier": {"cloud": int(cloud_mib * MiB)}, "plan": plan,
           "lost_steps": 0}
    return out if ranks_in_plan else out | {"num_ranks": 4}


def test_the_report_is_assembled_from_saved_pairs_and_names_its_headline_pair():
    saved = {"pairs": [{"cloud_mib_s_per_rank": 20.0, "local_first": summary(4.0, 0.1, 0),
                        "cloud_reload": summary(8.0, 2.0, 80)},
                       {"cloud_mib_s_per_rank": round(rc.TARGET_MIB_S, 3), "local_first": summary(4.0, 0.1, 0),
                        "cloud_reload": summary(6.0, 2.0, 80, ranks_in_plan=False)}]}
    report = rc.curve_report(rc.pairs_from_saved(saved), steady_s=1.5)
    assert [p["cloud_mib_per_rank"] for p in report["curve"]] == [40.0, 20.0]   # 2 ranks from the plan, then 4
    assert report["speedup_total"] == 1.5 and report["headline"]["target_measured"]
    assert report["cloud_reload"]["phases"]["total_s"] == 6.0
    assert report["cloud_bytes_after_single_node_loss"] == 0 and report["lost_steps_max"] == 0
    assert len(report["curve_modelled_without_s3_ceiling"]) == len(rc.MODELLED_RATES)


def test_a_slow_first_step_in_one_recovery_is_evened_out_by_the_runs_median_first_step():
    slow = summary(8.0, 2.0, 80) | {"phases": phases(8.0, 2.0, first_step=6.0)}   # 4 s more than the others
    saved = {"pairs": [{"cloud_mib_s_per_rank": 20.0, "local_first": summary(4.0, 0.1, 0),
                        "cloud_reload": slow},
                       {"cloud_mib_s_per_rank": 40.0, "local_first": summary(4.0, 0.1, 0),
                        "cloud_reload": summary(5.0, 1.0, 80)}]}
    report = rc.curve_report(rc.pairs_from_saved(saved), steady_s=1.5)
    assert report["same_first_step_s"] == 2.0
    assert report["curve"][0]["speedup_total"] == 2.0
    assert report["curve"][0]["speedup_total_same_first_step"] == round((8.0 - 6.0 + 2.0) / 4.0, 3)
    assert report["curve"][1]["speedup_total_same_first_step"] == report["curve"][1]["speedup_total"] == 1.25


def test_the_benchmark_takes_its_curve_from_one_option_and_refuses_a_bad_one(capsys):
    from benchmarks import recovery_bench
    args = recovery_bench.parse_args([])
    assert args.bandwidths[-1] == pytest.approx(rc.TARGET_MIB_S) and len(args.bandwidths) >= 4
    assert args.overhead_blocks == 0 and recovery_bench.parse_args(["--overhead-only"]).overhead_blocks == 2
    with pytest.raises(SystemExit) as exit_:
        recovery_bench.parse_args(["--cloud-mib-s", "20,fast"])
    assert exit_.value.code == 2 and "--cloud-mib-s: bandwidth 'fast'" in capsys.readouterr().err


def test_a_saved_run_is_reassembled_with_its_measured_pairs_and_its_other_fields(tmp_path, capsys):
    import json

    from benchmarks import recovery_bench
    saved = {"model": {"hidden": 256}, "phase_model": {"stale": True}, "steady_step_s": 1.5,
             "pairs": [{"cloud_mib_s_per_rank": m, "local_first": summary(4.0, 0.1, 0),
                        "cloud_reload": summary(4.0 + 80 / 2 / m, 80 / 2 / m, 80)} for m in (20.0, 40.0)]}
    path = tmp_path / "run.jsonl"
    path.write_text("not json\n" + json.dumps(saved) + "\n")
    assert recovery_bench.main(["--reassemble", str(path)]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["model"] == {"hidden": 256} and "phase_model" not in out and out["reassembled_from"] == str(path)
    assert [p["speedup_total"] for p in out["curve"]] == [1.5, 1.25]
    assert out["pairs"] == saved["pairs"] and not out["headline"]["target_measured"]
