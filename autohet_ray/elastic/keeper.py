"""The node keeper: a named, detached, node-pinned Ray actor that serves its node's checkpoint store.

The node tier is a directory in the node's shared memory (`/dev/shm` by default; tmpfs: RAM speed, survives
any process, gone with the node), one per node: `<root>/<node id>`. Stage actors on the node write their
chunks into it directly (one file write per chunk, no Ray object, no copy through another process) and read
from it directly on restore. The keeper owns and serves the directory to everyone else: other nodes' reads,
peer replicas pushed from other keepers, and the manifests the driver commits. It dies with its node (that
is what the peer copy and the cloud tier are for) or when stopped, which removes the directory.

In Ray an object dies with its owner; bytes here live in files, and what crosses an actor boundary is a
uint8 numpy view (moved out of band through the object store, zero-copy for the receiver).

`KeeperTier` adapts a keeper handle to the checkpoint Tier interface, turning a dead or unreachable keeper
into TierUnavailableError so a restore falls through to the next tier (and reports it).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
from pathlib import Path

import numpy as np
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from autohet_ray import ConfigError
from autohet_ray.checkpoint.errors import ChunkMissingError, ManifestExistsError, TierUnavailableError
from autohet_ray.checkpoint.tiers.localdir import LocalDirTier

KEEPER_NAMESPACE = "autohet-keepers"
_DEAD = (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError)   # died, unreachable, too slow
STORE_ENV = "AUTOHET_NODE_STORE"


def default_store_root() -> str:
    """Where node stores live: $AUTOHET_NODE_STORE (as the node's processes see it), else shared memory when the
    machine has it, else the temp directory. Containers often mount a small /dev/shm (Docker: 64 MB): give
    them a bigger one or point the variable at a tmpfs or fast local disk."""
    if os.environ.get(STORE_ENV):
        return os.environ[STORE_ENV]
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
    return os.path.join(base, "autohet-node-store")


def node_store_dir(job_id: str, node_id: str, root: str | None = None) -> str:
    """A job's store on a node: `<root>/<job id>/<node id>` (jobs on one cluster never share a store)."""
    return os.path.join(root or default_store_root(), job_id, node_id)


def keeper_name(job_id: str, node_id: str) -> str:
    return f"keeper-{job_id}-{node_id}"


@ray.remote(num_cpus=0, max_restarts=0, max_concurrency=16)
class NodeKeeper:
    """Threaded actor serving the node's store directory (a LocalDirTier without fsync: it is RAM)."""

    def __init__(self, job_id: str, label: str, root: str | None = None):
        self._node_id, self._job_id = ray.get_runtime_context().get_node_id(), job_id
        self._dir = node_store_dir(job_id, self._node_id, root)
        self._tier = LocalDirTier(self._dir, name=label, fsync=False)
        self._writes = threading.Condition()       # close() waits for writes in progress, then refuses new ones
        self._active_writes, self._closed = 0, False

    def node_id(self) -> str:
        return self._node_id

    def directory(self) -> str:
        return self._dir

    def put_many(self, items: list[tuple[str, np.ndarray | bytes]]) -> int:
        """Store the chunks; returns the bytes taken. Refused once the store is closed (a peer's late push must
        not bring a removed store back)."""
        with self._writes:
            if self._closed:
                raise RuntimeError(f"the node store {self._dir} of job {self._job_id} is closed")
            self._active_writes += 1
        try:
            for key, blob in items:
                self._tier.put_chunk(key, blob)
        finally:
            with self._writes:
                self._active_writes -= 1
                self._writes.notify_all()
        return sum(len(blob) for _, blob in items)

    def get_refs(self, keys: list[str]) -> dict[str, list]:
        """key -> [object reference to the chunk's bytes] for the keys held (absent ones left out); wrapped in
        a list so the caller receives the reference and pulls the bytes when it wants them."""
        out = {}
        for key in keys:
            try:
                out[key] = [ray.put(_wire(self._tier.get_chunk(key)))]
            except ChunkMissingError:
                continue
        return out

    def get_chunk(self, key: str) -> np.ndarray | None:
        try:
            return _wire(self._tier.get_chunk(key))
        except ChunkMissingError:
            return None

    def has(self, key: str) -> bool:
        return self._tier.has(key)

    def list(self, prefix: str = "") -> list[str]:
        return self._tier.list(prefix)

    def delete(self, key: str) -> None:
        self._tier.delete(key)

    def delete_many(self, keys: list[str]) -> None:
        self._tier.delete_many(keys)

    def put_manifest(self, step: int, body: bytes) -> str | None:
        """None when committed (or already committed with the same body), else the conflict message."""
        try:
            self._tier.put_manifest(step, bytes(body))
        except ManifestExistsError as err:      # returned as data, raised again by KeeperTier
            return str(err)
        return None

    def get_manifest(self, step: int) -> bytes | None:
        try:
            return self._tier.get_manifest(step)
        except ChunkMissingError:
            return None

    def list_manifests(self) -> list[int]:
        return self._tier.list_manifests()

    def delete_manifest(self, step: int) -> None:
        self._tier.delete_manifest(step)

    def upload(self, keys: list[str], spec: dict) -> int:
        """Copy these chunks (as stored, so their hashes hold) to the durable tier of `spec`; returns bytes."""
        from autohet_ray.elastic.tiers import build_tier
        tier = build_tier(spec)
        blobs = [(key, bytes(self._tier.get_chunk(key))) for key in keys]   # boto3 takes no memoryview
        for key, blob in blobs:
            tier.put_chunk(key, blob)
        return sum(len(blob) for _, blob in blobs)

    def replicate(self, keys: list[str], peer_actor_name: str, namespace: str = KEEPER_NAMESPACE) -> int:
        """Push these chunks to the keeper named `peer_actor_name`; returns the bytes sent."""
        peer = ray.get_actor(peer_actor_name, namespace=namespace)
        return ray.get(peer.put_many.remote([(key, _wire(self._tier.get_chunk(key))) for key in keys]))

    def usage(self) -> dict[str, int]:
        keys = self._tier.list()
        return {"resident_chunks": len(keys),
                "resident_bytes": sum(Path(self._dir, key).stat().st_size for key in keys)}

    def close(self) -> None:
        """Remove the node store once the writes in progress are done (the keeper is stopped right after)."""
        with self._writes:
            self._closed = True
            self._writes.wait_for(lambda: self._active_writes == 0, timeout=5.0)
        shutil.rmtree(self._dir, ignore_errors=True)
        with contextlib.suppress(OSError):               # the job's folder, once its last node store is gone
            os.rmdir(os.path.dirname(self._dir))


def _wire(blob) -> np.ndarray:
    """A zero-copy uint8 view: what crosses an actor boundary (see the module docstring)."""
    return np.frombuffer(blob, dtype=np.uint8)


def start_keeper(job_id: str, node_id: str, *, label: str | None = None, root: str | None = None,
                 namespace: str = KEEPER_NAMESPACE):
    """Start (or find) the job's keeper pinned to `node_id`: detached, named, zero CPUs, hard node affinity."""
    if not node_id or not job_id:
        raise ConfigError(f"start_keeper needs a job id and a Ray node id, got {job_id!r} and {node_id!r}")
    return NodeKeeper.options(
        name=keeper_name(job_id, node_id), namespace=namespace, lifetime="detached", get_if_exists=True,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
    ).remote(job_id, label or f"keeper-{node_id[:8]}", root)


def keeper_spec(job_id: str, node_id: str, node_name: str) -> dict:
    """Start the job's keeper on the node; its tier spec (the store directory lets that node's ranks bypass
    the actor)."""
    keeper = start_keeper(job_id, node_id, label=f"keeper-{node_name}")
    return {"kind": "keeper", "name": f"keeper-{node_name}", "node_id": node_id, "job_id": job_id,
            "dir": ray.get(keeper.directory.remote(), timeout=60)}


def get_keeper(job_id: str, node_id: str, namespace: str = KEEPER_NAMESPACE):
    return ray.get_actor(keeper_name(job_id, node_id), namespace=namespace)


def stop_keeper(job_id: str, node_id: str, namespace: str = KEEPER_NAMESPACE) -> bool:
    """Remove the keeper's node store and kill it (keepers are detached: they outlive drivers). False if
    there was none alive."""
    try:
        keeper = get_keeper(job_id, node_id, namespace)
    except ValueError:
        return False
    try:
        ray.get(keeper.close.remote(), timeout=10)
    except _DEAD:
        pass                                   # dead or stuck: killing it is all that is left
    ray.kill(keeper)
    return True


def sweep_node_stores(node_ids, root: str | None = None) -> None:
    """Remove every job's stores of nodes that died without their keeper's close (emulated nodes share a
    host)."""
    base = Path(root or default_store_root())
    for node_id in node_ids:
        for store in base.glob(f"*/{node_id}"):
            shutil.rmtree(store, ignore_errors=True)


class KeeperTier:
    """The checkpoint Tier interface over a keeper actor; `name` should be the keeper's label."""

    def __init__(self, handle, name: str, *, timeout_s: float = 30.0):
        self.handle, self.name, self.timeout_s = handle, name, timeout_s
        self._known: dict[str, list | None] | None = None     # prefetched: key -> [ref] or None (absent)

    def prefetch(self, keys: list[str]) -> None:
        """Look up all `keys` in one call and start pulling the held ones to this node in the background;
        get_chunk then answers from this lookup (absent keys without another call)."""
        self._known = None
        refs = self._call("get_refs", keys)
        self._known = {key: refs.get(key) for key in keys}
        held = [wrapped[0] for wrapped in refs.values()]
        if held:
            ray.wait(held, num_returns=len(held), timeout=0, fetch_local=True)

    def _call(self, method: str, *args):
        try:
            return ray.get(getattr(self.handle, method).remote(*args), timeout=self.timeout_s)
        except _DEAD as err:
            raise TierUnavailableError(self.name, f"{method}: {type(err).__name__}") from err

    def put_chunk(self, key: str, blob: bytes) -> None:
        self._call("put_many", [(key, _wire(blob))])

    def put_chunks(self, items: list[tuple[str, bytes]]) -> None:
        """Many chunks in one call (a snapshot's chunks of one rank)."""
        self._call("put_many", [(key, _wire(blob)) for key, blob in items])

    def get_chunk(self, key: str) -> np.ndarray:
        """A read-only uint8 view of the chunk (bytes-like: verify and decode take it as is); pulled through
        the reference a prefetch looked up, else asked for in one call."""
        known = self._known if self._known is not None and key in self._known else None
        if known is None:
            blob = self._call("get_chunk", key)
        elif known[key] is None:
            blob = None
        else:
            try:
                blob = ray.get(known[key][0], timeout=self.timeout_s)
            except (*_DEAD, ray.exceptions.ObjectLostError) as err:
                raise TierUnavailableError(self.name, f"get_chunk: {type(err).__name__}") from err
        if blob is None:
            raise ChunkMissingError(key, self.name)
        return blob

    def has(self, key: str) -> bool:
        return self._call("has", key)

    def list(self, prefix: str = "") -> list[str]:
        return self._call("list", prefix)

    def delete(self, key: str) -> None:
        self._call("delete", key)

    def delete_many(self, keys: list[str]) -> None:
        """One call for all of them (a collected step's chunks)."""
        self._call("delete_many", keys)

    def put_manifest(self, step: int, body: bytes) -> None:
        conflict = self._call("put_manifest", step, body)
        if conflict is not None:
            raise ManifestExistsError(step, self.name)

    def get_manifest(self, step: int) -> bytes:
        body = self._call("get_manifest", step)
        if body is None:
            raise ChunkMissingError(f"manifest of step {step}", self.name)
        return body

    def list_manifests(self) -> list[int]:
        return self._call("list_manifests")

    def delete_manifest(self, step: int) -> None:
        self._call("delete_manifest", step)
