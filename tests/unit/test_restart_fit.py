"""The spot replay's restart phase from benchmarks/restart_scaling.py's fits (replay/phases.py restart_from_fit)."""
import pytest

from autohet_ray import ConfigError
from autohet_ray.replay.phases import restart_from_fit


def _fit(form, **coefficients):
    linear, power = coefficients.get("linear", {"a": 0, "b": 0}), coefficients.get("power", {"c": 0, "k": 0})
    return {"form": form, "linear": linear, "power": power}


def test_each_phase_is_evaluated_at_the_rank_count_and_the_stated_start_added():
    report = {"rows": [{"ranks": 8}, {"ranks": 16}],
              "fits": {"groups_members_only_s": _fit("linear", linear={"a": 0.5, "b": 0.001}),
                       "engine_s": _fit("power", power={"c": 0.01, "k": 0.5}),
                       "state_s": _fit("linear", linear={"a": -3.0, "b": 0.0})}}     # a negative fit counts 0
    seconds, basis = restart_from_fit(report, 1024, process_start_s=5.0)
    assert seconds == pytest.approx(0.5 + 1.024 + 0.01 * 32 + 0.0 + 5.0)
    assert "extrapolated to 1024" in basis and "[8, 16]" in basis and "5 s stated" in basis


def test_a_report_without_the_fits_is_refused_naming_them():
    with pytest.raises(ConfigError, match="engine_s"):
        restart_from_fit({"fits": {"groups_members_only_s": _fit("linear"), "state_s": _fit("linear")}}, 64, 5.0)
