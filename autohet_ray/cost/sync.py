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


Bucket = tuple[tuple[tuple[int, int], ...], float]      # (holder stages, all-reduce seconds)


def sync_buckets(plan: Plan, cluster: Cluster, model: ModelSpec, profile: ProfileDB) -> dict[tuple[int, int],
                                                                                              list[Bucket]]:
    """Per stage (pipeline, stage): its all-reduce buckets with the stages they wait for and their duration."""
    stages = {(k, j): s for k, p in enumerate(plan.pipelines) for j, s in enumerate(p.stages)}
    if len(plan.pipelines) == 1:
        return {key: [] for key in stages}
    buckets = _holder_sets(plan, model.num_layers)
    cross_gpus: dict[str, int] = defaultdict(int)
    for (k, j), bucket in buckets.items():
        if any(len({stages[h].node for h in holders}) > 1 for _, holders in bucket):
            cross_gpus[stages[(k, j)].node] += stages[(k, j)].tp
    params = {kind: layer_params(model, kind) for kind in ("layer", "embedding", "head")}
    out: dict[tuple[int, int], list[Bucket]] = {}
    for (k, j), bucket in buckets.items():
        stage, items = stages[(k, j)], []
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
            items.append((holders, allreduce_time(num_bytes, len(members), link)))
        out[(k, j)] = items
    return out


def gradient_sync_times(plan: Plan, cluster: Cluster, model: ModelSpec, profile: ProfileDB) -> dict[str, float]:
    """Seconds each device ("node:gpu") spends in cross-pipeline gradient all-reduces per iteration."""
    times: dict[str, float] = {}
    for (k, j), items in sync_buckets(plan, cluster, model, profile).items():
        if not items:
            continue
        stage = plan.pipelines[k].stages[j]
        for d in stage.devices:
            times[f"{stage.node}:{d}"] = sum(duration for _, duration in items)
    return times


def sync_end_times(buckets: dict[tuple[int, int], list[Bucket]],
                   backward_done: dict[tuple[int, int], float]) -> dict[tuple[int, int], float]:
    """When each stage's gradients are synchronized: a bucket starts once every holder has finished its last
    backward (the runtime launches all-reduces from gradient hooks, so later stages' sync overlaps the
    earlier stages' cool-down), and a stage runs its buckets one after another."""
    ends = {}
    for key, items in buckets.items():
        t = backward_done[key]
        for start, duration in sorted((max(backward_done[h] for h in holders), d) for holders, d in items):
            t = max(t, start) + duration
        ends[key] = t
    return ends
