import time

from autohet_ray.plan.schedule import PLAN_SCHEDULES
from autohet_ray.planner.baselines import BaselineResult, best_baseline
from autohet_ray.planner.search import PlanResult, check_request, micro_batch_candidates, plan_training
from autohet_ray.planner.workers import run_split

__all__ = ["BASELINES", "BaselineResult", "best_baseline", "PlanResult", "check_request", "micro_batch_candidates",
           "plan_training", "plan_with_baselines", "strongest_baseline"]

# name -> (rules, may leave GPUs idle): Megatron-LM on all GPUs, on the best subset of them, and Whale
BASELINES = {"megatron": ("megatron", False), "megatron-subset": ("megatron", True), "whale": ("whale", False)}


def plan_with_baselines(*, cluster, model, profile, global_batch, seq_len, micro_batch=None, time_limit_s=60.0,
                        schedules=PLAN_SCHEDULES, seed=True, recompute="none", optimizer_sharding="none",
                        goal=None):
    """The planner's plan and every baseline of BASELINES, all priced with the same cost model and schedules.
    With `seed` the baselines' plans seed the planner (so it is never worse than any of them); the time limit
    covers the baselines too. The baselines may recompute activations as the planner may (`recompute`), and
    Megatron-LM shards its optimizer state when the planner may (`optimizer_sharding`). `goal` (cost/money.py)
    is the planner's objective and limits; the baselines keep their own rules (the most samples/s)."""
    start = time.perf_counter()
    check_request(model, profile, global_batch, seq_len, schedules)
    mbs = micro_batch_candidates(global_batch, profile, micro_batch)
    # Whale in the helper process (planner/workers.py) while Megatron-LM runs here, then Megatron on a subset,
    # which reuses Megatron's simulated timelines
    names = sorted(BASELINES, key=lambda n: (BASELINES[n][1], BASELINES[n][0]))
    found = run_split(_baseline, names, dict(cluster=cluster, model=model, profile=profile,
                                             global_batch=global_batch, seq_len=seq_len, micro_batches=mbs,
                                             schedules=schedules, recompute=recompute,
                                             optimizer_sharding=optimizer_sharding))
    baselines = {name: found[names.index(name)] for name in BASELINES}
    result = plan_training(cluster=cluster, model=model, profile=profile, global_batch=global_batch,
                           seq_len=seq_len, micro_batch=micro_batch,
                           time_limit_s=max(0.0, time_limit_s - (time.perf_counter() - start)),
                           incumbents=tuple(b.plan for b in baselines.values() if b.plan is not None) if seed else (),
                           schedules=schedules, recompute=recompute, optimizer_sharding=optimizer_sharding,
                           **({"goal": goal} if goal is not None else {}))
    return result, baselines


def _baseline(name: str, request: dict) -> BaselineResult:
    rules, subsets = BASELINES[name]
    return best_baseline(rules, subsets=subsets, **request)


def strongest_baseline(baselines: dict[str, BaselineResult]) -> str | None:
    """The name of the fastest baseline that runs (the headline's reference), or None."""
    running = [n for n, b in baselines.items() if b.evaluation is not None]
    return min(running, key=lambda n: baselines[n].evaluation.iteration_time_s, default=None)
