"""The planner within 1% of the independent exhaustive optimum under money goals, on every instance of
benchmarks/optimality/money.py: samples/s, $ per token (subsets of the GPUs included) and the most samples/s within
75% of the fleet's $/hour; and the pipeline shapes the planner once missed. Marked `cli` (a slow tier): 117 planner
runs and exhaustive searches."""
import math

import pytest

from benchmarks.optimality import money as bench

pytestmark = pytest.mark.cli


@pytest.mark.parametrize("goal", ["throughput", "cost", "budget"])
@pytest.mark.parametrize("index", range(len(bench.MONEY_INSTANCES)))
def test_planner_within_one_percent_of_exhaustive_optimum_for_money_goals(index, goal):
    row = bench.run_money_instance(bench.MONEY_INSTANCES[index], goal)
    assert math.isinf(row["optimum_key"]) == math.isinf(row["planner_key"]), row["planner_reason"]
    assert row["gap"] <= bench.BAR, (f"{row['cluster']} {row['model']} L={row['layers']} B={row['batch']}: "
                                     f"planner {row['planner_key']:.6g} {row['planner_plan']} vs optimum "
                                     f"{row['optimum_key']:.6g} {row['optimum_plan']}")


@pytest.mark.parametrize("index", range(len(bench.SHAPE_INSTANCES)))
def test_planner_within_one_percent_where_pipelines_of_different_depth_share_a_type(index):
    """Throughput: 2 GPUs of one type + 1 of another at batch 32 / micro-batch 2 and 64 / 4 (the planner once
    missed two pipelines of different depth with uneven micro-batch counts by up to 10.5%)."""
    row = bench.run_money_instance(bench.SHAPE_INSTANCES[index], "throughput")
    assert row["gap"] <= bench.BAR, (f"{row['cluster']} {row['model']} B={row['batch']}: planner "
                                     f"{row['planner_key']:.6g} {row['planner_plan']} vs optimum "
                                     f"{row['optimum_key']:.6g} {row['optimum_plan']}")


def test_the_instances_cover_plans_of_several_gpus_and_every_batch_size():
    batches = {i[3] for i in bench.MONEY_INSTANCES}
    assert len(bench.MONEY_INSTANCES) >= 31 and max(batches) == 64
    assert {i[4] for i in bench.MONEY_INSTANCES} >= {1, 2, 4, None}
