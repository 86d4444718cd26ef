"""The figures of one training step, from every worker's report: loss, speed measured vs predicted (emulated
figures say so, in emulated seconds), snapshot and data waits, the samples consumed and the pacer's overruns."""
from __future__ import annotations


def step_metrics(outs: list[dict], wall: float, *, step: int, job, evaluation, profile_kind: str,
                 time_scale: float, data_wait_s: float) -> dict:
    scale = time_scale if job.paced else 1.0
    m = {"step": step, "loss": outs[0]["loss"], "grad_norm": outs[0]["grad_norm"],
         "wall_s": wall, "emulated": job.paced, "time_scale": scale, "iteration_s": wall / scale,
         "samples_per_s": job.global_batch / (wall / scale), "predicted_iteration_s": evaluation.iteration_time_s,
         "predicted_samples_per_s": evaluation.samples_per_s, "profile_kind": profile_kind,
         "snapshot_copy_s": max(o.get("snapshot_copy_s", 0.0) for o in outs),
         "snapshot_wait_s": max(o.get("snapshot_wait_s", 0.0) for o in outs),
         "compute_s": max(o["timings"]["step"] for o in outs), "data_wait_s": data_wait_s}
    if any("sample_ids" in o for o in outs):             # each pipeline's first stage reports its samples
        m["sample_ids"] = sorted(i for o in outs for i in o.get("sample_ids", ()))
    if job.paced:
        by_op: dict[str, int] = {}
        for o in outs:
            for op, n in o["emulation"]["overruns"].items():
                by_op[op] = by_op.get(op, 0) + n
        m |= {"overruns": sum(by_op.values()), "overruns_by_op": by_op,
              "overrun_s": max(o["emulation"]["overrun_s"] for o in outs),
              "op_seconds_max": {op: max(o["timings"].get(op, 0.0) for o in outs) for op in outs[0]["timings"]}}
    return m
