"""Where a plan's GPU time goes: each GPU's iteration split into its own compute and the reasons it idles.

For a GPU of stage j in pipeline k (m micro-batches, stage times t_j per micro-batch, pipeline end P_k, iteration
T, slowest pipeline end P = max P_k):
    compute       m * t_j                      forward, backward (and W) of its micro-batches
    imbalance     m * (max_i t_i - t_j)        a slower stage of the same pipeline sets the pace
    fill_drain    P_k - m * max_i t_i          pipeline fill and drain (the schedule's bubble) and links
    other_pipes   P - P_k                      waiting for a slower pipeline
    tail          T - P                        gradient sync and optimizer after the last pipeline ends
The five add up to T. Shares are averaged over GPUs (each GPU counts once).
"""
from __future__ import annotations

from autohet_ray.cost.evaluate import Evaluation
from autohet_ray.plan.schema import Plan

PARTS = ("compute", "imbalance", "fill_drain", "other_pipes", "tail")
LABELS = {"compute": "compute", "imbalance": "stage imbalance", "fill_drain": "pipeline fill/drain",
          "other_pipes": "waiting for other pipelines", "tail": "sync+optimizer tail"}


def time_breakdown(plan: Plan, evaluation: Evaluation) -> dict[str, float]:
    """Share of all GPUs' iteration time per part (PARTS); the shares add up to 1."""
    total = {part: 0.0 for part in PARTS}
    iteration, slowest = evaluation.iteration_time_s, max(evaluation.pipeline_times_s)
    gpus = 0
    for k, pipeline in enumerate(plan.pipelines):
        m, times = pipeline.num_microbatches, evaluation.stage_times_s[k]
        pace, end = max(times), evaluation.pipeline_times_s[k]
        for j, stage in enumerate(pipeline.stages):
            n = len(stage.devices)
            total["compute"] += n * m * times[j]
            total["imbalance"] += n * m * (pace - times[j])
            total["fill_drain"] += n * (end - m * pace)
            total["other_pipes"] += n * (slowest - end)
            total["tail"] += n * (iteration - slowest)
            gpus += n
    assert gpus and iteration > 0
    return {part: value / (gpus * iteration) for part, value in total.items()}


def breakdown_line(shares: dict[str, float]) -> str:
    return "GPU time: " + ", ".join(f"{LABELS[p]} {100 * shares[p]:.1f}%" for p in PARTS)
