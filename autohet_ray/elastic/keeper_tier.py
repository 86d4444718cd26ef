"""Reaching a node keeper (elastic/keeper.py) from any process: its actor name and lookup, the uint8 view that
crosses an actor boundary, and KeeperTier, the checkpoint Tier interface over a keeper actor. The keeper
itself (the actor, starting and stopping it) lives in keeper.py, above elastic/tiers.py, which builds this."""
from __future__ import annotations

import functools

import numpy as np
import ray

from autohet_ray.checkpoint.errors import ChunkMissingError, ManifestExistsError, TierUnavailableError

KEEPER_NAMESPACE = "autohet-keepers"
DEAD = (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError)   # died, unreachable, too slow


def keeper_name(job_id: str, node_id: str) -> str:
    return f"keeper-{job_id}-{node_id}"


def get_keeper(job_id: str, node_id: str):
    return ray.get_actor(keeper_name(job_id, node_id), namespace=KEEPER_NAMESPACE)


def wire(blob) -> np.ndarray:
    """A zero-copy uint8 view: what crosses an actor boundary (see elastic/keeper.py's docstring)."""
    return np.frombuffer(blob, dtype=np.uint8)


class KeeperTier:
    """The checkpoint Tier interface over a keeper actor (`name`: the keeper's label), turning a dead or
    unreachable keeper into TierUnavailableError so a restore falls through to the next tier (and reports it)."""

    def __init__(self, handle, name: str, *, timeout_s: float = 30.0):
        self.handle, self.name, self.timeout_s = handle, name, timeout_s
        self._known: dict[str, list | None] | None = None     # prefetched: key -> [ref] or None (absent)

    def prefetch(self, keys: list[str]) -> set[str]:
        """Look up all `keys` in one call and start pulling the held ones to this node in the background;
        get_chunk then answers from this lookup (absent keys without another call). Returns the held keys."""
        self._known = None
        refs = self._call("get_refs", keys)
        self._known = {key: refs.get(key) for key in keys}
        held = [wrapped[0] for wrapped in refs.values()]
        if held:
            ray.wait(held, num_returns=len(held), timeout=0, fetch_local=True)
        return set(refs)

    def _call(self, method: str, *args):
        try:
            return ray.get(getattr(self.handle, method).remote(*args), timeout=self.timeout_s)
        except DEAD as err:
            raise TierUnavailableError(self.name, f"{method}: {type(err).__name__}") from err

    def put_chunk(self, key: str, blob: bytes) -> None:
        self._call("put_many", [(key, wire(blob))])

    def put_chunks(self, items: list[tuple[str, bytes]]) -> None:
        """Many chunks in one call (a snapshot's chunks of one rank)."""
        self._call("put_many", [(key, wire(blob)) for key, blob in items])

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
            except (*DEAD, ray.exceptions.ObjectLostError) as err:
                raise TierUnavailableError(self.name, f"get_chunk: {type(err).__name__}") from err
        if blob is None:
            raise ChunkMissingError(key, self.name)
        return blob

    def put_manifest(self, step: int, body: bytes) -> None:
        conflict = self._call("put_manifest", step, body)
        if conflict is not None:
            raise ManifestExistsError(step, self.name)

    def get_manifest(self, step: int) -> bytes:
        body = self._call("get_manifest", step)
        if body is None:
            raise ChunkMissingError(f"manifest of step {step}", self.name)
        return body

    def __getattr__(self, method: str):
        """The rest of the Tier interface (delete_many, list_manifests: one call each) as the keeper serves it."""
        if method not in _SERVED_AS_IS:
            raise AttributeError(method)
        return functools.partial(self._call, method)


_SERVED_AS_IS = frozenset({"has", "list", "delete", "delete_many", "list_manifests", "delete_manifest"})
