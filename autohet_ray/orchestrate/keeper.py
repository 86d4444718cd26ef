"""The node keeper: a named, detached, node-pinned Ray actor that owns the checkpoint bytes of its node.

In Ray an object dies with its owner, so shards must not live in objects owned by training workers. The
keeper holds the blobs in its own memory (a MemoryTier, optionally spilling to a local directory), so it
outlives worker deaths; it receives peer replicas from other keepers and serves chunks to any rank. It
dies with its node (that is what the peer copy and the cloud tier are for) or when killed explicitly.

`KeeperTier` adapts a keeper handle to the checkpoint Tier interface, turning a dead or unreachable keeper
into TierUnavailableError so a restore falls through to the next tier (and reports it).
"""
from __future__ import annotations

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from autohet_ray import ConfigError
from autohet_ray.checkpoint.errors import ChunkMissingError, ManifestExistsError, TierUnavailableError
from autohet_ray.checkpoint.tiers.memory import MemoryTier

KEEPER_NAMESPACE = "autohet-keepers"
_DEAD = (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError)   # died, unreachable, too slow


def keeper_name(node_id: str) -> str:
    return f"keeper-{node_id}"


@ray.remote(num_cpus=0, max_restarts=0, max_concurrency=16)
class NodeKeeper:
    """Threaded actor (MemoryTier is thread-safe): serves reads while pushing replicas to peers."""

    def __init__(self, label: str, max_bytes: int | None = None, spill_dir: str | None = None):
        self._tier = MemoryTier(label, max_bytes=max_bytes, spill_dir=spill_dir)
        self._node_id = ray.get_runtime_context().get_node_id()

    def node_id(self) -> str:
        return self._node_id

    def put_chunk(self, key: str, blob: bytes) -> None:
        self._tier.put_chunk(key, bytes(blob))      # a private copy: never a view of the caller's object

    def put_many(self, items: list[tuple[str, bytes]]) -> None:
        for key, blob in items:
            self._tier.put_chunk(key, bytes(blob))

    def get_chunk(self, key: str) -> bytes | None:
        return self._tier.get_chunk(key) if self._tier.has(key) else None

    def has(self, key: str) -> bool:
        return self._tier.has(key)

    def list(self, prefix: str = "") -> list[str]:
        return self._tier.list(prefix)

    def delete(self, key: str) -> None:
        self._tier.delete(key)

    def put_manifest(self, step: int, body: bytes) -> str | None:
        """None when committed (or already committed with the same body), else the conflict message."""
        try:
            self._tier.put_manifest(step, bytes(body))
        except ManifestExistsError as err:      # returned as data, raised again by KeeperTier
            return str(err)
        return None

    def get_manifest(self, step: int) -> bytes | None:
        return self._tier.get_manifest(step) if step in self._tier.list_manifests() else None

    def list_manifests(self) -> list[int]:
        return self._tier.list_manifests()

    def delete_manifest(self, step: int) -> None:
        self._tier.delete_manifest(step)

    def replicate(self, keys: list[str], peer_actor_name: str, namespace: str = KEEPER_NAMESPACE) -> int:
        """Push these chunks to the keeper named `peer_actor_name`; returns the bytes sent. This actor
        owns the arguments of the push while it runs, so a dying worker cannot take them along."""
        peer = ray.get_actor(peer_actor_name, namespace=namespace)
        items = [(key, self._tier.get_chunk(key)) for key in keys]
        ray.get(peer.put_many.remote(items))
        return sum(len(blob) for _, blob in items)

    def usage(self) -> dict[str, int]:
        return self._tier.usage()


def start_keeper(node_id: str, *, label: str | None = None, max_bytes: int | None = None,
                 spill_dir: str | None = None, namespace: str = KEEPER_NAMESPACE):
    """Start (or find) the keeper pinned to `node_id`: detached, named, zero CPUs, hard node affinity."""
    if not node_id:
        raise ConfigError("start_keeper needs a Ray node id (ray.nodes()[i]['NodeID'])")
    return NodeKeeper.options(
        name=keeper_name(node_id), namespace=namespace, lifetime="detached", get_if_exists=True,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
    ).remote(label or f"keeper-{node_id[:8]}", max_bytes, spill_dir)


def get_keeper(node_id: str, namespace: str = KEEPER_NAMESPACE):
    return ray.get_actor(keeper_name(node_id), namespace=namespace)


def stop_keeper(node_id: str, namespace: str = KEEPER_NAMESPACE) -> bool:
    """Kill a detached keeper explicitly (they outlive drivers). False if there was none alive."""
    try:
        ray.kill(get_keeper(node_id, namespace))
    except ValueError:
        return False
    return True


class KeeperTier:
    """The checkpoint Tier interface over a keeper actor; `name` should be the keeper's label."""

    def __init__(self, handle, name: str, *, timeout_s: float = 30.0):
        self.handle, self.name, self.timeout_s = handle, name, timeout_s

    def _call(self, method: str, *args):
        try:
            return ray.get(getattr(self.handle, method).remote(*args), timeout=self.timeout_s)
        except _DEAD as err:
            raise TierUnavailableError(self.name, f"{method}: {type(err).__name__}") from err

    def put_chunk(self, key: str, blob: bytes) -> None:
        self._call("put_chunk", key, blob)

    def get_chunk(self, key: str) -> bytes:
        blob = self._call("get_chunk", key)
        if blob is None:
            raise ChunkMissingError(key, self.name)
        return blob

    def has(self, key: str) -> bool:
        return self._call("has", key)

    def list(self, prefix: str = "") -> list[str]:
        return self._call("list", prefix)

    def delete(self, key: str) -> None:
        self._call("delete", key)

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
