"""The planner within 1% of the independent exhaustive optimum under money goals, on every instance of
benchmarks/money_optimality.py: $ per token (subsets of the GPUs included) and the most samples/s within 75% of
the fleet's $/hour. Marked `cli` (a slow tier): 62 planner runs and exhaustive searches."""
import importlib.util
import math
import pathlib

import pytest

_BENCH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "money_optimality.py"
_spec = importlib.util.spec_from_file_location("money_optimality", _BENCH)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

pytestmark = pytest.mark.cli


@pytest.mark.parametrize("goal", ["cost", "budget"])
@pytest.mark.parametrize("index", range(len(bench.MONEY_INSTANCES)))
def test_planner_within_one_percent_of_exhaustive_optimum_for_money_goals(index, goal):
    row = bench.run_money_instance(bench.MONEY_INSTANCES[index], goal)
    assert math.isinf(row["optimum_key"]) == math.isinf(row["planner_key"]), row["planner_reason"]
    assert row["gap"] <= bench.BAR, (f"{row['cluster']} {row['model']} L={row['layers']} B={row['batch']}: "
                                     f"planner {row['planner_key']:.6g} {row['planner_plan']} vs optimum "
                                     f"{row['optimum_key']:.6g} {row['optimum_plan']}")


def test_the_instances_cover_plans_of_several_gpus_and_every_batch_size():
    batches = {i[3] for i in bench.MONEY_INSTANCES}
    assert len(bench.MONEY_INSTANCES) >= 31 and max(batches) == 64
    assert {i[4] for i in bench.MONEY_INSTANCES} >= {1, 2, 4, None}
