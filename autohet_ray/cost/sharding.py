"""Pricing sharded optimizer state (runtime/shard_sync.py, sharded_optim.py).

A unit's optimizer state is sharded when any stage holding it asks (Stage.shard_optimizer); its holders are
one TP group per pipeline, so a sharding stage keeps (master + moments) / pipelines per parameter and updates
only that slice (terms.GroupCost.shard_ways). Its gradient bucket is reduce-scattered instead of all-reduced:
the first half of the ring, overlapped with the backward as the all-reduce was; the second half is an
all-gather of the new weights in the compute dtype after the update, on the step's critical path.
"""
from __future__ import annotations

from autohet_ray.cost.terms import plan_tables
from autohet_ray.plan.schema import Plan
from autohet_ray.profile.precision import Precision


def shard_ways(plan: Plan, k: int, j: int) -> int:
    """Holders stage j of pipeline k shards its optimizer state across (1: replicated)."""
    flagged = plan.pipelines[k].stages[j].shard_optimizer
    return len(plan.pipelines) if flagged and len(plan.pipelines) > 1 else 1


def sharded_buckets(plan: Plan, buckets: dict, precision: Precision) -> tuple[dict, dict[tuple[int, int], float]]:
    """(`buckets` with each sharded one's duration that of its reduce-scatter, per stage the seconds of its
    all-gathers after the update). A bucket is sharded when any of its holder stages shards."""
    flagged = {(k, j) for k, p in enumerate(plan.pipelines) for j, s in enumerate(p.stages) if s.shard_optimizer}
    if not flagged or len(plan.pipelines) < 2:
        return buckets, {}
    gather_share = precision.activation_bytes / precision.grad_sync_bytes     # compute dtype over fp32 gradients
    out, gather = {}, {}
    for key, items in buckets.items():
        out[key] = []
        for holders, seconds, unit in items:
            if any(h in flagged for h in holders):
                out[key].append((holders, seconds / 2, unit))
                gather[key] = gather.get(key, 0.0) + seconds / 2 * gather_share
            else:
                out[key].append((holders, seconds, unit))
    return out, gather


def saved_bytes(plan: Plan, cluster, model, profile) -> dict[tuple[int, int], float]:
    """Per (pipeline, stage): bytes each of its devices saves by sharding (0.0 where it does not shard)."""
    tables = plan_tables(plan, cluster, model, profile)
    out = {}
    for k, pipeline in enumerate(plan.pipelines):
        for j, stage in enumerate(pipeline.stages):
            ways, p = shard_ways(plan, k, j), len(pipeline.stages)
            whole = tables[k].get(stage.device_type, stage.tp, stage.recompute, 1)
            sharded = tables[k].get(stage.device_type, stage.tp, stage.recompute, ways)
            params = whole.stage_params(stage.num_layers, j == 0, j == p - 1)
            out[(k, j)] = params * (whole.resident_bytes_per_param - sharded.resident_bytes_per_param)
    return out
