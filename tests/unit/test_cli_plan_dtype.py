"""`autohet plan --dtype`: fp32 and bf16 plans are priced as the catalog says (bf16 tensor peak vs the
non-tensor FP32 peak; 2 vs 4 bytes per activation element), and --json carries the proven lower bound."""
from __future__ import annotations

import json

import pytest

from autohet_ray import cli
from autohet_ray.cluster.catalog import CATALOG


def _plan(capsys, dtype: str) -> dict:
    assert cli.main(["plan", "--cluster", "jobs/clusters/paper-24.yaml", "--model", "gpt3-1.3b", "--global-batch",
                     "32", "--dtype", dtype, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.cli
def test_fp32_and_bf16_plans_differ_as_the_catalog_says(capsys):
    bf16, fp32 = _plan(capsys, "bf16"), _plan(capsys, "fp32")
    assert (bf16["dtype"], fp32["dtype"]) == ("bfloat16", "float32")
    slowest_ratio = min(CATALOG[d].bf16_tflops / CATALOG[d].fp32_tflops
                        for d in ("A100-80GB", "H800", "H20"))
    # compute dominates: fp32 is slower by at least the smallest peak ratio, up to the links and sync
    assert fp32["predicted"]["iteration_time_s"] > 0.5 * slowest_ratio * bf16["predicted"]["iteration_time_s"]
    assert max(fp32["predicted"]["peak_memory_bytes_per_device"].values()) != \
        max(bf16["predicted"]["peak_memory_bytes_per_device"].values())
    for report in (bf16, fp32):
        assert 0 < report["lower_bound_iteration_s"] <= report["predicted"]["iteration_time_s"]


@pytest.mark.cli
def test_evaluate_prices_the_dtype_the_plan_was_made_for(capsys, tmp_path):
    fp32 = _plan(capsys, "fp32")
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(fp32))
    args = ["evaluate", "--plan", str(path), "--cluster", "jobs/clusters/paper-24.yaml", "--json"]
    assert cli.main(args) == 0
    recorded = json.loads(capsys.readouterr().out)
    assert recorded["dtype"] == "float32"
    assert abs(recorded["predicted"]["iteration_time_s"] / fp32["predicted"]["iteration_time_s"] - 1) < 1e-9
    assert cli.main(args + ["--dtype", "bf16"]) == 0
    as_bf16 = json.loads(capsys.readouterr().out)
    assert as_bf16["dtype"] == "bfloat16"
    assert as_bf16["predicted"]["iteration_time_s"] < recorded["predicted"]["iteration_time_s"]
