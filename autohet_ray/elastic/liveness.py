"""Node-loss detection that tells a blip from a loss: is a node's raylet still answering?

Ray's GCS declares a node dead only after its health checks fail (seconds: period x threshold). A probe of the
node's raylet settles most cases at once: a live raylet answers within milliseconds, a killed one refuses the
connection (conclusive), and a stalled raylet or a vanished host stays silent. Silence alone is not
conclusive (a network blip, a paused process): `NodeWatch` declares a silent node lost only once the silence
lasts past a grace period, or when Ray itself lists the node as dead. Probes of several nodes run at once.
"""
from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor

import ray

RAYLET_PROBE_TIMEOUT_S = 0.5
LOSS_GRACE_S = 3.0          # the default grace (TrainJob.loss_grace_s)
# Probes further apart than this leave the time between them unobserved: it does not count as silence.
MAX_PROBE_GAP_S = 2.0
LOST_VERDICTS = ("refused", "dead", "silent")
# An HTTP/2 client preface and an empty SETTINGS frame (RFC 9113, 3.4): the raylet's gRPC server answers
# with its own SETTINGS. A bare TCP connect is no proof of life: the kernel completes it for a stopped process.
HTTP2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


def raylet_addresses(node_ids) -> dict[str, tuple[str, int] | None]:
    """Node id -> (host, node manager port) while Ray lists the node as alive, else None (one `ray.nodes()`)."""
    alive = {raw["NodeID"]: (raw["NodeManagerAddress"], int(raw["NodeManagerPort"]))
             for raw in ray.nodes() if raw["Alive"]}
    return {node_id: alive.get(node_id) for node_id in node_ids}


def refused_raylets(raw_nodes: list[dict]) -> set[str]:
    """Ids of the nodes (entries of `ray.nodes()`) Ray lists as alive whose raylet refuses connections."""
    addresses = {raw["NodeID"]: (raw["NodeManagerAddress"], int(raw["NodeManagerPort"]))
                 for raw in raw_nodes if raw.get("Alive") and raw.get("NodeManagerPort")}
    return {node_id for node_id, verdict in probe_all(addresses).items() if verdict == "refused"}


def probe(address: tuple[str, int], timeout_s: float = RAYLET_PROBE_TIMEOUT_S) -> str:
    """"ok" (the raylet answered), "refused" (the host answers but nothing listens: the raylet died) or
    "silent" (no answer in time: the host is gone, the network hiccuped, or the raylet is stalled)."""
    deadline = time.monotonic() + timeout_s
    try:
        with socket.create_connection(address, timeout=timeout_s) as conn:
            conn.settimeout(max(1e-3, deadline - time.monotonic()))
            conn.sendall(HTTP2_HELLO)
            conn.recv(4096)               # any bytes, or an orderly close: a running process handled it
            return "ok"
    except ConnectionRefusedError:
        return "refused"
    except OSError:
        return "silent"


def probe_all(addresses: dict, timeout_s: float = RAYLET_PROBE_TIMEOUT_S) -> dict:
    """key -> probe(address), every address probed at once (a thread each): one probe's time, not N."""
    if not addresses:
        return {}
    with ThreadPoolExecutor(max_workers=len(addresses), thread_name_prefix="raylet-probe") as pool:
        futures = {key: pool.submit(probe, address, timeout_s) for key, address in addresses.items()}
    return {key: future.result() for key, future in futures.items()}


class NodeWatch:
    """Which of a set of nodes are lost, on conclusive evidence only: the raylet refuses connections ("refused"),
    Ray lists the node as dead or gave no address for it ("dead"), or the raylet stays silent past `grace_s`
    ("silent"). Silence is the wall time since the node last answered (gaps over MAX_PROBE_GAP_S between
    probes excluded: nobody watched then). A shorter silence reads "quiet".
    `raylets`: node name -> (host, port), or None where Ray no longer lists the node as alive; `node_ids`:
    node name -> Ray node id (when given, Ray's view is asked about quiet nodes, which can end the grace early)."""

    def __init__(self, raylets: dict, grace_s: float, *, node_ids: dict[str, str] | None = None,
                 timeout_s: float = RAYLET_PROBE_TIMEOUT_S):
        assert grace_s >= 0, grace_s
        assert node_ids is None or set(raylets) <= set(node_ids), (sorted(raylets), node_ids)
        self.raylets, self.grace_s, self.node_ids, self.timeout_s = dict(raylets), grace_s, node_ids, timeout_s
        self.silent_s: dict[str, float] = {}       # name -> seconds silent since it last answered
        self.last_probe: dict[str, float] = {}     # name -> when its latest probe ended (monotonic)

    def poll(self) -> dict[str, str]:
        """Probe every node once, all at once: name -> "ok", "quiet", or why it is lost (LOST_VERDICTS)."""
        start = time.monotonic()
        answers = probe_all({name: a for name, a in self.raylets.items() if a is not None}, self.timeout_s)
        end = time.monotonic()
        verdicts = {}
        for name in self.raylets:
            verdict = answers.get(name, "dead")
            if verdict == "silent":
                since = start - self.last_probe.get(name, start)
                self.silent_s[name] = (self.silent_s.get(name, 0.0) + (since if since <= MAX_PROBE_GAP_S else 0.0)
                                       + end - start)
                if self.silent_s[name] < self.grace_s:
                    verdict = "quiet"
            else:
                self.silent_s.pop(name, None)
            self.last_probe[name] = end
            verdicts[name] = verdict
        quiet = [name for name, v in verdicts.items() if v == "quiet"]
        if quiet and self.node_ids is not None:
            alive = {raw["NodeID"] for raw in ray.nodes() if raw["Alive"]}
            verdicts |= {name: "dead" for name in quiet if self.node_ids[name] not in alive}
        return verdicts

    def check(self) -> tuple[str, str] | None:
        """(name, why) of the first lost node by name; None while every node answers or is within its grace."""
        return next(((name, v) for name, v in sorted(self.poll().items()) if v in LOST_VERDICTS), None)

    def explain(self, name: str, verdict: str) -> str:
        address = self.raylets[name]
        at = f"its raylet at {address[0]}:{address[1]}" if address else "its raylet"
        if verdict == "refused":
            return f"{at} refuses connections"
        if verdict == "dead":
            return "Ray lists it as dead"
        return f"{at} has been silent for {self.silent_s.get(name, 0.0):.1f} s (grace {self.grace_s:g} s)"


def keeper_alive(job_id: str, node_id: str) -> bool | None:
    """True when the job's keeper on the node answers (the node lives), False when it died, None when unsure."""
    from autohet_ray.elastic.keeper import get_keeper
    try:
        ref = get_keeper(job_id, node_id).node_id.remote()
        ray.get(ref, timeout=1.0)
        return True
    except ValueError:
        return False
    except ray.exceptions.RayActorError:
        return False
    except ray.exceptions.GetTimeoutError:
        return None


def detect_failure(group, node_ids: dict[str, str], failure: Exception, *, job_id: str, timeout_s: float,
                   loss_grace_s: float = LOSS_GRACE_S) -> dict:
    """Name the cause of a failed group call: a lost node of the plan (Ray marks it dead, or its raylet
    refuses connections, which is conclusive and faster than Ray's health checks; a raylet that only stays
    silent counts once silent past `loss_grace_s`, or at once when the node's workers are dead too), or a dead
    worker on a node whose keeper still answers. The plan's nodes are probed in parallel. Returns
    {"lost_nodes", "dead_ranks", "message"}; RuntimeError when nothing is found in time.
    `group`: the WorkerGroup whose call failed; `node_ids`: node name -> Ray node id."""
    deadline = time.perf_counter() + timeout_s
    plan_ids = {node: node_ids[node] for node in sorted({s["node"] for s in group.slots})}
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
            return _named_failure(group, sorted(lost), dead, failure)
        time.sleep(0.2)
    raise RuntimeError(f"a step failed but Ray reports no lost node or dead actor within {timeout_s:g} s: "
                       f"{failure}")


def _named_failure(group, lost_nodes: list[str], dead: list[int], failure: Exception) -> dict:
    ranks = [r for r, s in enumerate(group.slots) if s["node"] in lost_nodes] or dead
    named = "; ".join(group.describe(r) for r in ranks)
    what = f"lost node(s) {lost_nodes}" if lost_nodes else "dead worker(s)"
    return {"lost_nodes": lost_nodes, "dead_ranks": ranks, "message": f"{what}: {named} (first error: {failure})"}
