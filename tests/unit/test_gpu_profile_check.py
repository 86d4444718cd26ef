"""The prepared device check (benchmarks/gpu_profile_check.py) runs end to end; on CPU the per-layer profile and
the Engine's measured stage time describe the same work, so they agree to well within a factor of two."""
from __future__ import annotations

import json

import pytest

from benchmarks import gpu_profile_check  # noqa: E402


@pytest.mark.dist
def test_cpu_dry_run_compares_profile_and_engine(capsys):
    assert gpu_profile_check.main(["--steps", "2", "--warmup", "1", "--num-microbatches", "2"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["predicted_stage_s"] > 0 and out["measured_stage_s"] > 0
    assert 0.5 < out["measured_over_predicted"] < 2.0, out
