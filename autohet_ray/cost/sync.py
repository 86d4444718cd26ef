"""Layer-wise gradient synchronization across pipelines whose stage boundaries (and TP degrees) differ.

For every stage, its layers are bucketed by the set of stages (one per pipeline) that also hold them; each
bucket is one all-reduce among those holders, priced by the slowest link it crosses. When the holders use the
same TP degree, TP rank r only talks to TP rank r of the others (t parallel all-reduces of 1/t of the bucket);
when TP degrees differ the shards do not line up and the whole layer gradient is exchanged (the runtime's
shard-overlap path). Cross-node buckets share each node's NIC among that node's GPUs that sync across nodes.
A device's sync time is the sum over its buckets; sync ends when the slowest device is done.
"""
from __future__ import annotations

from collections import defaultdict

from autohet_ray.cluster.spec import Cluster
from autohet_ray.cost.terms import GRAD_SYNC_BYTES, allreduce_time, inter_link, intra_link
from autohet_ray.model.costs import layer_params
from autohet_ray.model.spec import ModelSpec
from autohet_ray.plan.schema import Plan
from autohet_ray.profile.db import ProfileDB


def _holder_sets(plan: Plan, num_layers: int) -> dict[tuple[int, int], dict[tuple, float]]:
    """(pipeline, stage) -> {holder set: parameters (full, unsharded) in that bucket}."""
    buckets: dict[tuple[int, int], dict[tuple, float]] = defaultdict(lambda: defaultdict(float))
    owner = [[next(j for j, s in enumerate(p.stages) if s.layers[0] <= layer < s.layers[1])
              for layer in range(num_layers)] for p in plan.pipelines]
    for layer in range(num_layers):
        holders = tuple((k, owner[k][layer]) for k in range(len(plan.pipelines)))
        for k, j in holders:
            buckets[(k, j)][("layer", holders)] += 1
    firsts = tuple((k, 0) for k in range(len(plan.pipelines)))
    lasts = tuple((k, len(p.stages) - 1) for k, p in enumerate(plan.pipelines))
    for k, j in firsts:
        buckets[(k, j)][("embedding", firsts)] += 1
    for k, j in lasts:
        buckets[(k, j)][("head", lasts)] += 1
    return buckets


def gradient_sync_times(plan: Plan, cluster: Cluster, model: ModelSpec, profile: ProfileDB) -> dict[str, float]:
    """Seconds each device ("node:gpu") spends in cross-pipeline gradient all-reduces per iteration."""
    if len(plan.pipelines) == 1:
        return {}
    stages = {(k, j): s for k, p in enumerate(plan.pipelines) for j, s in enumerate(p.stages)}
    buckets = _holder_sets(plan, model.num_layers)
    cross_gpus: dict[str, int] = defaultdict(int)
    for (k, j), bucket in buckets.items():
        if any(len({stages[h].node for h in holders}) > 1 for _, holders in bucket):
            cross_gpus[stages[(k, j)].node] += stages[(k, j)].tp
    params = {kind: layer_params(model, kind) for kind in ("layer", "embedding", "head")}
    times: dict[str, float] = {}
    for (k, j), bucket in buckets.items():
        stage, total = stages[(k, j)], 0.0
        for (kind, holders), count in bucket.items():
            members = [stages[h] for h in holders]
            degrees = {s.tp for s in members}
            num_bytes = count * params[kind] * GRAD_SYNC_BYTES / (stage.tp if len(degrees) == 1 else 1)
            nodes = {s.node for s in members}
            if len(nodes) == 1:
                link = intra_link(profile, cluster, stage.device_type)
            else:
                link = min((inter_link(profile, cluster, a, b, share=max(cross_gpus[a], cross_gpus[b]))
                            for a in nodes for b in nodes if a < b), key=lambda x: x.bandwidth_Bps)
            total += allreduce_time(num_bytes, len(members), link)
        for d in stage.devices:
            times[f"{stage.node}:{d}"] = total
    return times
