"""Rank map: the global rank of every device of a plan and the groups the runtime needs.

Ranks are numbered pipeline by pipeline, stage by stage, TP rank by TP rank.
"""
from __future__ import annotations

from dataclasses import dataclass

from autohet_ray.plan.schema import Plan

SYNC_BUCKET_ELEMENTS = 1 << 24
"""Gradient elements per all-reduce bucket, at least (a bucket closes at the first unit boundary past it),
so that a run of units with the same holders is not one all-reduce posted only once its first unit is final
(at the very end of the backward) but several, the later units' posted while earlier ones still compute.
The runtime buckets this way and the cost model prices it the same way. 2^24 = 32 MiB of bf16 gradients."""


@dataclass(frozen=True, kw_only=True)
class RankInfo:
    rank: int
    pipeline: int
    stage: int
    tp_rank: int
    node: str
    device: int
    device_type: str


@dataclass(frozen=True, kw_only=True)
class LayerHolder:
    pipeline: int
    stage: int
    ranks: tuple[int, ...]           # the TP group holding the layer in that pipeline


@dataclass(frozen=True, kw_only=True)
class RankMap:
    ranks: tuple[RankInfo, ...]
    stage_ranks: tuple[tuple[tuple[int, ...], ...], ...]     # [pipeline][stage] -> TP group ranks
    layer_holders: tuple[tuple[LayerHolder, ...], ...]       # [layer] -> one holder per pipeline

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    def tp_group(self, rank: int) -> tuple[int, ...]:
        info = self.ranks[rank]
        return self.stage_ranks[info.pipeline][info.stage]

    def prev_stage(self, rank: int) -> tuple[int, ...] | None:
        info = self.ranks[rank]
        return self.stage_ranks[info.pipeline][info.stage - 1] if info.stage > 0 else None

    def next_stage(self, rank: int) -> tuple[int, ...] | None:
        info = self.ranks[rank]
        stages = self.stage_ranks[info.pipeline]
        return stages[info.stage + 1] if info.stage + 1 < len(stages) else None

    def embedding_holders(self) -> tuple[tuple[int, ...], ...]:
        return tuple(stages[0] for stages in self.stage_ranks)

    def head_holders(self) -> tuple[tuple[int, ...], ...]:
        return tuple(stages[-1] for stages in self.stage_ranks)

    def sync_groups(self, layer: int) -> tuple[tuple[int, ...], ...] | None:
        """Per TP shard, the ranks holding that shard of `layer` in every pipeline; None when the pipelines
        hold the layer at different TP degrees (then sync goes by shard overlap)."""
        holders = self.layer_holders[layer]
        degrees = {len(h.ranks) for h in holders}
        if len(degrees) != 1:
            return None
        return tuple(tuple(h.ranks[r] for h in holders) for r in range(degrees.pop()))


def build_rank_map(plan: Plan, num_layers: int) -> RankMap:
    ranks: list[RankInfo] = []
    stage_ranks = []
    for k, pipeline in enumerate(plan.pipelines):
        per_stage = []
        for j, stage in enumerate(pipeline.stages):
            group = []
            for r, device in enumerate(stage.devices):
                group.append(len(ranks))
                ranks.append(RankInfo(rank=len(ranks), pipeline=k, stage=j, tp_rank=r, node=stage.node,
                                      device=device, device_type=stage.device_type))
            per_stage.append(tuple(group))
        stage_ranks.append(tuple(per_stage))
    holders = []
    for layer in range(num_layers):
        row = []
        for k, pipeline in enumerate(plan.pipelines):
            j = next(j for j, s in enumerate(pipeline.stages) if s.layers[0] <= layer < s.layers[1])
            row.append(LayerHolder(pipeline=k, stage=j, ranks=stage_ranks[k][j]))
        holders.append(tuple(row))
    return RankMap(ranks=tuple(ranks), stage_ranks=tuple(stage_ranks), layer_holders=tuple(holders))
