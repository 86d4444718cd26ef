"""Process groups of a plan: each stage's TP group and each gradient-sync bucket's group, created by their
members only, and kept for a later plan of the same world whose group has the same members.

Only a group's members create it, each in the plan's one global order (all_group_ranks), so a rank's
creation waits only for its own groups' members and the global order leaves no cycle of waits. Every rank
creating every group of the world (the old way, torch.distributed.new_group's contract) costs each rank
one rendezvous per group in the world: the number of groups times the world size in all.

`new_group(..., use_local_synchronization=True)` cannot do it: it names a group by its ranks *and the number
of groups the calling process already has*, so two members that hold different groups before (rank 0 in
{0, 1} and {0, 2}, rank 2 only in {0, 2}) give it different names, wait on different store keys and hang
(the gloo hang this module noted before; reproduced on torch 2.13). Here a group is named by its members
alone, unique within a world because a group of the same members is never created twice in one: it is kept.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from autohet_ray.plan.rankmap import RankMap
from autohet_ray.runtime.grad_sync import SyncOp

_kept: dict[tuple[int, ...], object] = {}     # global ranks -> group, of this process's current world
_kept_world: list = [None]                    # the default group those groups belong to


@dataclass(frozen=True)
class GroupsBuilt:
    """What building a plan's groups cost this rank: groups it created, groups kept from an earlier plan of the
    same world, and the seconds it spent creating."""
    created: int
    kept: int
    seconds: float


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


def changed_groups(old: list[tuple[int, ...]], new: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """The groups of `new` (global ranks) a re-plan must create: those whose membership no group of `old` has."""
    held = set(old)
    return [ranks for ranks in new if ranks not in held]


def create_groups(rank_map: RankMap, ops: tuple[SyncOp, ...], *, me: int,
                  to_global: Callable[[int], int]) -> tuple[dict[tuple[int, ...], object], GroupsBuilt]:
    """The groups `me` belongs to (plan ranks -> group), created by their members only; a group of this
    world with the same global members is kept instead (a later plan's, or another engine's in this world)."""
    _forget_other_worlds()
    mine, created, start = {}, 0, time.perf_counter()
    for ranks in all_group_ranks(rank_map, ops):
        if me not in ranks:
            continue
        members = tuple(sorted(to_global(r) for r in ranks))
        if members not in _kept:
            _kept[members] = _member_group(members)
            created += 1
        mine[ranks] = _kept[members]
    return mine, GroupsBuilt(created=created, kept=len(mine) - created, seconds=time.perf_counter() - start)


def held_groups() -> list[tuple[int, ...]]:
    """The groups (global ranks) this process holds in its current world."""
    _forget_other_worlds()
    return list(_kept)


def _forget_other_worlds() -> None:
    """Drop the groups of a world that was destroyed or replaced (a new init_process_group)."""
    world = c10d._get_default_group() if dist.is_initialized() else None
    if world is not _kept_world[0] or any(group not in c10d._world.pg_map for group in _kept.values()):
        _kept.clear()
        _kept_world[0] = world


def _member_group(members: tuple[int, ...]):
    """A group created by its members only (sorted global ranks; this process is one), named by them."""
    world = c10d._get_default_group()
    backend, store = c10d._world.pg_map[world]
    assert world.bound_device_id is None, "a bound default group splits subgroups: every rank would have to join"
    group, _ = c10d._new_process_group_helper(
        len(members), members.index(dist.get_rank()), list(members), backend, store,
        c10d.GroupName("autohet-" + "_".join(map(str, members))), timeout=c10d._get_default_timeout(backend))
    c10d._world.pg_group_ranks[group] = {rank: i for i, rank in enumerate(members)}
    return group
