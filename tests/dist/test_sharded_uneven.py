"""Uneven slices chosen by the plan (Stage.slice_weight), through the real runtime on gloo/CPU.

The engine reads the weights from the plan itself (nothing passed beside it, as the workers build it). In
fp64 over 5 steps: losses, final weights and moments within 1e-10 relative of the unsharded run and within
the numerics tests' tolerance of the one-process reference. Memory: each rank's resident optimizer bytes
(masters and moments, counted from its tensors) are the share of its units' state the cost model gives its
stage (1 / cost.sharding.shard_ways), within 5%: they follow the weights, not an equal split.
"""
from __future__ import annotations

import pytest
import torch

from _harness import FAMILY_SPECS, _rel, compare, pipeline, reference_run
from _sharded_worker import ShardCase, run_pairs
from autohet_ray.cost.sharding import shard_ways
from autohet_ray.profile.precision import precision
from autohet_ray.runtime import run_world

EXACT = 1e-10
LAYERWISE = (pipeline(2, (0, 1, 1), (1, 4, 1)), pipeline(3, (0, 3, 1), (3, 4, 1)))
MB_SIZES_TP2 = (pipeline(1, (0, 4, 2), micro_batch=3), pipeline(2, (0, 2, 1), (2, 4, 1)))

CASES = [
    ShardCase(name="layerwise-llama-3to1", spec=FAMILY_SPECS["llama"], pipelines=LAYERWISE,
              slice_weights=((3.0, 1.0), (1.0, 0.4))),
    # a TP2 stage against two TP1 stages: each TP2 rank's slices of an atom against the TP1 holder's
    ShardCase(name="tp2_vs_tp1-gpt-uneven", spec=FAMILY_SPECS["gpt"], pipelines=MB_SIZES_TP2,
              slice_weights=((0.5,), (1.0, 2.5))),
    ShardCase(name="layerwise-llama-bf16-uneven", spec=FAMILY_SPECS["llama"], pipelines=LAYERWISE,
              slice_weights=((3.0, 1.0), (1.0, 0.4)), dtype=torch.bfloat16),
]


@pytest.fixture(scope="module")
def world():
    return run_world(run_pairs, 4, CASES)


def _worst_state(a: dict, b: dict) -> float:
    assert set(a) == set(b), set(a) ^ set(b)
    return max(_rel(b[n][0], a[n][0]) for n in a if n != "optim.step")


@pytest.mark.parametrize("case", [c for c in CASES if c.dtype == torch.float64], ids=lambda c: c.name)
def test_fp64_uneven_slices_equal_unsharded_and_reference(case, world):
    per_rank = [r[case.name] for r in world]
    assert all(r["sharded"]["sharded_ops"] for r in per_rank)
    for rank, r in enumerate(per_rank):
        none, sharded = r["none"], r["sharded"]
        for step, (a, b) in enumerate(zip(none["losses"], sharded["losses"])):
            assert abs(b - a) <= EXACT * abs(a), f"rank {rank} step {step}: {b} vs {a}"
        assert _worst_state(none["state"], sharded["state"]) <= EXACT, rank
        assert _worst_state(none["grads"], sharded["grads"]) <= EXACT, rank
    report = compare(case, [r["sharded"] for r in per_rank], reference_run(case))
    assert not report.problems, "\n".join(report.problems[:20])


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_resident_optimizer_bytes_follow_the_uneven_weights(case, world):
    """Measured sharded / unsharded optimizer bytes per rank against the cost model's share for its stage
    (bf16: fp32 master and moments, 12 bytes either way; fp64: the weight is its own master, so the unsharded
    run keeps 16 bytes of moments and a slice 24 of master and moments)."""
    bf16 = precision("bfloat16")
    per_param = (bf16.sharded_state_bytes / bf16.optimizer_state_bytes if case.dtype == torch.bfloat16
                 else 24 / 16)
    shares, plan = [], case.plan
    for rank, r in enumerate(r[case.name] for r in world):
        k, j = r["sharded"]["pipeline"], r["sharded"]["stage"]
        share = 1 / shard_ways(plan, k, j, case.spec)
        predicted = share * per_param
        measured = r["sharded"]["optimizer_bytes"] / r["none"]["optimizer_bytes"]
        assert abs(measured / predicted - 1) <= 0.05, f"rank {rank}: {measured:.4f} vs predicted {predicted:.4f}"
        shares.append(share)
    assert max(shares) / min(shares) > 1.5          # the weights really made the slices differ
