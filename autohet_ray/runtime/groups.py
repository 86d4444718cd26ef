"""Process groups of a plan: each stage's TP group and each gradient-sync bucket's group.

torch.distributed requires every rank to create every group, in the same order; the order here depends only
on the plan, so all ranks agree.
"""
from __future__ import annotations

from typing import Callable

import torch.distributed as dist

from autohet_ray.plan.rankmap import RankMap
from autohet_ray.runtime.grad_sync import SyncOp


def all_group_ranks(rank_map: RankMap, ops: tuple[SyncOp, ...]) -> list[tuple[int, ...]]:
    """Every group of more than one rank, TP groups first, without repeats (plan ranks)."""
    seen: dict[tuple[int, ...], None] = {}
    for stages in rank_map.stage_ranks:
        for ranks in stages:
            if len(ranks) > 1:
                seen.setdefault(tuple(ranks), None)
    for op in ops:
        seen.setdefault(op.ranks, None)
    return list(seen)


def create_groups(rank_map: RankMap, ops: tuple[SyncOp, ...], *, me: int,
                  to_global: Callable[[int], int]) -> dict[tuple[int, ...], object]:
    """Create all groups (collective over the default group: every rank calls this); returns the ones `me`
    belongs to. (new_group(use_local_synchronization=True) would let a plan run on a strict subgroup, but
    with gloo in torch 2.13 it hung creating a second group that shares a rank with the first.)"""
    mine = {}
    for ranks in all_group_ranks(rank_map, ops):
        group = dist.new_group([to_global(r) for r in ranks])
        if me in ranks:
            mine[ranks] = group
    return mine
