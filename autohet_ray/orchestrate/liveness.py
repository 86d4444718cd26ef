"""Fast node-loss confirmation: is a node's raylet still accepting connections?

Ray's GCS declares a node dead only after its health checks fail (seconds: period x threshold). When a step
has already failed and a node's stage actors stop answering, a TCP connect to that node's raylet port settles
the question at once: a live raylet accepts within milliseconds; a killed one refuses, and a vanished host
does not answer within the timeout. Used only to confirm a loss that the failed step and silent actors
already suggest.
"""
from __future__ import annotations

import socket

import ray

RAYLET_PROBE_TIMEOUT_S = 0.5


def raylet_addresses(node_ids) -> dict[str, tuple[str, int] | None]:
    """Node id -> (host, node manager port) while Ray lists the node as alive, else None (one `ray.nodes()`)."""
    alive = {raw["NodeID"]: (raw["NodeManagerAddress"], int(raw["NodeManagerPort"]))
             for raw in ray.nodes() if raw["Alive"]}
    return {node_id: alive.get(node_id) for node_id in node_ids}


def refused_raylets(raw_nodes: list[dict]) -> set[str]:
    """Ids of the nodes (entries of `ray.nodes()`) Ray lists as alive whose raylet refuses connections."""
    return {raw["NodeID"] for raw in raw_nodes if raw.get("Alive") and raw.get("NodeManagerPort")
            and probe((raw["NodeManagerAddress"], int(raw["NodeManagerPort"]))) == "refused"}


def probe(address: tuple[str, int], timeout_s: float = RAYLET_PROBE_TIMEOUT_S) -> str:
    """"ok", "refused" (the host answers but nothing listens: the raylet died) or "silent" (no answer in
    time: the host is gone, or the network hiccuped)."""
    try:
        with socket.create_connection(address, timeout=timeout_s):
            return "ok"
    except ConnectionRefusedError:
        return "refused"
    except OSError:
        return "silent"


def keeper_alive(node_id: str) -> bool | None:
    """True when the node's keeper answers (the node lives), False when it died, None when unsure."""
    from autohet_ray.orchestrate.keeper import get_keeper
    try:
        ref = get_keeper(node_id).node_id.remote()
        ray.get(ref, timeout=1.0)
        return True
    except ValueError:
        return False
    except ray.exceptions.RayActorError:
        return False
    except ray.exceptions.GetTimeoutError:
        return None
