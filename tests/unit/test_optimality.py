"""The planner within 1% of the independent exhaustive optimum (a fast subset of benchmarks/optimality/plans.py).

Instances the planner is known to miss are marked xfail(strict=True): the suite stays green, the defect stays
visible, and the mark must go once the planner reaches the optimum there.
"""

import pytest

from benchmarks.optimality import plans as bench

# index in bench.INSTANCES -> the gap measured when the mark was set (planner / optimum - 1)
KNOWN_MISSES: dict[int, str] = {}
# once missed (fixed by the schedule's memory in the split and floor, and refine.py): 9 (one 3-stage pipeline of
# mb 1 vs A100+H800 with mb 2, +1.5%), 13 (zb-h1 stage order, +14.7%), 22 (V100 first vs A100 first, +2.4%),
# 37 (zb-h1 split [0,1) vs [0,2), +1.6%)
CHECKED = [0, 3, 9, 12, 13, 17, 22, 23, 29, 37]


def _param(i):
    marks = [pytest.mark.xfail(strict=True, reason=KNOWN_MISSES[i])] if i in KNOWN_MISSES else []
    return pytest.param(i, marks=marks, id=f"instance{i}")


@pytest.mark.parametrize("index", [_param(i) for i in CHECKED])
def test_planner_within_one_percent_of_exhaustive_optimum(index):
    row = bench.run_instance(bench.INSTANCES[index])
    assert row["bound_s"] <= row["optimum_s"]
    assert row["gap"] <= bench.BAR, (f"{row['cluster']} {row['model']} L={row['layers']} B={row['batch']} "
                                     f"{row['schedule']}: planner {row['planner_s']:.5f} s {row['planner_plan']} vs "
                                     f"optimum {row['optimum_s']:.5f} s {row['optimum_plan']}")


@pytest.mark.parametrize("index", range(len(bench.RECOMPUTE_INSTANCES)))
def test_planner_with_recomputation_within_one_percent_of_exhaustive_optimum(index):
    """Memory-tight instances under recompute="auto": the searcher tries every stage with and without."""
    row = bench.run_recompute_instance(bench.RECOMPUTE_INSTANCES[index])
    assert row["recomputing_stages"] > 0              # the optimum recomputes: the instance tests the choice
    assert row["bound_s"] <= row["optimum_s"]
    assert row["gap"] <= bench.BAR, (f"{row['cluster']} {row['model']} seq={row['seq_len']} {row['schedule']}: "
                                     f"planner {row['planner_s']:.5f} s {row['planner_plan']} vs "
                                     f"optimum {row['optimum_s']:.5f} s {row['optimum_plan']}")
