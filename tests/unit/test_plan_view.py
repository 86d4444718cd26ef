"""`autohet show` draws the plan's predicted per-stage durations (seconds), and the plan JSON carries them."""
import json

import pytest

from autohet_ray import ConfigError
from autohet_ray.cost import evaluate_plan
from autohet_ray.plan import Pipeline, Plan, plan_from_dict, validate_plan
from autohet_ray.cli.plan_view import draw_plan, timeline_rows, timeline_text
from test_cost import MODEL, _cluster, _profile, _stage


def _priced(schedule="1f1b") -> Plan:
    slow = Pipeline(num_microbatches=3, stages=(_stage((0, 1)), _stage((1, 4), devices=(1,))))
    same = Pipeline(num_microbatches=3, stages=(_stage((0, 1), devices=(2,)), _stage((1, 4), devices=(3,))))
    plan = Plan(model=MODEL.name, global_batch=6, micro_batch=1, seq_len=16, pipelines=(slow, same),
                schedule=schedule)
    return plan.with_predicted(evaluate_plan(plan, _cluster(), MODEL, _profile()).predicted())


def test_plan_json_carries_stage_durations_and_old_plans_still_load():
    plan = _priced("zb-h1")
    ev = evaluate_plan(plan, _cluster(), MODEL, _profile())
    raw = json.loads(plan.to_json())
    stage = raw["predicted"]["stages"][0][1]
    assert (stage["fwd_s"], stage["bwd_s"], stage["wgrad_s"]) == pytest.approx(ev.stage_parts_s[0][1])
    assert raw["predicted"]["links"][0][0]["activation_s"] == pytest.approx(ev.link_times_s[0][0])
    assert raw["predicted"]["capacity_bytes_per_device"]["n0:1"] == ev.capacity_bytes["n0:1"]
    back = plan_from_dict(raw)
    assert back.predicted == plan.predicted
    validate_plan(back, _cluster(), MODEL)
    for key in ("stages", "links", "capacity_bytes_per_device", "dtype"):      # a plan from before: no durations
        raw["predicted"].pop(key, None)
    old = plan_from_dict(raw)
    assert old.predicted.stages == () and "relative" in timeline_text(old)
    validate_plan(old, _cluster(), MODEL)


def test_malformed_or_mismatched_durations_are_refused():
    raw = json.loads(_priced().to_json())
    raw["predicted"]["stages"][0][0]["fwd_s"] = "fast"
    with pytest.raises(ConfigError, match="number of seconds"):
        plan_from_dict(raw)
    raw = json.loads(_priced().to_json())
    raw["predicted"]["stages"][0].pop()
    with pytest.raises(ConfigError, match="predicted.stages"):
        validate_plan(plan_from_dict(raw), _cluster(), MODEL)


def test_timeline_is_in_seconds_and_identical_pipelines_are_drawn_once():
    plan = _priced()
    rows = timeline_rows(plan)
    assert [(r.pipeline, r.stage, r.copies) for r in rows] == [(0, 0, 2), (0, 1, 2)]
    t = plan.predicted.stages[0][1]
    forwards = [s for s in rows[1].slots if s.kind == "F"]
    assert forwards[0].end_s - forwards[0].start_s == pytest.approx(t.fwd_s)
    # the optimizer of each stage ends by the predicted iteration time; the slowest one ends at it
    assert max(r.optimizer[1] for r in rows) == pytest.approx(plan.predicted.iteration_time_s)
    text = timeline_text(plan)
    assert "ms per column" in text and "p0 s1 Xx1 L[1,4) (2 pipelines)" in text and "/14.0" in text


def test_png_is_written(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "plan.png"
    draw_plan(_priced("zb-h1"), str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
