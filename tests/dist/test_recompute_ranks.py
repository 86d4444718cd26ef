"""Activation recomputation (torch.utils.checkpoint around each block of a recomputing stage) changes no
number: on an asymmetric plan with TP2, the same plan with recomputation on some or all stages gives the same
losses and first-step gradients as without it, step by step (rel 1e-6, fp64), under 1F1B and zb-h1 (deferred
weight gradients read the recomputed inputs)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from _harness import FAMILY_SPECS, Case, pipeline, run_cases
from autohet_ray.runtime import run_world

WORLD_SIZE = 5


def _with_recompute(pipelines, which) -> tuple:
    """`which(k, j)`: whether stage j of pipeline k recomputes."""
    return tuple(replace(p, stages=tuple(replace(s, recompute=which(k, j)) for j, s in enumerate(p.stages)))
                 for k, p in enumerate(pipelines))


PIPELINES = (pipeline(3, (0, 1, 1), (1, 3, 2), (3, 4, 1)), pipeline(2, (0, 4, 1)))
MIXED = lambda k, j: (k, j) in {(0, 1), (1, 0)}  # noqa: E731
VARIANTS = {"off": lambda k, j: False, "all": lambda k, j: True, "some": MIXED}
RUNS = (("llama", "1f1b", ("all", "some")), ("llama", "zb-h1", ("all", "some")), ("gpt", "1f1b", ("all",)))
CASES = [Case(name=f"{family}-{schedule}-{variant}", spec=FAMILY_SPECS[family], schedule=schedule, steps=3,
              pipelines=_with_recompute(PIPELINES, VARIANTS[variant]))
         for family, schedule, variants in RUNS for variant in ("off", *variants)]


@pytest.fixture(scope="module")
def results():
    return run_world(run_cases, WORLD_SIZE, CASES)


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-30)


@pytest.mark.slow
@pytest.mark.parametrize("family,schedule,variant",
                         [(f, s, v) for f, s, variants in RUNS for v in variants])
def test_recompute_matches_plain(results, family, schedule, variant):
    off, on = f"{family}-{schedule}-off", f"{family}-{schedule}-{variant}"
    assert any(s.recompute for c in CASES if c.name == on for p in c.pipelines for s in p.stages)
    for rank in results:
        assert len(rank[on]["losses"]) == 3
        for step, (a, b) in enumerate(zip(rank[on]["losses"], rank[off]["losses"])):
            assert _rel(a, b) <= 1e-6, (step, a, b)
        for name, g in rank[off]["grads"].items():
            got, want = rank[on]["grads"][name][0], g[0]
            assert float((got - want).norm()) <= 1e-6 * max(float(want.norm()), 1e-30), name
