"""The stage actors of one placed plan: creation in their bundles, rendezvous, lock-step training steps, and
failure reports naming the dead actor's node, pipeline and stage."""
from __future__ import annotations

import ray
from ray.exceptions import GetTimeoutError, RayActorError

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
        index = {ref: i for i, ref in enumerate(refs)}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=timeout_s)
            if not ready:
                raise GetTimeoutError(f"stage actors {sorted(index[r] for r in pending)} did not answer in "
                                      f"{timeout_s} s")
            try:
                ray.get(ready[0])
            except RayActorError as exc:
                rank = index[ready[0]]
                raise StageActorDied(f"stage actor {self.describe(rank)} died: "
                                     f"{str(exc).splitlines()[0]}") from None
        return ray.get(refs)

    def call(self, method: str, *args, timeout_s: float | None = None, **kwargs) -> list:
        return self.gather([getattr(a, method).remote(*args, **kwargs) for a in self.actors], timeout_s)

    def kill(self) -> None:
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors = []
