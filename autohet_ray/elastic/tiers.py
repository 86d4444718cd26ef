"""Building a tier spec (checkpoint/tier_specs.py) in the process that uses it; keeper kinds through Ray."""
from __future__ import annotations

import ray

from autohet_ray.checkpoint.chunk_hash import digest  # not codec: a keeper process imports no torch
from autohet_ray.checkpoint.copy_check import report_refused
from autohet_ray.checkpoint.errors import CorruptChunkError, TierUnavailableError
from autohet_ray.checkpoint.tier_specs import GoneTier, direct_tier, wrap_tier
from autohet_ray.elastic.keeper_tier import KeeperTier, get_keeper, keeper_name


def build_tier(spec: dict, *, keeper_timeout_s: float = 30.0):
    """The Tier object of a spec (inside whichever process will use it)."""
    kind = spec.get("kind")
    own = spec.get("dir") and ray.is_initialized() and ray.get_runtime_context().get_node_id() == spec["node_id"]
    if kind == "keeper" and not own:               # off the store's node: through its keeper actor
        try:
            tier = KeeperTier(get_keeper(spec["job_id"], spec["node_id"]), spec["name"], timeout_s=keeper_timeout_s)
        except ValueError:                         # the keeper (or its node) is gone: unavailable, not fatal
            tier = GoneTier(spec["name"])
    elif kind == "keeper_push":
        tier = KeeperPushTier(get_keeper(spec["job_id"], spec["via_node_id"]),
                              keeper_name(spec["job_id"], spec["node_id"]), spec["name"],
                              timeout_s=keeper_timeout_s)
    else:
        tier = direct_tier(spec)
    return wrap_tier(tier, spec)


class KeeperPushTier:
    """Replicas made keeper to keeper: `put_chunk` asks the local keeper (which took the chunk just before,
    as the snapshotter writes the node tier first) to push it to the peer keeper; the blob argument is not
    sent again, only its hash, which the peer checks the bytes it receives against. Reads are not served here
    (restores read the peer keeper itself)."""

    def __init__(self, via, peer_actor_name: str, name: str, *, timeout_s: float = 30.0):
        self.via, self.peer_actor_name, self.name, self.timeout_s = via, peer_actor_name, name, timeout_s

    def put_chunk(self, key: str, blob: bytes) -> None:
        self.put_chunks([(key, blob)])

    def put_chunks(self, items: list[tuple[str, bytes]]) -> None:
        """One keeper-to-keeper push for all of them."""
        digests = {key: digest(blob) for key, blob in items}      # the bytes this rank wrote to its own store
        try:
            out = ray.get(self.via.replicate.remote(digests, self.peer_actor_name), timeout=self.timeout_s)
        except (ray.exceptions.RayError, ValueError) as err:
            raise TierUnavailableError(self.name, f"push via local keeper: {type(err).__name__}") from err
        if out["refused"]:                            # the replica does not count: this lane fails
            report_refused(out["refused"])
            first = out["refused"][0]
            raise CorruptChunkError(first["key"], first["step"] or 0, self.name, first["reason"])
        assert out["bytes"] == sum(len(blob) for _, blob in items), (list(digests), out)
