"""The node keeper: a named, detached, node-pinned Ray actor that serves its node's checkpoint store.

The node tier is a directory in the node's shared memory (`/dev/shm` by default; tmpfs: RAM speed, survives
any process, gone with the node), one per node: `<root>/<node id>`. Stage actors on the node write their
chunks into it directly (one file write per chunk, no Ray object, no copy through another process) and read
from it directly on restore. The keeper owns and serves the directory to everyone else: other nodes' reads,
peer replicas pushed from other keepers, and the manifests the driver commits. It dies with its node (that
is what the peer copy and the storage are for) or when stopped, which removes the directory.

In Ray an object dies with its owner; bytes here live in files, and what crosses an actor boundary is a
uint8 numpy view (moved out of band through the object store, zero-copy for the receiver).
"""
from __future__ import annotations

import contextlib
import logging

import numpy as np
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from autohet_ray import ConfigError
from autohet_ray.checkpoint.copy_check import refusal
from autohet_ray.checkpoint.errors import ChunkMissingError, ManifestExistsError
from autohet_ray.checkpoint.node_store import NodeStore
from autohet_ray.elastic.keeper_tier import (DEAD, KEEPER_NAMESPACE, KeeperTier, get_keeper,  # noqa: F401 (re-exported)
                                             keeper_name, wire)
from autohet_ray.elastic.tiers import build_tier

log = logging.getLogger(__name__)

REPLICATE_TIMEOUT_S = 300.0     # a peer keeper that takes no chunks for this long is stuck


@ray.remote(num_cpus=0, max_restarts=0, max_concurrency=16)
class NodeKeeper(NodeStore):
    """Threaded actor serving the node's store (stopped right after its close()); has/list/delete/delete_many/
    list_manifests/delete_manifest as the directory answers them, the rest in a form that crosses Ray."""

    def __init__(self, job_id: str, label: str):
        self._node_id = ray.get_runtime_context().get_node_id()
        super().__init__(job_id, self._node_id, label)

    def node_id(self) -> str:
        return self._node_id

    def directory(self) -> str:
        return self._dir

    def get_refs(self, keys: list[str]) -> dict[str, list]:
        """key -> [object reference to the chunk's bytes] for the keys held (absent ones left out); wrapped in
        a list so the caller receives the reference and pulls the bytes when it wants them."""
        out = {}
        for key in keys:
            try:
                out[key] = [ray.put(wire(self._stored(key)))]
            except ChunkMissingError:
                continue
        return out

    def get_chunk(self, key: str) -> np.ndarray | None:
        try:
            return wire(self._stored(key))
        except ChunkMissingError:
            return None

    def put_manifest(self, step: int, body: bytes) -> str | None:
        """None when committed (or already committed with the same body), else the conflict message."""
        try:
            super().put_manifest(step, bytes(body))
        except ManifestExistsError as err:      # returned as data, raised again by KeeperTier
            return str(err)
        return None

    def get_manifest(self, step: int) -> bytes | None:
        try:
            return super().get_manifest(step)
        except ChunkMissingError:
            return None

    def upload(self, digests: dict[str, str], spec: dict) -> dict:
        """Copy these chunks (key -> the manifest's hash) to the storage of `spec`, each only when its
        bytes hash to the manifest's (NodeStore.upload_checked: {"bytes", "copied", "refused"})."""
        return self.upload_checked(digests, build_tier(spec))

    def replicate(self, digests: dict[str, str], peer_actor_name: str) -> dict:
        """Push these chunks (key -> the manifest's hash) to the keeper named `peer_actor_name`, which keeps
        those whose bytes hash to it: {"bytes": taken, "refused": [...]} (a missing chunk is refused here)."""
        peer = ray.get_actor(peer_actor_name, namespace=KEEPER_NAMESPACE)
        items, refused = [], []
        for key in digests:
            try:
                items.append((key, wire(self._stored(key))))
            except ChunkMissingError:
                refused.append(refusal(key, self.name, peer_actor_name, "missing in the source store"))
        out = ray.get(peer.put_checked.remote(items, digests, self.name), timeout=REPLICATE_TIMEOUT_S)
        return {"bytes": out["bytes"], "refused": refused + out["refused"]}


def start_keeper(job_id: str, node_id: str, *, label: str):
    """Start (or find) the job's keeper pinned to `node_id`: detached, named, zero CPUs, hard node affinity."""
    if not node_id or not job_id:
        raise ConfigError(f"start_keeper needs a job id and a Ray node id, got {job_id!r} and {node_id!r}")
    return NodeKeeper.options(
        name=keeper_name(job_id, node_id), namespace=KEEPER_NAMESPACE, lifetime="detached", get_if_exists=True,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
    ).remote(job_id, label)


def keeper_spec(job_id: str, node_id: str, node_name: str) -> dict:
    """Start the job's keeper on the node; its tier spec (the store directory lets that node's ranks bypass
    the actor)."""
    return keeper_specs(job_id, {node_name: node_id})[node_name]


def keeper_specs(job_id: str, node_ids: dict[str, str]) -> dict[str, dict]:
    """Start the job's keepers on these nodes ({node name: Ray node id}) all at once, then wait for each;
    their tier specs by node name. (Started one by one, each waits for its own process start.)"""
    directories = {name: start_keeper(job_id, node_id, label=f"keeper-{name}").directory.remote()
                   for name, node_id in node_ids.items()}
    return {name: {"kind": "keeper", "name": f"keeper-{name}", "node_id": node_ids[name], "job_id": job_id,
                   "dir": ray.get(directory, timeout=60)} for name, directory in directories.items()}


def stop_keeper(job_id: str, node_id: str) -> bool:
    """Remove the keeper's node store and kill it (keepers are detached: they outlive drivers). False if
    there was none alive."""
    try:
        keeper = get_keeper(job_id, node_id)
    except ValueError:
        return False
    with contextlib.suppress(*DEAD):          # dead or stuck: killing it is all that is left
        ray.get(keeper.close.remote(), timeout=10)
    ray.kill(keeper)
    return True


def stop_dropped_keeper(spec: dict) -> bool:
    """Stop the keeper of a node the job dropped (recovery/dropped.py), and say so."""
    stopped = stop_keeper(spec["job_id"], spec["node_id"])
    if stopped:
        log.warning(f"autohet: stopped the keeper of dropped node {spec['name'].removeprefix('keeper-')} and removed "
                    f"its store {spec['dir']} (its chunks are committed elsewhere)")
    return stopped
