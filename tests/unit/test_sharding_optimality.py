"""The planner with optimizer_sharding="auto" within 1% of the independent exhaustive optimum (tests/exhaustive.py,
every stage with and without sharded state): a fast subset of benchmarks/optimality/sharding.py (all 30 there)."""

import pytest

from benchmarks.optimality import sharding as bench

CHECKED = [0, 3, 8, 11, 14, 17, 20]     # 5 whose optimum shards (A10/V100, RTX-4090/A10, A100/V100), 2 not


@pytest.mark.parametrize("index", CHECKED, ids=lambda i: f"instance{i}")
def test_planner_with_sharding_within_one_percent_of_exhaustive_optimum(index):
    row = bench.run_instance(bench.INSTANCES[index])
    shards = index in bench.SHARDING_OPTIMUM
    assert (row["optimum_sharded_stages"] > 0) == shards          # the instance tests the choice it claims to
    if shards:                                                    # and sharding is what makes the optimum faster
        assert row["optimum_s"] < row["unsharded_optimum_s"] * (1 - 1e-3)
    assert row["gap"] <= bench.BAR, (f"{row['cluster']} {row['model']} {row['schedule']}: planner "
                                     f"{row['planner_s']:.5f} s {row['planner_plan']} vs optimum "
                                     f"{row['optimum_s']:.5f} s {row['optimum_plan']}")
