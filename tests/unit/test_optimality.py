"""The planner within 1% of the independent exhaustive optimum (a fast subset of benchmarks/optimality_bench.py).

Instances the planner is known to miss are marked xfail(strict=True): the suite stays green, the defect stays
visible, and the mark must go once the planner reaches the optimum there.
"""
import importlib.util
import pathlib

import pytest

_BENCH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "optimality_bench.py"
_spec = importlib.util.spec_from_file_location("optimality_bench", _BENCH)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

# index in bench.INSTANCES -> the gap measured when the mark was set (planner / optimum - 1)
KNOWN_MISSES = {
    9: "planner 0.22717 s vs optimum 0.22382 s (+1.5%): one 3-stage pipeline of mb 1 vs A100+H800 with mb 2",
    13: "planner 0.73785 s vs optimum 0.64342 s (+14.7%) under zb-h1: H800 first vs A100 first, H800 last",
    22: "planner 0.40770 s vs optimum 0.39824 s (+2.4%): V100 stage first vs A100 stage first",
    37: "planner 0.06258 s vs optimum 0.06159 s (+1.6%) under zb-h1: 2x (V100 tp2 [0,1) + H200) vs [0,2) split",
}
CHECKED = [0, 3, 12, 17, 23, 29] + sorted(KNOWN_MISSES)




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
