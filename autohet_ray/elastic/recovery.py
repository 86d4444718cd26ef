"""Recovery and re-planning of a running job (the controller's elastic half, as functions of the controller).

A failed step is handled in phases: detect (name the lost node or dead worker) -> salvage (stop the survivors'
step, keep their processes) -> rediscover -> relaunch (plan on what is left, restart, restore the newest
committed step from the cheapest copies). Recovery is re-entrant: a loss during any phase, or during the first
step after it (the controller's loop), is handled like the first. Planned changes (a spot notice or a Ray
drain, nodes that joined) flush first, so they lose no step.
"""
from __future__ import annotations

import time

import ray

from autohet_ray.cluster.node_probe import probe_all
from autohet_ray.elastic.liveness import detect_failure, raylet_addresses, refused_raylets
from autohet_ray.job.stage_in import copies_after_loss

MAX_RECOVERIES_IN_A_ROW = 5


class RecoveryFailed(RuntimeError):
    """Recovery could not name the failure, or no committed step could be restored."""


class StepFailed(RuntimeError):
    """A step raised on a healthy cluster (every node and worker answers): an error, not a loss; the job ends
    (its committed steps kept) instead of recovering into the same error."""


def plan_summary(plan) -> list[list[str]]:
    """Per pipeline, its stages as 'node:device xTP [start,end)'."""
    return [[f"{s.node}:{s.device_type}x{s.tp}[{s.layers[0]},{s.layers[1]})" for s in p.stages]
            for p in plan.pipelines]


def usable_nodes(ctl) -> list[dict]:
    """The `ray.nodes()` entries of live nodes the job may use: alive, raylet not refusing, not draining and not
    already found lost (a replacement may join under the name of a node that is still draining)."""
    alive = [n for n in ray.nodes() if n["Alive"] and n["NodeID"] not in ctl.draining | ctl.gone]
    refused = refused_raylets(alive)
    return [n for n in alive if n["NodeID"] not in refused]


def dead_nodes(ctl, usable: list[dict] | None = None) -> list[str]:
    """Nodes of the cluster file with no usable live Ray node (see usable_nodes)."""
    names = {(raw.get("Labels") or {}).get("autohet.io/node") for raw in usable or usable_nodes(ctl)}
    return [n.name for n in ctl.base_cluster.nodes if n.name not in names]


def recover(ctl, failure, *, mode: str = "local_first") -> dict:
    """Recover from a failed group call; the report of every phase (the controller adds the first step).
    A loss during re-planning or restore starts the next round; after MAX_RECOVERIES_IN_A_ROW rounds without
    a completed launch it gives up (RecoveryFailed)."""
    started_at = time.perf_counter()
    t0 = ctl.fault_at or started_at
    completed = ctl.step_index                 # a failed round's launch resets it
    rounds = []
    for _ in range(MAX_RECOVERIES_IN_A_ROW):
        try:
            report = _recover_once(ctl, failure, mode, t0)
        except _LostAgain as again:
            rounds.append(again.report)
            failure, t0 = again.failure, time.perf_counter()
            continue
        report |= {"started_at": ctl.fault_at or started_at, "rounds": len(rounds) + 1,
                   "earlier_rounds": rounds, "completed_step": completed,
                   "lost_steps": completed - report["restored_step"]}
        ctl.fault_at = None
        ctl.recoveries.append(report)
        return report
    raise RecoveryFailed(f"{MAX_RECOVERIES_IN_A_ROW} losses in a row while recovering; last: {failure}")


class _LostAgain(Exception):
    def __init__(self, failure, report: dict):
        super().__init__(str(failure))
        self.failure, self.report = failure, report


def _recover_once(ctl, failure, mode: str, t0: float) -> dict:
    from autohet_ray.orchestrate.worker_group import GroupFailure
    if not getattr(failure, "dead", True) and _healthy(ctl):
        raise StepFailed(f"a step failed with every node and worker alive: {failure}") from failure
    try:
        lost = detect_failure(ctl.group, ctl.found.node_ids, failure, job_id=ctl.job_id,
                              timeout_s=ctl.job.detect_timeout_s, loss_grace_s=ctl.job.loss_grace_s,
                              store_nodes=store_only_nodes(ctl))
    except RuntimeError as err:
        raise RecoveryFailed(str(err)) from failure
    detect_s = time.perf_counter() - t0
    if ctl.committer is None:                  # the group stays whole: closing the job stops every worker
        raise RecoveryFailed(f"{lost['message']}; the job keeps no checkpoints (give it a storage), so it "
                             f"cannot continue") from failure
    ctl.gone |= {ctl.found.node_ids[node] for node in lost["lost_nodes"]}
    salvage_start = time.perf_counter()
    for node in lost["lost_nodes"]:
        ctl.committer.drop_keeper(node, lost["message"])
    if mode == "local_first":
        start_stage_in(ctl, lost["lost_nodes"])
    step, orphans = ctl.committer.orphans_of_newest()
    rescued: dict[str, set[str]] = {}
    nodes, rescue_errors = [slot["node"] for slot in ctl.group.slots], []
    reuse = ctl.group.salvage(ctl.inflight, set(lost["dead_ranks"]), before_reset=lambda alive: rescued.update(
        rescue_orphans(alive, nodes, step, orphans, rescue_errors)))
    ctl.inflight = []
    salvage = {f"salvage_{k}": v for k, v in ctl.group.salvage_phases.items()}
    ctl.committer.forget_pending()
    rereplicated = ctl.committer.rereplicate_newest(also_held=rescued)
    ctl.lost += lost["lost_nodes"]
    report = {"detect_s": detect_s, "salvage_s": time.perf_counter() - salvage_start, **salvage, **lost,
              "orphaned_chunks": len(orphans), "rescued_chunks": len(rescued), "rescue_errors": rescue_errors,
              "rereplicated_chunks": rereplicated}
    try:
        return report | relaunch(ctl, mode=mode, reason=lost["message"], reuse=reuse)
    except GroupFailure as again:
        raise _LostAgain(again, report) from None


def start_stage_in(ctl, lost_nodes: list[str]) -> None:
    """Start copying to each surviving node's store what its ranks read under the next plan (job/stage_in.py)."""
    manifest = ctl.committer.newest_manifest()
    copies = copies_after_loss(ctl.plan_cache, ctl.found.cluster, lost_nodes, ctl.model, manifest,
                               ctl.committer.node_of_store()) if manifest else {}
    ctl.staging = ctl.committer.send_copies(copies, manifest)


def wait_stage_in(ctl, timeout_s: float) -> dict:
    """Wait for start_stage_in's copies (a failed or late one costs only time: the restore reads elsewhere)."""
    start, refs, ctl.staging = time.perf_counter(), ctl.staging, []
    ready = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)[0] if refs else []
    return {"stage_in_wait_s": time.perf_counter() - start,
            "stage_in_bytes": ctl.committer.copied_bytes(ready) if ready else 0}


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
        except ray.exceptions.RayError as err:  # one fewer source; the restore names any chunk still missing
            errors.append(f"rank {rank}: {str(err).splitlines()[-1]}")
            continue
        for key in keys:
            held.setdefault(key, set()).add(nodes[rank])
    return held


def store_only_nodes(ctl) -> tuple[str, ...]:
    """Nodes whose store (keeper) takes this job's copies but that run none of its workers: their loss fails
    the next snapshot that pushes there, and is a node loss like any other."""
    stores = ctl.committer.keepers if ctl.committer is not None else {}
    return tuple(sorted(set(stores) - {s["node"] for s in ctl.group.slots}))


def _healthy(ctl, checks: int = 3, every_s: float = 0.3) -> bool:
    """Every plan node's and store node's raylet answers and every worker answers a ping, `checks` times in a
    row."""
    nodes = sorted({s["node"] for s in ctl.group.slots} | set(store_only_nodes(ctl)))
    for i in range(checks):
        addresses = raylet_addresses(ctl.found.node_ids[node] for node in nodes)
        if None in addresses.values() or any(v != "ok" for v in probe_all(addresses).values()):
            return False
        dead, silent = ctl.group.ping(timeout_s=1.0)
        if dead or silent:
            return False
        if i + 1 < checks:
            time.sleep(every_s)
    return True


def relaunch(ctl, *, mode: str, reason: str, reuse: dict[str, list] | None = None, plan: dict | None = None) -> dict:
    """Rediscover the live nodes, give new ones a node store, plan, restart and restore the newest step."""
    ctl.state = "replanning"
    start = time.perf_counter()
    ctl.found = ctl.discover()
    discover_s = time.perf_counter() - start
    if ctl.job.elastic:
        ctl.start_keepers()                    # a joined node's store: a new actor there (timed apart)
    # A loss before the first commit (and no step restored at the start): the job starts over from its seeded
    # initialization, which is what a restore of "step 0" would give.
    fresh = ctl.committer is not None and not ctl.committer.committed
    report = {"reason": reason, "discover_s": discover_s, "keepers_s": time.perf_counter() - start - discover_s,
              **ctl.launch(None if fresh else mode, reuse, plan)}
    if fresh:
        report |= {"restored_step": 0, "restarted_from_init": True}
    ctl.state = "running"
    return report


def replan(ctl, *, reason: str = "requested", plan: dict | None = None) -> dict:
    """A planned re-plan on the live nodes: flush, keep the workers' processes, relaunch from the flushed step."""
    ctl.flush()
    reuse = ctl.group.salvage([], set())
    completed = ctl.step_index
    report = relaunch(ctl, mode="local_first", reason=reason, reuse=reuse, plan=plan)
    report["lost_steps"] = completed - report["restored_step"]
    ctl.recoveries.append(report)
    return report


def check_notices(ctl, board) -> dict | None:
    """Act on spot notices (the job's notice board) and on Ray's drain signal between steps: flush,
    acknowledge (the watcher then drains its node), and re-plan without the noticed nodes, so no step is
    lost. None when nothing is pending."""
    from autohet_ray.elastic.spot import draining_nodes
    assert ctl.state == "running", ctl.state
    wait_s = ctl.job.control_timeout_s
    pending = set(ray.get(board.pending.remote(), timeout=wait_s)) if board is not None else set()
    names = {n.node_id: n.name for n in ctl.found.nodes}
    noticed = sorted({names[i] for i in pending | set(draining_nodes()) if i in names})
    if not noticed and not pending:
        return None
    start = time.perf_counter()
    ctl.flush()
    flush_s = time.perf_counter() - start
    for node_id in pending:
        ray.get(board.ack.remote(node_id), timeout=wait_s)
    ctl.draining.update(pending)     # also a noticed node not planned onto yet (it joined): never plan onto it
    if not noticed:
        return {"nodes": [], "flush_s": flush_s}
    ctl.draining.update(i for i, name in names.items() if name in noticed)
    report = replan(ctl, reason=f"spot notice: node(s) {noticed} will be preempted")
    for node in noticed:
        ctl.committer.drop_keeper(node, "spot notice or drain: the node is leaving")
    return report | {"nodes": noticed, "flush_s": flush_s}


def check_joins(ctl, plan: dict | None = None) -> dict | None:
    """Re-plan onto nodes of the cluster file that joined since the last plan (replacement spot nodes the
    autoscaler brought); None when none joined. `plan`: run this plan instead of planning."""
    assert ctl.state == "running", ctl.state
    current = {n.name for n in ctl.found.nodes}
    dead = set(dead_nodes(ctl))
    joined = sorted(n.name for n in ctl.base_cluster.nodes if n.name not in current | dead)
    if not joined:
        return None
    return {"joined": joined, **replan(ctl, reason=f"node(s) {joined} joined", plan=plan)}
