import json

import pytest

from autohet_ray import ConfigError
from autohet_ray.cluster import load_cluster
from autohet_ray.model import PRESETS
from autohet_ray.plan import (Pipeline, Plan, Predicted, Stage, build_rank_map, plan_from_dict, plan_from_json,
                              validate_plan)

CLUSTER = load_cluster("jobs/clusters/paper-24.yaml")
MODEL = PRESETS["gpt3-1.3b"]


def _plan(**over):
    p0 = Pipeline(num_microbatches=5, stages=(
        Stage(layers=(0, 6), tp=2, device_type="H20", node="h20", devices=(0, 1)),
        Stage(layers=(6, 24), tp=4, device_type="H800", node="h800", devices=(0, 1, 2, 3))))
    p1 = Pipeline(num_microbatches=3, stages=(
        Stage(layers=(0, 24), tp=1, device_type="A100-80GB", node="a100", devices=(5,)),))
    base = dict(model=MODEL.name, model_spec=MODEL.to_dict(), cluster="paper-24", global_batch=16,
                micro_batch=2, seq_len=2048, pipelines=(p0, p1),
                predicted=Predicted(iteration_time_s=1.5, samples_per_s=10.7, peak_memory_bytes=123,
                                    peak_memory_bytes_per_device={"h20:0": 123}))
    base.update(over)
    return Plan(**base)


def test_round_trip_json():
    plan = _plan()
    again = plan_from_json(plan.to_json())
    assert again == plan
    raw = json.loads(plan.to_json())
    assert raw["schema_version"] == 3 and raw["pipelines"][0]["stages"][1]["layers"] == [6, 24]
    assert raw["schedule"] == "1f1b"
    assert "micro_batch" not in raw["pipelines"][0]
    assert raw["predicted"]["peak_memory_bytes"] == 123
    validate_plan(plan, CLUSTER, MODEL)


def test_schedule_round_trips_older_plans_read_as_1f1b_and_unknown_is_refused():
    plan = _plan(schedule="zb-h1")
    raw = json.loads(plan.to_json())
    assert raw["schedule"] == "zb-h1" and plan_from_dict(raw) == plan
    raw["schema_version"] = 2                  # version 2 had no schedule: the field is not read
    assert plan_from_dict(raw).schedule == "1f1b"
    raw["schema_version"], raw["schedule"] = 3, "interleaved"
    with pytest.raises(ConfigError, match="schedule='interleaved'; valid: 1f1b, zb-h1"):
        plan_from_dict(raw)
    assert plan.with_schedule("1f1b").predicted is None and plan.with_schedule("zb-h1") is plan


def test_per_pipeline_micro_batch_round_trips_and_version_1_still_reads():
    plan = _plan(pipelines=(_plan().pipelines[0], Pipeline(num_microbatches=6, stages=_plan().pipelines[1].stages,
                                                            micro_batch=1)))
    assert [plan.samples_of(k) for k in range(2)] == [10, 6] and plan.sample_offset(1) == 10
    raw = json.loads(plan.to_json())
    assert raw["pipelines"][1]["micro_batch"] == 1
    assert plan_from_dict(raw) == plan
    validate_plan(plan, CLUSTER, MODEL)
    raw["schema_version"] = 1                  # version 1 had no per-pipeline size: the field is not read
    del raw["pipelines"][1]["micro_batch"]
    assert plan_from_dict(raw) == _plan(pipelines=(plan.pipelines[0], _plan(
        pipelines=(Pipeline(num_microbatches=6, stages=plan.pipelines[1].stages),)).pipelines[0]))
    with pytest.raises(ConfigError, match="pipelines take 20 samples .* but global_batch=16"):
        validate_plan(_plan(pipelines=(plan.pipelines[0], Pipeline(num_microbatches=5,
                                                                   stages=plan.pipelines[1].stages,
                                                                   micro_batch=2))), CLUSTER, MODEL)
    with pytest.raises(ConfigError, match=r"pipelines\[1\].micro_batch=0 must be >= 1"):
        validate_plan(_plan(pipelines=(plan.pipelines[0], Pipeline(num_microbatches=6,
                                                                   stages=plan.pipelines[1].stages,
                                                                   micro_batch=0))), CLUSTER, MODEL)


def _with_stage(pipeline: int, stage: int, **changes):
    plan = _plan()
    pipes = list(plan.pipelines)
    stages = list(pipes[pipeline].stages)
    stages[stage] = Stage(**{**stages[stage].__dict__, **changes})
    pipes[pipeline] = Pipeline(num_microbatches=pipes[pipeline].num_microbatches, stages=tuple(stages))
    return _plan(pipelines=tuple(pipes))


@pytest.mark.parametrize("plan, fragment", [
    (_with_stage(0, 1, layers=(7, 24)), "must start at 6"),
    (_with_stage(0, 1, layers=(6, 23)), "covers layers [0, 23)"),
    (_with_stage(1, 0, node="h20", device_type="H20", devices=(1,)), "GPU h20:1 is used by"),
    (_with_stage(0, 0, tp=3, devices=(0, 1, 2)), "tp=3 must be a power of two"),
    (_with_stage(0, 0, device_type="H800"), "node 'h20' has H20"),
    (_with_stage(0, 0, devices=(7, 8)), "distinct GPU indices in [0, 8)"),
    (_with_stage(0, 0, node="nowhere"), "unknown node 'nowhere'"),
    (_plan(global_batch=18), "sum to 8, but global_batch/micro_batch = 9"),
    (_plan(global_batch=15), "not divisible by micro_batch=2"),
])
def test_validation_names_the_problem(plan, fragment):
    with pytest.raises(ConfigError) as info:
        validate_plan(plan, CLUSTER, MODEL)
    assert fragment in str(info.value)


def test_tp_must_divide_heads():
    spec = PRESETS["tiny-llama"]                    # 2 kv heads
    plan = _plan(model=spec.name, seq_len=16, pipelines=(Pipeline(num_microbatches=8, stages=(
        Stage(layers=(0, 4), tp=4, device_type="H20", node="h20", devices=(0, 1, 2, 3)),)),))
    with pytest.raises(ConfigError, match="TP degree 4 does not divide"):
        validate_plan(plan, CLUSTER, spec)


def test_seq_len_beyond_the_positions_table_is_refused():
    with pytest.raises(ConfigError, match=r"seq_len=4096 must lie in \[1, 2048\] \(gpt3-1.3b's max_seq_len\)"):
        validate_plan(_plan(seq_len=4096), CLUSTER, MODEL)


@pytest.mark.parametrize("raw, fragment", [
    ({"schema_version": 99}, "schema_version=99"),
    ({"schema_version": 1, "model": "m", "global_batch": 1, "micro_batch": 1, "seq_len": 1, "pipelines": []},
     "non-empty list"),
    ({"schema_version": 1, "model": "m", "global_batch": 1, "micro_batch": 1, "seq_len": 1,
      "pipelines": [{"num_microbatches": 1, "stages": [{"layers": [0], "tp": 1}]}]}, "must be [start, end)"),
])
def test_malformed_plan_json(raw, fragment):
    with pytest.raises(ConfigError) as info:
        plan_from_dict(raw)
    assert fragment in str(info.value)
    with pytest.raises(ConfigError, match="not valid JSON"):
        plan_from_json("{")


def test_rank_map_groups_and_layer_holders():
    rm = build_rank_map(_plan(), MODEL.num_layers)
    assert rm.world_size == 7
    assert rm.stage_ranks == (((0, 1), (2, 3, 4, 5)), ((6,),))
    assert rm.tp_group(3) == (2, 3, 4, 5) and rm.prev_stage(3) == (0, 1) and rm.next_stage(0) == (2, 3, 4, 5)
    assert rm.next_stage(6) is None and rm.prev_stage(6) is None
    # layer 3 is held by pipeline 0's TP2 stage and pipeline 1's TP1 stage: degrees differ -> overlap sync
    assert [h.ranks for h in rm.layer_holders[3]] == [(0, 1), (6,)]
    assert rm.sync_groups(3) is None
    assert rm.embedding_holders() == ((0, 1), (6,)) and rm.head_holders() == ((2, 3, 4, 5), (6,))
    info = rm.ranks[4]
    assert (info.pipeline, info.stage, info.tp_rank, info.node, info.device) == (0, 1, 2, "h800", 2)


def test_symmetric_sync_groups_pair_tp_ranks():
    p = tuple(Pipeline(num_microbatches=4, stages=(Stage(layers=(0, 24), tp=2, device_type="H800", node="h800",
                                                         devices=(2 * k, 2 * k + 1)),)) for k in range(2))
    rm = build_rank_map(_plan(pipelines=p), MODEL.num_layers)
    assert rm.sync_groups(0) == ((0, 2), (1, 3))
