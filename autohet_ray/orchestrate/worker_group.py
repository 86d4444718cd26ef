"""The workers of one plan: one actor per plan rank pinned to the node its stage names (hard node affinity, one
fake/real GPU each), a rendezvous through rank 0 (loopback when every rank is on one host; gloo, or NCCL on
real GPUs), lock-step calls, and failures reported with the dead rank's node, pipeline and stage."""
from __future__ import annotations

import functools
import os
import re
import time

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from autohet_ray import ConfigError
from autohet_ray.elastic.liveness import NodeWatch, raylet_addresses, settled_ok
from autohet_ray.orchestrate.actor_calls import gather_in_rank_order
from autohet_ray.orchestrate.worker import Worker
from autohet_ray.plan.schema import Plan
from autohet_ray.runtime.device import standby_gpu_indices

ABORT_WAIT_S = 2.0
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _first_line(exc: BaseException) -> str:
    """A one-line reason: the original exception of a Ray task error (its type and first line)."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        exc = cause
    text = _ANSI.sub("", str(exc)).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


class GroupFailure(RuntimeError):
    """A call on the group failed: an actor died or a rank raised (e.g. a gloo peer vanished)."""

    def __init__(self, message: str, *, rank: int, dead: bool):
        super().__init__(message)
        self.rank, self.dead = rank, dead


def rank_slots(plan: Plan) -> list[dict]:
    """Plan rank -> {pipeline, stage, node, device_type}, in plan rank order."""
    slots = []
    for k, pipeline in enumerate(plan.pipelines):
        for j, stage in enumerate(pipeline.stages):
            slots += [{"pipeline": k, "stage": j, "node": stage.node, "device_type": stage.device_type}
                      for _ in range(stage.tp)]
    return slots


class WorkerGroup:
    def __init__(self, plan: Plan, node_ids: dict[str, str], *, reuse: dict[str, list] | None = None,
                 loss_grace_s: float, gpus: float = 1.0, real_gpu_nodes: frozenset[str] = frozenset()):
        """`loss_grace_s`: how long a node's raylet may stay silent before the node counts as lost (see
        NodeWatch). `reuse`: node name -> idle actors (reset) already on that node; they take ranks there first (no
        process start). The ones left over stay in `reuse` for the caller to kill. `gpus`: what each new actor
        requests (0 for a standby group built beside the running one, orchestrate/switch_ahead.py); then
        each new actor on a `real_gpu_nodes` node (not emulated) is pinned to a GPU of its own there (see Worker)."""
        self.plan, self.slots = plan, rank_slots(plan)
        names = sorted({s["node"] for s in self.slots})
        addresses = raylet_addresses(node_ids[name] for name in names)
        self.raylets = {name: addresses[node_ids[name]] for name in names}
        self.node_watch = NodeWatch(self.raylets, loss_grace_s, node_ids={name: node_ids[name] for name in names})
        reuse = reuse if reuse is not None else {}
        self.actors, self.num_reused = [], 0
        pinned = standby_gpu_indices(self.slots, reuse, real_gpu_nodes) if gpus == 0 else {}
        for rank, slot in enumerate(self.slots):
            if reuse.get(slot["node"]):
                self.actors.append(reuse[slot["node"]].pop())
                self.num_reused += 1
                continue
            self.actors.append(worker_actor(node_ids[slot["node"]], rank, gpus, gpu_index=pinned.get(rank)))

    def describe(self, rank: int) -> str:
        s = self.slots[rank]
        return f"rank {rank} (pipeline {s['pipeline']} stage {s['stage']}, {s['device_type']} on node {s['node']})"

    def gather(self, refs: list, timeout_s: float | None = None) -> list:
        """Results in order; GroupFailure naming the first rank whose call failed, or the ranks of a node whose
        raylet stopped accepting connections (noticed within a fraction of a second, while the calls wait)."""
        return gather_in_rank_order(refs, timeout_s, self._failure, watch=self._watch_nodes)

    def _watch_nodes(self) -> None:
        """GroupFailure once a plan node is lost on conclusive evidence (NodeWatch: a refusal, Ray's word, or
        silence past the grace); a shorter blip passes."""
        lost = self.node_watch.check()
        if lost is not None:
            name, verdict = lost
            rank = next(r for r, s in enumerate(self.slots) if s["node"] == name)
            raise GroupFailure(f"node {name!r} is lost ({self.node_watch.explain(name, verdict)}): "
                               f"{self.describe(rank)} is lost", rank=rank, dead=True)

    def _failure(self, rank: int, exc: Exception) -> Exception | None:
        if isinstance(exc, RayActorError):
            return GroupFailure(f"worker {self.describe(rank)} died: {_first_line(exc)}", rank=rank, dead=True)
        if isinstance(exc, RayError):              # a task error, or one Ray could not even deserialize
            return GroupFailure(f"worker {self.describe(rank)} failed: {_first_line(exc)}",
                                rank=rank, dead=False)
        return None

    def call(self, method: str, *args, timeout_s: float | None = None, **kwargs) -> list:
        return self.gather([getattr(a, method).remote(*args, **kwargs) for a in self.actors], timeout_s)

    def setup(self, *, model_spec: dict, seed: int, dtype: str, collective_timeout_s: float, lr: float | None = None,
              optimizer: dict | None = None, timeout_s: float = 120.0, pacers: list[dict | None] | None = None) -> dict:
        """Rendezvous through a store rank 0 hosts before the others join, and build every Engine
        (concurrently: init blocks until all ranks join). Returns the seconds, and the slowest rank's parts."""
        start, submitted = time.perf_counter(), time.time()
        single = len({a[0] for a in self.raylets.values() if a is not None}) <= 1
        plan, world_size = self.plan.to_dict(), len(self.actors)
        try:
            addr, port = self.gather([self.actors[0].host_store.remote(world_size, collective_timeout_s, single)],
                                     timeout_s)[0]
            ranks = self.gather([actor.setup.remote(
                master_addr=addr, master_port=port, world_size=world_size, plan=plan, model_spec=model_spec, seed=seed,
                lr=lr, optimizer=optimizer, dtype=dtype, rank=rank, collective_timeout_s=collective_timeout_s,
                socket_ifname="lo" if single else os.environ.get("GLOO_SOCKET_IFNAME"),
                pacer=pacers[rank] if pacers else None) for rank, actor in enumerate(self.actors)], timeout_s)
        except GetTimeoutError:
            dead, silent = self.ping(timeout_s=2.0)        # started workers answer (they wait for the others)
            named = "; ".join(self.describe(r) for r in sorted(dead + silent))
            raise ConfigError(f"workers did not start within {timeout_s:g} s: {named}. Ray could not place them: "
                              f"are those GPUs taken by another job, or the nodes gone?") from None
        return {"setup_s": time.perf_counter() - start,       # slowest rank: queued before setup ran, the
                "queued_s_max": max(r["started_at"] for r in ranks) - submitted,   # rendezvous, the Engine
                "join_s_max": max(r["join_s"] for r in ranks), "engine_s_max": max(r["engine_s"] for r in ranks),
                "groups_s_max": max(r["groups_s"] for r in ranks),      # of engine_s: its process groups
                "groups_created": sum(r["groups_created"] for r in ranks)}   # rank memberships created

    def ping(self, timeout_s: float = 1.0) -> tuple[list[int], list[int]]:
        """(dead, silent): ranks whose actor Ray reports dead when pinged, and ranks that did not answer within
        the timeout (the actors are threaded, so a live one answers even while it computes)."""
        refs = [a.where.remote() for a in self.actors]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        dead, silent = [], []
        for rank, ref in enumerate(refs):
            if ref not in ready:
                silent.append(rank)
                continue
            try:
                ray.get(ref)
            except RayActorError:
                dead.append(rank)
        return dead, silent

    def salvage(self, inflight: list, skip: set[int], timeout_s: float = 10.0, before_reset=None) -> dict[str, list]:
        """Reset the actors worth keeping (not in `skip`, their in-flight call settled within the timeout) for
        the next plan: node name -> actors. Every other actor is killed. The group is empty afterwards.
        `before_reset(rank -> actor)` runs on those actors while their engines still hold their state."""
        # only the survivors' calls are awaited: a lost rank's call settles when Ray's health checks give up
        start = time.perf_counter()
        waiting = [ref for r, ref in enumerate(inflight) if r not in skip]
        # wake survivors blocked in collectives with lost or failed ranks (threaded actors)
        aborts = [a.abort_collectives.remote() for r, a in enumerate(self.actors) if r not in skip] if waiting else []
        settled = set(ray.wait(waiting, num_returns=len(waiting), timeout=timeout_s)[0]) if waiting else set()
        if aborts:      # done before any reset, so a late abort can never reach the next plan's group
            ray.wait(aborts, num_returns=len(aborts), timeout=ABORT_WAIT_S)
        candidates = {r: a for r, a in enumerate(self.actors)
                      if r not in skip and (not inflight or inflight[r] in settled)}
        if before_reset is not None and candidates:
            before_reset(candidates)
        settled_at = time.perf_counter()
        resets = {r: a.reset.remote() for r, a in candidates.items()}
        done = set(ray.wait(list(resets.values()), num_returns=len(resets), timeout=timeout_s)[0]) if resets else set()
        self.salvage_phases = {"settle_s": settled_at - start, "reset_s": time.perf_counter() - settled_at}
        keep: dict[str, list] = {}
        for rank, actor in enumerate(self.actors):
            if rank in resets and resets[rank] in done and settled_ok(resets[rank]):
                keep.setdefault(self.slots[rank]["node"], []).append(actor)
            else:
                ray.kill(actor, no_restart=True)
        self.actors = []
        return keep

    def kill(self, wait_s: float = 0.0) -> None:
        """Kill every worker; with `wait_s`, wait (that long at most) until they are gone, so that nothing they
        run (a snapshot's background writes) outlives the call."""
        kill_actors(self.actors, wait_s)
        self.actors = []


@functools.cache
def _worker_class():
    return ray.remote(num_cpus=0, num_gpus=1, max_restarts=0, max_concurrency=3,
                      concurrency_groups={"control": 2})(Worker)


def worker_actor(node_id: str, rank: int, gpus: float = 1.0, gpu_index: int | None = None):
    """A new worker process on that node (`gpus`: one GPU), as `rank` until a setup gives it another
    (`gpu_index`: see Worker)."""
    pinned = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
    return _worker_class().options(scheduling_strategy=pinned, num_gpus=gpus).remote(rank, gpu_index)


def kill_actors(actors: list, wait_s: float = 0.0) -> None:
    for actor in actors:
        ray.kill(actor, no_restart=True)
    if wait_s and actors:
        pings = [a.where.remote() for a in actors]        # fail once each actor is dead
        ray.wait(pings, num_returns=len(pings), timeout=wait_s)


def rescue_orphans(alive: dict, nodes: list[str], step: int, orphans: list, errors: list[str],
                   timeout_s: float = 30.0) -> dict[str, set[str]]:
    """Chunks of committed `step` whose every stored copy was on lost nodes, written again by the survivors
    (rank -> actor; `nodes`: each rank's node) that hold them live (data-parallel and TP copies) into their
    nodes' stores: key -> the nodes now holding it."""
    if not orphans:
        return {}
    wanted = [{"key": r.key, "name": r.name, "offsets": list(r.chunk.offsets), "sizes": list(r.chunk.sizes),
               "digest": r.digest} for r in orphans]
    refs = {rank: actor.write_live_chunks.remote(step, wanted) for rank, actor in alive.items()}
    ready = set(ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)[0])
    held: dict[str, set[str]] = {}
    for rank, ref in refs.items():
        try:
            keys = ray.get(ref) if ref in ready else []
        except RayError as err:  # one fewer source; the restore names any chunk still missing
            errors.append(f"rank {rank}: {str(err).splitlines()[-1]}")
            continue
        for key in keys:
            held.setdefault(key, set()).add(nodes[rank])
    return held
