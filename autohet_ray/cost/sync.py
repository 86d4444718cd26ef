"""Layer-wise gradient synchronization across pipelines whose stage boundaries (and TP degrees) differ.

For every stage, its layers are bucketed by the set of stages (one per pipeline) that also hold them, a run of
layers with the same holders split as the runtime splits it (about SYNC_BUCKET_ELEMENTS per bucket); each
bucket is one all-reduce among those holders. When the holders use the same TP degree, TP rank r only talks to
TP rank r of the others (t parallel all-reduces of 1/t of the bucket); when TP degrees differ the shards do not
line up and the whole layer gradient is exchanged (the runtime's shard-overlap path).
A bucket inside one node is a ring over NVLink/PCIe. A bucket that spans nodes is priced as a topology-aware
(hierarchical, as NCCL's rings and trees behave) all-reduce: reduce to one copy per node over NVLink, a ring
among the nodes over their NICs, broadcast back; a node's NIC is shared by the distinct all-reduces running
on it at once (copies of the same stage of identical pipelines form one). A device's sync time is the sum over
its buckets.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Callable

from autohet_ray.cluster.spec import Cluster
from autohet_ray.profile.precision import profile_precision
from autohet_ray.cost.terms import allreduce_time, inter_link, intra_link
from autohet_ray.model.costs import layer_params
from autohet_ray.model.spec import ModelSpec
from autohet_ray.plan.rankmap import SYNC_BUCKET_ELEMENTS
from autohet_ray.plan.schema import Plan
from autohet_ray.profile.db import ProfileDB


class _HolderSet(tuple):
    """(pipeline, stage) per pipeline: as long as the pipelines (1,000 and more on large clusters) and hashed
    for every holder it lists, so its hash is computed once."""

    def __hash__(self) -> int:
        cached = self.__dict__.get("hash")
        if cached is None:
            cached = self.__dict__["hash"] = tuple.__hash__(self)
        return cached


def _holder_sets(plan: Plan, num_layers: int,
                 layer_elements: Callable[[tuple], float]) -> dict[tuple[int, int], dict[tuple, int]]:
    """(pipeline, stage) -> {(unit kind, holder set, lowest layer): units in that bucket}. The layers of one
    bucket are contiguous (an intersection of stage ranges), closed as the runtime closes them: at the first
    layer boundary past SYNC_BUCKET_ELEMENTS (`layer_elements(holders)`: one layer's elements per rank);
    the lowest layer's gradient is final last."""
    buckets: dict[tuple[int, int], dict[tuple, int]] = defaultdict(lambda: defaultdict(int))
    owner = [[next(j for j, s in enumerate(p.stages) if s.layers[0] <= layer < s.layers[1])
              for layer in range(num_layers)] for p in plan.pipelines]
    current: dict[tuple, tuple[int, float]] = {}         # holders -> (lowest layer, elements) of the open bucket
    interned: dict[_HolderSet, _HolderSet] = {}         # one object per distinct holder set
    for layer in range(num_layers):
        holders = _HolderSet((k, owner[k][layer]) for k in range(len(plan.pipelines)))
        holders = interned.setdefault(holders, holders)
        lowest, filled = current.get(holders, (layer, 0.0))
        if filled >= SYNC_BUCKET_ELEMENTS:
            lowest, filled = layer, 0.0
        current[holders] = (lowest, filled + layer_elements(holders))
        for k, j in holders:
            buckets[(k, j)][("layer", holders, lowest)] += 1
    firsts = _HolderSet((k, 0) for k in range(len(plan.pipelines)))
    lasts = _HolderSet((k, len(p.stages) - 1) for k, p in enumerate(plan.pipelines))
    for k, j in firsts:
        buckets[(k, j)][("embedding", firsts, None)] += 1
    for k, j in lasts:
        buckets[(k, j)][("head", lasts, None)] += 1
    return buckets


Unit = tuple[str, int | None]        # ("layer", lowest layer of the bucket), ("embedding", None), ("head", None)
Bucket = tuple[tuple[tuple[int, int], ...], float, Unit]      # (holder stages, all-reduce seconds, last unit)


def sync_buckets(plan: Plan, cluster: Cluster, model: ModelSpec, profile: ProfileDB) -> dict[tuple[int, int],
                                                                                              list[Bucket]]:
    """Per stage (pipeline, stage): its all-reduce buckets with the stages they wait for and their duration."""
    stages = {(k, j): s for k, p in enumerate(plan.pipelines) for j, s in enumerate(p.stages)}
    if len(plan.pipelines) == 1:
        return {key: [] for key in stages}
    per_layer = layer_params(model, "layer")

    def layer_elements(holders) -> float:          # per rank, as the runtime counts a bucket
        tps = {stages[h].tp for h in holders}
        return per_layer / tps.pop() if len(tps) == 1 else per_layer
    buckets = _holder_sets(plan, model.num_layers, layer_elements)
    lanes = _nic_lanes(buckets, stages)
    params = {kind: layer_params(model, kind) for kind in ("layer", "embedding", "head")}
    out: dict[tuple[int, int], list[Bucket]] = {}
    priced: dict[tuple, float] = {}          # a bucket's time is the same for all its holders: priced once
    for key, bucket in buckets.items():
        items = []
        for unit, count in bucket.items():
            if (unit, count) not in priced:
                priced[(unit, count)] = _bucket_seconds(unit, count, stages, params, lanes, cluster, profile)
            kind, holders, lowest = unit
            items.append((holders, priced[(unit, count)], (kind, lowest)))
        out[key] = items
    return out


def _bucket_seconds(unit: tuple, count: int, stages, params, lanes, cluster, profile) -> float:
    """One all-reduce of `count` units among the unit's holders (the same for each of them)."""
    kind, holders, _ = unit
    members = [stages[h] for h in holders]
    whole = count * params[kind] * profile_precision(profile).grad_sync_bytes
    tps = {s.tp for s in members}
    shard = whole / (tps.pop() if len(tps) == 1 else 1)
    if len({s.node for s in members}) == 1:
        return allreduce_time(shard, len(members), intra_link(profile, cluster, members[0].device_type))
    return _hierarchical(whole, shard, members, lanes, cluster, profile)


def _nic_lanes(buckets, stages) -> dict[str, int]:
    """Distinct cross-node all-reduce streams per node: stages on a node whose cross-node buckets have the same
    holder sets (the same stage of identical pipelines) are one stream."""
    streams: dict[str, set] = defaultdict(set)
    spans: dict[tuple, bool] = {}            # holder set -> whether it spans nodes (shared by its holders)
    for key, bucket in buckets.items():
        crossing = []
        for unit in bucket:
            holders = unit[1]
            if holders not in spans:
                spans[holders] = len({stages[s].node for s in holders}) > 1
            if spans[holders]:
                crossing.append(unit)
        if crossing:
            streams[stages[key].node].add(frozenset(crossing))
    return {node: len(s) for node, s in streams.items()}


def _hierarchical(whole: float, shard: float, members, lanes, cluster, profile) -> float:
    """Reduce to one copy per node (NVLink), ring over the nodes' NICs, broadcast back."""
    by_node: dict[str, list] = defaultdict(list)
    for s in members:
        by_node[s.node].append(s)
    nodes = sorted(by_node)
    seconds = 0.0
    # each node reduces over its own NVLink/PCIe at once: the slowest of them sets the pace (whatever the order)
    links = [intra_link(profile, cluster, v[0].device_type) for v in by_node.values() if len(v) > 1]
    if links:
        seconds += max(2 * (shard / link.bandwidth_Bps + link.latency_s) for link in links)
    return seconds + allreduce_time(whole, len(nodes), _slowest_pair_link(nodes, lanes, cluster, profile))


def _slowest_pair_link(nodes: list[str], lanes, cluster, profile):
    """The slowest link between any two of the nodes. A pair's link depends only on the two nodes' NIC
    speeds and stream counts, so one representative per distinct (NIC, streams) class is enough."""
    classes: dict[tuple[float, int], list[str]] = defaultdict(list)
    for n in nodes:
        classes[(cluster.nic_bytes_per_s(n), lanes[n])].append(n)
    reps = list(classes.values())
    pairs = [(x[0], y[0]) for i, x in enumerate(reps) for y in reps[i + 1:]] + \
        [(x[0], x[1]) for x in reps if len(x) > 1]
    return min((inter_link(profile, cluster, a, b, share=max(lanes[a], lanes[b])) for a, b in pairs),
               key=lambda x: x.bandwidth_Bps)


def gradient_sync_times(plan: Plan, cluster: Cluster, model: ModelSpec, profile: ProfileDB,
                        buckets: dict[tuple[int, int], list[Bucket]] | None = None) -> dict[str, float]:
    """Seconds each device ("node:gpu") spends in cross-pipeline gradient all-reduces per iteration
    (`buckets`: this plan's `sync_buckets`, when already computed)."""
    times: dict[str, float] = {}
    buckets = sync_buckets(plan, cluster, model, profile) if buckets is None else buckets
    for (k, j), items in buckets.items():
        if not items:
            continue
        stage = plan.pipelines[k].stages[j]
        for d in stage.devices:
            times[f"{stage.node}:{d}"] = sum(item[1] for item in items)
    return times


def sync_end_times(buckets: dict[tuple[int, int], list[Bucket]],
                   ready: Callable[[tuple[int, int], Unit], float]) -> dict[tuple[int, int], float]:
    """When each stage's gradients are synchronized. `ready(stage, unit)` is when that stage's last backward
    has made the unit's gradient final. A bucket starts once it is final in every holder (the runtime posts
    all-reduces from gradient hooks during the last backward, so sync overlaps the rest of that backward and
    the cool-down of earlier stages), and a stage runs its buckets one after another."""
    ends, starts = {}, {}               # a bucket's start is shared by all its holders: computed once
    for key, items in buckets.items():
        t = 0.0
        for holders, duration, unit in items:
            if (holders, unit) not in starts:
                starts[(holders, unit)] = max(ready(h, unit) for h in holders)
        for start, duration in sorted((starts[(holders, unit)], d) for holders, d, unit in items):
            t = max(t, start) + duration
        ends[key] = max(t, ready(key, ("stage", None)))
    return ends
