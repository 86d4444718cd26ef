"""The emulated spot replay as pure data (no Ray; emulate/replay.py drives the cluster): the node actions a
timeline asks for, and the replay's figures: per-change phases, committed steps lost, goodput on the emulated
clock."""
from __future__ import annotations

import statistics
from dataclasses import dataclass

from autohet_ray.cluster.spec import Cluster
from autohet_ray.replay.accounting import ideal_rate
from autohet_ray.replay.planning import PlanCache
from autohet_ray.replay.timeline import Timeline

@dataclass(frozen=True, kw_only=True)
class NodeAction:
    time_s: float          # trace seconds from the replay's start
    kind: str              # "notice", "remove" or "add"
    node: str              # cluster-file node name
    event: int             # index of the timeline event it belongs to
    deadline_s: float = 0.0  # a notice: the trace time of the removal it announces


def pool_node_names(cluster: Cluster, pools: tuple[str, ...]) -> list[list[str]]:
    """Per pool (GPU type), its node names in cluster-file order."""
    return [[n.name for n in cluster.nodes if n.device == pool] for pool in pools]


def node_actions(timeline: Timeline, names: list[list[str]], notice_s: float = 0.0) -> tuple[list[str], list[NodeAction]]:
    """The nodes alive at the start and the actions in time order. A pool shrinking loses its last alive nodes
    (file order), a growing pool gets its first missing ones back. A notice precedes each removal by
    `notice_s`, or comes when the node joined if it lives less than that (0: no notices)."""
    alive = [set(pool[:k]) for pool, k in zip(names, timeline.initial)]
    joined_at = {n: 0.0 for pool in alive for n in pool}
    actions: list[NodeAction] = []
    for event in timeline.events:
        for p, (pool, before, after) in enumerate(zip(names, event.before, event.after)):
            ordered = [n for n in pool if n in alive[p]]
            for name in ordered[after:] if after < before else []:
                if notice_s > 0:
                    actions.append(NodeAction(time_s=max(joined_at[name], event.time_s - notice_s), kind="notice",
                                              node=name, event=event.index, deadline_s=event.time_s))
                actions.append(NodeAction(time_s=event.time_s, kind="remove", node=name, event=event.index))
                alive[p].discard(name)
            for name in [n for n in pool if n not in alive[p]][:max(0, after - before)]:
                actions.append(NodeAction(time_s=event.time_s, kind="add", node=name, event=event.index))
                alive[p].add(name)
                joined_at[name] = event.time_s
    order = {"remove": 0, "add": 1, "notice": 2}      # a node joins before a notice of its own can reach it
    start = [n for pool, k in zip(names, timeline.initial) for n in pool[:k]]
    return start, sorted(actions, key=lambda a: (a.time_s, order[a.kind], a.node))


PHASES = ("detect_s", "replan_s", "restart_s", "restore_s", "first_step_s")


def change_phases(change: dict) -> dict:
    """One change's phases in wall seconds: detect (recoveries only), re-plan (rediscovery + planner), restart
    (a joined node's store, the workers and their process groups), restore (fetch + load of the newest committed step), the first step."""
    out = {"kind": change["kind"], "trace_s": round(change["trace_s"], 1), "step": change["step"],
           "detect_s": change.get("detect_s", 0.0),
           "replan_s": change.get("discover_s", 0.0) + change.get("replan_s", 0.0),
           "restart_s": change.get("keepers_s", 0.0) + change.get("restart_s", 0.0),
           "restore_s": change.get("fetch_s", 0.0) + change.get("load_s", 0.0),
           "first_step_s": change["first_step_s"], "lost_steps": change.get("lost_steps", 0),
           "restored_step": change.get("restored_step"), "bytes_by_tier": change.get("bytes_by_tier", {})}
    for key in ("flush_s", "rounds", "lost_nodes", "joined", "nodes"):
        if key in change:
            out[key] = change[key]
    return out


def phase_medians(phases: list[dict]) -> dict:
    """Per kind of change, the median of each phase (the figures the simulated replay costs events with)."""
    out = {}
    for kind in sorted({p["kind"] for p in phases}):
        mine = [p for p in phases if p["kind"] == kind]
        out[kind] = {"count": len(mine), **{k: statistics.median(p[k] for p in mine) for k in PHASES}}
    return out


def committed_lost(changes: list[dict]) -> int:
    """Committed steps the recoveries failed to restore: per recovery, the newest step committed before the
    loss less the step restored (0 when the restore reached it)."""
    return sum(max(0, c["newest_committed"] - c["restored_step"]) for c in changes if c["kind"] == "recovery")


def step_record(history: list[dict]) -> dict[int, dict]:
    """Step -> its metrics; a step trained again after a restore replaces its first run."""
    return {m["step"]: m for m in history}


def emulated_goodput(segments: list[dict], *, cluster, pools: tuple[str, ...], steps_committed: int,
                     global_batch: int, time_scale: float, planner) -> dict:
    """Committed samples ÷ the ideal on the emulated clock (1 emulated s = 1 predicted GPU s = time_scale wall
    s): the ideal integrates, over the replay's wall-clock pieces, the predicted samples/s of the best plan for
    the nodes alive (the real planner, the same cost model) times the piece's emulated seconds."""
    plans = PlanCache(planner)
    device_of = {n.name: n.device for n in cluster.nodes}
    ideal, pieces = 0.0, []
    for seg in segments:
        state = tuple(sum(1 for n in seg["alive"] if device_of[n] == p) for p in pools)
        emulated_s = (seg["wall_end"] - seg["wall_start"]) / time_scale
        rate = ideal_rate(state, plans)
        ideal += rate * emulated_s
        pieces.append({"state": list(state), "emulated_s": emulated_s, "ideal_samples_per_s": rate})
    achieved = steps_committed * global_batch
    return {"goodput": achieved / ideal if ideal else 0.0, "committed_samples": achieved, "ideal_samples": ideal,
            "emulated_s": sum(p["emulated_s"] for p in pieces), "pieces": pieces,
            "planning_s_by_state": {str(s): p.planning_s for s, p in plans.plans.items()}}
