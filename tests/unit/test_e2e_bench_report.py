"""benchmarks/e2e_bench.py's report: a plan's gap to its prediction split on the critical rank into compute and
sync against the cost model's own per-stage figures, and the bar line's pass/fail."""
from __future__ import annotations

import pytest

from benchmarks import e2e_bench  # noqa: E402
from autohet_ray.cluster.spec import cluster_from_dict  # noqa: E402
from autohet_ray.cost.evaluate import evaluate_plan  # noqa: E402
from autohet_ray.model.spec import load_model  # noqa: E402
from autohet_ray.plan.rankmap import build_rank_map  # noqa: E402
from autohet_ray.plan.schema import plan_from_dict  # noqa: E402
from autohet_ray.profile.analytic import analytic_profile  # noqa: E402

NODES = {"name": "two", "nodes": [{"name": "a", "device": "H800", "count": 1},
                                  {"name": "c", "device": "H20", "count": 2}]}
STAGE = {"tp": 1, "device_type": "H20", "node": "c"}
PLAN = {"schema_version": 1, "model": "tiny-gpt", "global_batch": 4, "micro_batch": 1, "seq_len": 16,
        "pipelines": [{"num_microbatches": 2, "stages": [STAGE | {"layers": [0, 2], "devices": [0]},
                                                         {"layers": [2, 4], "tp": 1, "device_type": "H800",
                                                          "node": "a", "devices": [0]}]},
                      {"num_microbatches": 2, "stages": [STAGE | {"layers": [0, 4], "devices": [1]}]}]}


def test_gap_is_split_on_the_critical_rank_against_its_predicted_stage():
    spec, cluster, plan = load_model("tiny-gpt"), cluster_from_dict(NODES), plan_from_dict(PLAN)
    ev = evaluate_plan(plan, cluster, spec, analytic_profile(spec, cluster, 16))
    rank = 1                                             # pipeline 0's last stage, on a
    info = build_rank_map(plan, spec.num_layers).ranks[rank]
    exposed = ev.sync_exposed_s[f"{info.node}:{info.device}"]
    compute_end = ev.stage_sync_end_s[0][1] - exposed
    step = {"iteration_s": ev.iteration_time_s + 0.4,
            "critical_rank": {"rank": rank, "compute_end_s": compute_end + 0.1, "sync_s": exposed + 0.2,
                              "flush_s": 0.15, "optimizer_s": 0.0, "step_s": 1.0}}
    gap = e2e_bench.gap_parts(step, plan, ev, spec.num_layers)
    assert gap["gap_s"] == pytest.approx(0.4) and gap["flush_s"] == 0.15
    assert (gap["compute_s"], gap["sync_s"], gap["other_s"]) == (pytest.approx(0.1), pytest.approx(0.2),
                                                                 pytest.approx(0.1))
    assert (gap["compute_share"], gap["sync_share"]) == (pytest.approx(0.25), pytest.approx(0.5))


def _result(predicted: float, measured: float) -> dict:
    return {"predicted_iteration_s": predicted, "measured_iteration_s": measured, "error": measured / predicted - 1}


def test_bars_pass_within_ten_percent_and_fail_beyond():
    good = {"m": {"autohet": _result(1.0, 1.05), "megatron": _result(3.0, 3.2),
                  "predicted_speedup": 3.0, "measured_speedup": 3.2 / 1.05}}
    bars = e2e_bench.bars(good)
    assert bars["plan_error"]["pass"] and bars["speedup"]["pass"] and bars["plan_error"]["worst"] == "m megatron"
    bad = {"m": {"autohet": _result(1.0, 1.0), "megatron": _result(3.0, 3.6),
                 "predicted_speedup": 3.0, "measured_speedup": 3.6}}
    bars = e2e_bench.bars(bad)
    assert not bars["plan_error"]["pass"] and bars["plan_error"]["error"] == pytest.approx(0.2)
    assert not bars["speedup"]["pass"] and "FAIL" in e2e_bench._bar_line(bars)
