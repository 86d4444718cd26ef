"""Node-loss detection on Ray: the raylet probes of cluster/node_probe.py, Ray's own view of its nodes, and
which node or worker a failed group call lost."""
from __future__ import annotations

import time

import ray

from autohet_ray.cluster import node_probe
from autohet_ray.cluster.node_probe import LOST_VERDICTS, RAYLET_PROBE_TIMEOUT_S, probe_all
from autohet_ray.elastic.keeper_tier import get_keeper
from autohet_ray.recovery.decisions import named_failure


def raylet_addresses(node_ids) -> dict[str, tuple[str, int] | None]:
    """Node id -> (host, node manager port) while Ray lists the node as alive, else None (one `ray.nodes()`)."""
    alive = _alive_addresses(ray.nodes())
    return {node_id: alive.get(node_id) for node_id in node_ids}


def refused_raylets(raw_nodes: list[dict]) -> set[str]:
    """Ids of the nodes (entries of `ray.nodes()`) Ray lists as alive whose raylet refuses connections."""
    return {node_id for node_id, verdict in probe_all(_alive_addresses(raw_nodes)).items() if verdict == "refused"}


def _alive_addresses(raw_nodes: list[dict]) -> dict[str, tuple[str, int]]:
    return {raw["NodeID"]: (raw["NodeManagerAddress"], int(raw["NodeManagerPort"]))
            for raw in raw_nodes if raw.get("Alive") and raw.get("NodeManagerPort")}


class NodeWatch(node_probe.NodeWatch):
    """node_probe.NodeWatch that also asks Ray's view about quiet nodes, which can end the grace early.
    `node_ids`: node name -> Ray node id (without it, only the probes count)."""

    def __init__(self, raylets: dict, grace_s: float, *, node_ids: dict[str, str] | None = None,
                 timeout_s: float = RAYLET_PROBE_TIMEOUT_S):
        assert node_ids is None or set(raylets) <= set(node_ids), (sorted(raylets), node_ids)
        super().__init__(raylets, grace_s, timeout_s=timeout_s)
        self.node_ids = node_ids

    def dead_among(self, quiet: list[str]) -> set[str]:
        if self.node_ids is None:
            return set()
        alive = {raw["NodeID"] for raw in ray.nodes() if raw["Alive"]}
        return {name for name in quiet if self.node_ids[name] not in alive}


def settled_ok(ref) -> bool:
    """Whether the finished call `ref` succeeded (False: it raised, or its actor died)."""
    try:
        ray.get(ref)
        return True
    except ray.exceptions.RayError:
        return False


def keeper_alive(job_id: str, node_id: str) -> bool | None:
    """True when the job's keeper on the node answers (the node lives), False when it died, None when unsure."""
    try:
        ray.get(get_keeper(job_id, node_id).node_id.remote(), timeout=1.0)
        return True
    except (ValueError, ray.exceptions.RayActorError):
        return False
    except ray.exceptions.GetTimeoutError:
        return None


def detect_failure(group, node_ids: dict[str, str], failure: Exception, *, job_id: str, timeout_s: float,
                   loss_grace_s: float, store_nodes: tuple[str, ...] = ()) -> dict:
    """Name the cause of a failed group call: a lost node of the plan, or one of `store_nodes` (nodes whose
    store takes copies but that run no worker), (Ray marks it dead, or its raylet refuses connections, which
    is conclusive and faster than Ray's health checks; a raylet that only stays silent counts once silent past
    `loss_grace_s`, or at once when the node's workers are dead too), or a dead worker on a node whose keeper
    still answers. The nodes are probed in parallel. Returns {"lost_nodes", "dead_ranks", "message"};
    RuntimeError when nothing is found in time.
    `group`: the WorkerGroup whose call failed; `node_ids`: node name -> Ray node id."""
    deadline = time.perf_counter() + timeout_s
    plan_ids = {node: node_ids[node] for node in sorted({s["node"] for s in group.slots} | set(store_nodes))}
    addresses = raylet_addresses(plan_ids.values())
    watch = NodeWatch({node: addresses[i] for node, i in plan_ids.items()}, loss_grace_s, node_ids=plan_ids)
    while time.perf_counter() < deadline:
        verdicts = watch.poll()
        lost = {node for node, v in verdicts.items() if v in LOST_VERDICTS}
        dead = []
        if not lost:
            dead, _ = group.ping(timeout_s=0.25)
            node_of = lambda ranks: {group.slots[r]["node"] for r in ranks}  # noqa: E731
            lost = {node for node in node_of(dead) if verdicts[node] == "quiet"}
            for node in sorted(node_of(dead) - lost):    # the node lives: is it only the actor?
                verdict = keeper_alive(job_id, node_ids[node])
                if verdict is None:                      # undecided: ask again
                    dead = []
                elif not verdict:
                    lost.add(node)
        if lost or dead:
            return named_failure(group, sorted(lost), dead, failure)
        time.sleep(0.2)
    raise RuntimeError(f"a step failed but Ray reports no lost node or dead actor within {timeout_s:g} s: "
                       f"{failure}")
