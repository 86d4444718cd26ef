"""Figures of an emulated spot replay: per-change phases, the exactly-once and loss checks against an
uninterrupted single-process run on the same sample order, and goodput on the emulated clock."""
from __future__ import annotations

import statistics

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


def reference_check(history: list[dict], *, data_dir: str, model, global_batch: int, seq_len: int, seed: int,
                    optimizer, rel: float = 1e-5) -> dict:
    """The final record against a single-process run of the same steps on the same sample order (float64):
    every step present once, its sample ids equal (exactly once), its loss within `rel`."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)             # a tiny model: more threads only contend for the shared cores
    try:
        return _reference_check(history, data_dir, model, global_batch, seq_len, seed, optimizer, rel)
    finally:
        torch.set_num_threads(threads)


def _reference_check(history, data_dir, model, global_batch, seq_len, seed, optimizer, rel) -> dict:
    import torch

    from autohet_ray.data import Dataset
    from autohet_ray.runtime.reference import Reference
    record = step_record(history)
    steps = max(record)
    data = Dataset.open(data_dir)
    ref = Reference(model_spec=model, seed=seed, optimizer=optimizer, dtype=torch.float64)
    ids_equal, worst, ref_losses = True, 0.0, []
    for i in range(steps):
        expected_ids = sorted(int(x) for x in data.sample_ids(i, global_batch, seq_len, seed))
        got = record.get(i + 1)
        ids_equal &= got is not None and got.get("sample_ids") == expected_ids
        loss = ref.train_step(data.global_batch(i, global_batch, seq_len, seed))["loss"]
        ref_losses.append(loss)
        if got is not None:
            worst = max(worst, abs(got["loss"] - loss) / abs(loss))
    all_ids = [i for s in sorted(record) for i in record[s].get("sample_ids", [])]
    return {"steps": steps, "steps_present": sorted(record) == list(range(1, steps + 1)),
            "sample_ids_equal": bool(ids_equal), "samples_once": len(all_ids) == len(set(all_ids)),
            "max_rel_loss_diff": worst, "losses_equal": worst <= rel, "rel_tolerance": rel,
            "final_loss": record[steps]["loss"], "reference_final_loss": ref_losses[-1],
            "steps_trained_again": len(history) - len(record)}


def emulated_goodput(segments: list[dict], *, cluster, pools: tuple[str, ...], steps_committed: int,
                     global_batch: int, time_scale: float, planner) -> dict:
    """Committed samples ÷ the ideal on the emulated clock (1 emulated s = 1 predicted GPU s = time_scale wall
    s): the ideal integrates, over the replay's wall-clock pieces, the predicted samples/s of the best plan for
    the nodes alive (the real planner, the same cost model) times the piece's emulated seconds."""
    from autohet_ray.replay.accounting import ideal_rate
    from autohet_ray.replay.planning import PlanCache
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
