"""Pricing sharded optimizer state (runtime/shard_sync.py, sharded_optim.py).

A unit's optimizer state is sharded when any stage holding it asks (Stage.shard_optimizer); its holders are
one TP group per pipeline, so a sharding stage keeps (master + moments) / pipelines per parameter and updates
only that slice (terms.GroupCost.shard_ways). Its gradient bucket is reduce-scattered instead of all-reduced:
the first half of the ring (gloo takes longer: collective_shares), overlapped with the backward as the
all-reduce was; the second half is an all-gather of the new weights in the compute dtype after the update, on
the step's critical path. Uneven slices (Stage.slice_weight, planner/passes/slice_sizes.py): each holder keeps its
own share of each unit's state (`slice_share`), and both collectives take what the largest slice implies.
"""
from __future__ import annotations

from autohet_ray.cost.terms import plan_tables
from autohet_ray.model.costs import layer_params
from autohet_ray.model.spec import ModelSpec, model_from_dict
from autohet_ray.plan.schema import Plan
from autohet_ray.profile.precision import profile_precision


def sharded_units(plan: Plan, model: ModelSpec | None = None) -> frozenset:
    """Units (layer index, "embedding", "head") whose state the runtime shards (runtime/shard_sync.py): those
    held by any stage with `shard_optimizer`, with tied embeddings both or neither; none with one pipeline."""
    if len(plan.pipelines) < 2:
        return frozenset()
    units: set = set()
    for pipeline in plan.pipelines:
        for j, stage in enumerate(pipeline.stages):
            if stage.shard_optimizer:
                units.update(stage_units(stage, j, len(pipeline.stages)))
    if _spec(plan, model).tie_embeddings and units & {"embedding", "head"}:
        units |= {"embedding", "head"}
    return frozenset(units)


def stage_units(stage, j: int, num_stages: int) -> list:
    """The units stage j of a pipeline of `num_stages` holds."""
    return [*range(*stage.layers)] + (["embedding"] if j == 0 else []) + (["head"] if j == num_stages - 1 else [])


def _spec(plan: Plan, model: ModelSpec | None) -> ModelSpec:
    assert model is not None or plan.model_spec, "a plan without model_spec needs its model"
    return model if model is not None else model_from_dict(plan.model_spec)


def shard_ways(plan: Plan, k: int, j: int, model: ModelSpec | None = None) -> float:
    """Holders stage j of pipeline k shards its optimizer state across, on average per parameter (1:
    replicated): the pipelines for the parameters of its sharded units (`sharded_units`), 1 for the rest; a
    stage that does not ask may still hold units another holder shards. Under uneven slices (Stage.slice_weight)
    the inverse of the share of its parameters' state it keeps (`slice_share` per sharded unit). `model`: the
    plan's (default: its model_spec)."""
    flags = [s.shard_optimizer for p in plan.pipelines for s in p.stages]
    if len(plan.pipelines) < 2 or not any(flags):
        return 1
    ways, uneven = len(plan.pipelines), not equal_slices(plan)
    if all(flags) and not uneven:
        return ways
    spec = _spec(plan, model)
    units = sharded_units(plan, spec)
    size = {"layer": layer_params(spec, "layer"), "embedding": layer_params(spec, "embedding"),
            "head": layer_params(spec, "head")}
    held = stage_units(plan.pipelines[k].stages[j], j, len(plan.pipelines[k].stages))
    params = lambda us: sum(size[u if isinstance(u, str) else "layer"] for u in us)  # noqa: E731
    if uneven:
        kept = sum(size[u if isinstance(u, str) else "layer"] * (slice_share(plan, k, j, u) if u in units else 1.0)
                   for u in held)
        return params(held) / kept
    share = params([u for u in held if u in units]) / params(held)
    if share in (0.0, 1.0):
        return ways if share else 1
    return 1 / (1 - share * (1 - 1 / ways))        # resident and updated: (1 - share) + share / ways


def equal_slices(plan: Plan) -> bool:
    return all(s.slice_weight == 1.0 for p in plan.pipelines for s in p.stages)


def holder_weight(pipeline, unit) -> float:
    """The slice_weight of the stage of `pipeline` that holds `unit`."""
    stages = pipeline.stages
    if unit in ("embedding", "head"):
        return stages[0 if unit == "embedding" else -1].slice_weight
    return next(s.slice_weight for s in stages if s.layers[0] <= unit < s.layers[1])


def slice_share(plan: Plan, k: int, j: int, unit) -> float:
    """The share of a sharded unit's master and moments that stage j of pipeline k keeps (of its own TP shard
    of the unit): its slice_weight over the sum of the unit's holders' (one stage per pipeline), as the runtime
    cuts each bucket (runtime/shard_layout.slice_bounds)."""
    return plan.pipelines[k].stages[j].slice_weight / sum(holder_weight(p, unit) for p in plan.pipelines)


def widest_slice_factor(plan: Plan, holders) -> float:
    """A sharded bucket's reduce-scatter and all-gather time over that of equal slices: the runtime pads every
    slice to the largest (runtime/shard_sync.py), so the ring moves members x the largest slice."""
    weights = [plan.pipelines[k].stages[j].slice_weight for k, j in holders]
    return len(weights) * max(weights) / sum(weights)


# (reduce-scatter, all-gather) of a bucket as shares of its all-reduce. A ring (NCCL, GPU ranks) runs each as half
# of the all-reduce. gloo (CPU ranks: the runtime picks it without CUDA, runtime/device.py) runs
# reduce_scatter_tensor as an all-reduce and keeps its chunk (pytorch/pytorch#118911), and its all-gather takes
# about an all-reduce's time: on a 2-core host, 2 ranks, 4 and 28 MB of fp32, all-gather 0.76-1.34 times the
# all-reduce, reduce-scatter alone 1.25-1.8 times, but inside the runtime's steps the sharded buckets' sync waited
# as long as DP2's all-reduce (benchmarks/cost_model_accuracy.py prints the shares each run).
RING_SHARES = (0.5, 0.5)
GLOO_SHARES = (1.0, 1.0)


def collective_shares(profile) -> tuple[float, float]:
    """(reduce-scatter, all-gather) shares of the all-reduce for the backend `profile`'s ranks run on: gloo for
    a profile measured on a CPU, else a ring."""
    on_cpu = profile.kind == "measured" and profile.meta.get("source", "").startswith("measured on cpu")
    return GLOO_SHARES if on_cpu else RING_SHARES


def sharded_buckets(plan: Plan, buckets: dict, profile) -> tuple[dict, dict[tuple[int, int], float]]:
    """(`buckets` with each sharded one's duration that of its reduce-scatter, per stage the seconds of its
    all-gathers after the update, in the compute dtype; collective_shares). A bucket is sharded when any of
    its holder stages shards."""
    flagged = {(k, j) for k, p in enumerate(plan.pipelines) for j, s in enumerate(p.stages) if s.shard_optimizer}
    if not flagged or len(plan.pipelines) < 2:
        return buckets, {}
    precision, uneven = profile_precision(profile), not equal_slices(plan)
    dtype_share = precision.activation_bytes / precision.grad_sync_bytes     # compute dtype over fp32 gradients
    scatter_share, gather_share = collective_shares(profile)
    out, gather = {}, {}
    for key, items in buckets.items():
        out[key] = []
        for holders, seconds, unit in items:
            if any(h in flagged for h in holders):
                wide = widest_slice_factor(plan, holders) if uneven else 1.0
                out[key].append((holders, seconds * scatter_share * wide, unit))
                gather[key] = gather.get(key, 0.0) + seconds * gather_share * dtype_share * wide
            else:
                out[key].append((holders, seconds, unit))
    return out, gather


def saved_bytes(plan: Plan, cluster, model, profile) -> dict[tuple[int, int], float]:
    """Per (pipeline, stage): bytes each of its devices saves by sharding (0.0 where it does not shard)."""
    tables = plan_tables(plan, cluster, model, profile)
    out = {}
    for k, pipeline in enumerate(plan.pipelines):
        for j, stage in enumerate(pipeline.stages):
            ways, p = shard_ways(plan, k, j, model), len(pipeline.stages)
            whole = tables[k].get(stage.device_type, stage.tp, stage.recompute, 1)
            sharded = tables[k].get(stage.device_type, stage.tp, stage.recompute, ways)
            params = whole.stage_params(stage.num_layers, j == 0, j == p - 1)
            out[(k, j)] = params * (whole.resident_bytes_per_param - sharded.resident_bytes_per_param)
    return out
