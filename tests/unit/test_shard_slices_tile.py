"""The slices a checkpoint stores of sharded optimizer state tile every tensor exactly once, on plans whose
holders differ in TP degree, hold a TP-replicated tensor at one TP degree (one reduce-scatter per TP
position, each slicing the whole tensor its own way: only one is stored), or tie the embeddings.
Pure: the sync plan and slice bounds every rank computes, no processes."""
from __future__ import annotations

import dataclasses

import pytest

from autohet_ray.layout import covers_exactly
from autohet_ray.model.spec import PRESETS
from autohet_ray.nn import param_shapes
from autohet_ray.nn.model import tied_names
from autohet_ray.plan.rankmap import build_rank_map
from autohet_ray.plan.schema import Pipeline, Plan, Stage
from autohet_ray.runtime.grad_sync import plan_grad_sync
from autohet_ray.runtime.parallelize import shard_dim
from autohet_ray.runtime.shard_layout import owned_pieces, slice_bounds, stored_copies


def _pipeline(m: int, *stages: tuple[int, int, int]) -> Pipeline:
    return Pipeline(num_microbatches=m, stages=tuple(
        Stage(layers=(a, b), tp=tp, device_type="cpu", node=f"n{m}", devices=tuple(range(tp))) for a, b, tp in stages))


PLANS = {
    "tp2_both": (_pipeline(2, (0, 4, 2)), _pipeline(3, (0, 2, 2), (2, 4, 2))),
    "tp2_vs_tp1": (_pipeline(1, (0, 4, 2)), _pipeline(2, (0, 2, 1), (2, 4, 1))),
    "tp4_vs_tp2_vs_tp1": (_pipeline(3, (0, 4, 4)), _pipeline(2, (0, 4, 2)), _pipeline(1, (0, 3, 1), (3, 4, 1))),
}


def stored(spec, pipelines, weights=None) -> dict[str, list]:
    """name -> the chunks every rank stores (ShardSync.stores / ShardedAdamW._stored_names)."""
    plan = Plan(model=spec.name, global_batch=12, micro_batch=2, seq_len=8, pipelines=pipelines)
    rank_map = build_rank_map(plan, spec.num_layers)
    tied = tied_names(spec)
    ops = plan_grad_sync(rank_map, [(n, s, shard_dim(n)) for n, s in param_shapes(spec).items()], 64, tied=tied,
                         sharded_units=frozenset(["embedding", *range(spec.num_layers), "head"]))
    keep = stored_copies(ops)
    out: dict[str, list] = {}
    for op in ops:
        bounds = slice_bounds(op, weights and tuple(weights[r % len(weights)] for r in op.ranks))
        for k in range(len(op.ranks)):
            for piece in owned_pieces(op, bounds[k], bounds[k + 1]):
                seg = op.segments[piece.segment]
                if keep[(seg.name, seg.region)] == op.ranks:
                    for name in (tied if tied and seg.name == tied[0] else (seg.name,)):
                        out.setdefault(name, []).append(piece.region)
    return out


@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("weights", [None, (1.0, 3.0, 2.0)])
@pytest.mark.parametrize("plan", sorted(PLANS))
def test_stored_slices_tile_every_parameter_once(plan, weights, tie):
    spec = dataclasses.replace(PRESETS["tiny-gpt"], tie_embeddings=tie)
    chunks = stored(spec, PLANS[plan], weights)
    shapes = param_shapes(spec)
    assert set(chunks) == set(shapes)
    for name, held in chunks.items():
        assert covers_exactly(held, shapes[name]), (name, held)


def test_a_replicated_tensor_at_one_tp_degree_is_stored_from_one_of_its_reductions():
    spec = PRESETS["tiny-gpt"]
    plan = Plan(model=spec.name, global_batch=10, micro_batch=2, seq_len=8, pipelines=PLANS["tp2_both"])
    ops = plan_grad_sync(build_rank_map(plan, spec.num_layers),
                         [(n, s, shard_dim(n)) for n, s in param_shapes(spec).items()], 64,
                         sharded_units=frozenset(["embedding", *range(spec.num_layers), "head"]))
    norm = next(n for n in param_shapes(spec) if shard_dim(n) is None)
    reducing = [op.ranks for op in ops for s in op.segments if s.name == norm]
    assert len(reducing) == 2                                    # one reduce-scatter per TP position
    assert stored_copies(ops)[(norm, next(s.region for op in ops for s in op.segments if s.name == norm))] == \
        min(reducing)
