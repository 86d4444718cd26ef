"""Placement groups from a plan: one group per stage (its TP group STRICT_PACKed on the stage's node), one
bundle per GPU, each bundle pinned by label selectors to the node and GPU type the plan names. Waiting has a
timeout and a clear error instead of hanging (a STRICT_PACK group that cannot fit waits forever)."""
from __future__ import annotations

from dataclasses import dataclass

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from autohet_ray.orchestrate.discovery import Discovered
from autohet_ray.orchestrate.labels import ACCELERATOR_LABEL, NODE_ID_LABEL, label_value
from autohet_ray.plan.schema import Plan


class PlacementError(RuntimeError):
    """Placement groups could not be scheduled in time."""


@dataclass(frozen=True, kw_only=True)
class StageSlot:
    pipeline: int
    stage: int
    node: str
    device_type: str
    group: PlacementGroup
    ranks: tuple[int, ...]          # plan ranks, one per bundle in order


def stage_bundles(tp: int, device_type: str, node_id: str) -> tuple[list[dict], list[dict]]:
    """Bundles and their label selectors for one stage's TP group."""
    selector = {ACCELERATOR_LABEL: label_value(device_type), NODE_ID_LABEL: node_id}
    return [{"GPU": 1} for _ in range(tp)], [dict(selector) for _ in range(tp)]


def _describe(slot: StageSlot) -> str:
    return (f"pipeline {slot.pipeline} stage {slot.stage} ({len(slot.ranks)}x {slot.device_type} "
            f"STRICT_PACK on node {slot.node})")


def place_plan(plan: Plan, found: Discovered, *, timeout_s: float, name: str = "autohet") -> list[StageSlot]:
    """Create and wait for every stage's placement group; PlacementError (groups removed) on timeout."""
    ids = found.node_ids
    slots, rank = [], 0
    for k, pipeline in enumerate(plan.pipelines):
        for j, stage in enumerate(pipeline.stages):
            bundles, selectors = stage_bundles(stage.tp, stage.device_type, ids[stage.node])
            group = placement_group(bundles, strategy="STRICT_PACK", name=f"{name}-p{k}s{j}",
                                    bundle_label_selector=selectors)
            slots.append(StageSlot(pipeline=k, stage=j, node=stage.node, device_type=stage.device_type,
                                   group=group, ranks=tuple(range(rank, rank + stage.tp))))
            rank += stage.tp
    pending = {s.group.ready(): s for s in slots}
    ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=timeout_s)
    missing = [pending[r] for r in pending if r not in ready]
    if missing:
        remove_groups(slots)
        raise PlacementError(
            f"placement timed out after {timeout_s:.0f} s: {len(missing)} of {len(slots)} stage groups could not be "
            f"scheduled, first {_describe(missing[0])}; the node lacks free GPUs of that type (another job may "
            f"hold them) - free them, or re-plan for the GPUs that are free")
    return slots


def bundle_strategy(slot: StageSlot, index: int) -> PlacementGroupSchedulingStrategy:
    return PlacementGroupSchedulingStrategy(placement_group=slot.group, placement_group_bundle_index=index)


def remove_groups(slots: list[StageSlot]) -> None:
    for slot in slots:
        remove_placement_group(slot.group)
