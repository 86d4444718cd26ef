from autohet_ray.planner.baselines import BaselineResult, best_baseline
from autohet_ray.plan.schedule import PLAN_SCHEDULES
from autohet_ray.planner.search import PlanResult, check_request, micro_batch_candidates, plan_training

__all__ = ["BaselineResult", "best_baseline", "PlanResult", "check_request", "micro_batch_candidates",
           "plan_training", "plan_with_baselines"]


def plan_with_baselines(*, cluster, model, profile, global_batch, seq_len, micro_batch=None, time_limit_s=60.0,
                        schedules=PLAN_SCHEDULES):
    """The planner's plan and both baselines, all priced with the same cost model and schedules.
    The baselines' plans seed the planner, so it is never worse than either."""
    check_request(model, profile, global_batch, seq_len, schedules)
    mbs = micro_batch_candidates(global_batch, profile, micro_batch)
    baselines = {name: best_baseline(name, cluster=cluster, model=model, profile=profile,
                                     global_batch=global_batch, seq_len=seq_len, micro_batches=mbs,
                                     schedules=schedules)
                 for name in ("megatron", "whale")}
    result = plan_training(cluster=cluster, model=model, profile=profile, global_batch=global_batch,
                           seq_len=seq_len, micro_batch=micro_batch, time_limit_s=time_limit_s,
                           incumbents=tuple(b.plan for b in baselines.values() if b.plan is not None),
                           schedules=schedules)
    return result, baselines
