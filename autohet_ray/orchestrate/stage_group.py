"""The stage actors of one placed plan: creation in their bundles, rendezvous, lock-step training steps, and
failure reports naming the dead actor's node, pipeline and stage."""
from __future__ import annotations

import ray
from ray.exceptions import RayActorError

from autohet_ray.orchestrate.actor_calls import gather_in_rank_order
from autohet_ray.orchestrate.placement import StageSlot, bundle_strategy
from autohet_ray.orchestrate.stage_actor import StageActor


class StageActorDied(RuntimeError):
    """A stage actor died (its process or its node was lost)."""


class StageGroup:
    def __init__(self, slots: list[StageSlot]):
        self.slots = slots
        remote_cls = ray.remote(num_cpus=0, num_gpus=1, max_restarts=0)(StageActor)
        self.where: dict[int, StageSlot] = {}
        self.actors = []
        for slot in slots:
            for index, rank in enumerate(slot.ranks):
                assert rank == len(self.actors), (rank, len(self.actors))
                self.actors.append(remote_cls.options(scheduling_strategy=bundle_strategy(slot, index),
                                                      name=None).remote(rank))
                self.where[rank] = slot
        self.locations: list[dict] = []

    def describe(self, rank: int) -> str:
        slot = self.where[rank]
        return (f"rank {rank} (pipeline {slot.pipeline} stage {slot.stage}, {slot.device_type} on node "
                f"{slot.node})")

    def gather(self, refs: list, timeout_s: float | None = None) -> list:
        """Results in rank order; StageActorDied naming the first actor that died."""
        return gather_in_rank_order(refs, timeout_s, self._failure)

    def _failure(self, rank: int, exc: Exception) -> Exception | None:
        if isinstance(exc, RayActorError):
            return StageActorDied(f"stage actor {self.describe(rank)} died: {str(exc).splitlines()[0]}")
        return None

    def call(self, method: str, *args, timeout_s: float | None = None, **kwargs) -> list:
        return self.gather([getattr(a, method).remote(*args, **kwargs) for a in self.actors], timeout_s)

    def kill(self) -> None:
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors = []
