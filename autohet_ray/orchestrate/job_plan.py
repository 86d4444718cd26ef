"""What a job plans with: its profile (analytic, measured on the cluster, or a file) and, at each launch, its
plan (the job's own at the first launch, a state's cached plan, or the planner's), priced by the cost model."""
from __future__ import annotations

import json

from autohet_ray import ConfigError
from autohet_ray.cost.evaluate import evaluate_plan
from autohet_ray.orchestrate.discovery import check_plan_fits
from autohet_ray.job.config import TrainJob, compute_dtype
from autohet_ray.metrics.step import peak_dtype
from autohet_ray.plan.schema import plan_from_dict


def job_profile(job: TrainJob, *, found, priced_model, cluster, seq_len: int):
    """The job's ProfileDB, made once per job (every re-plan prices with it)."""
    from autohet_ray.profile.analytic import analytic_profile, with_micro_batches
    plan = plan_from_dict(job.plan) if job.plan else None
    plan_sizes = [plan.micro_batch_of(k) for k in range(len(plan.pipelines))] if plan else []
    sizes = with_micro_batches(job.micro_batch, *plan_sizes)
    if job.profile == "analytic":        # priced in the dtype the workers compute in (fp64 as fp32)
        dtype = peak_dtype(compute_dtype(job.dtype, cuda=not found.emulated))
        return analytic_profile(priced_model, cluster, seq_len, sizes, dtype=dtype)
    if job.profile == "measured":
        from autohet_ray.orchestrate.profiling import profile_cluster
        return profile_cluster(found, priced_model, seq_len, micro_batches=sizes, cache_dir=job.profile_cache)
    from autohet_ray.profile.db import load_profile
    return load_profile(job.profile)


def choose_plan(job: TrainJob, *, found, profile, priced_model, seq_len: int, plan: dict | None, first: bool,
                cache: dict[str, dict]):
    """(plan with its prediction, its evaluation, the baselines' iteration seconds or None): `plan`, else the
    job's plan at the `first` launch, else the plan of this availability state in `cache`, else the planner's
    on the live nodes (then cached: the planner is deterministic, so a state seen again costs no planning)."""
    from autohet_ray.planner import plan_training, plan_with_baselines
    if plan is None and job.plan is not None and first:
        plan = job.plan
    state = json.dumps(found.cluster.to_dict(), sort_keys=True)   # the GPUs alive, by node
    if plan is None:
        plan = cache.get(state)
    baselines = None
    if plan is not None:
        chosen = plan_from_dict(plan)
    else:
        request = dict(cluster=found.cluster, model=priced_model, profile=profile, global_batch=job.global_batch,
                       seq_len=seq_len, micro_batch=job.micro_batch, time_limit_s=job.plan_time_limit_s,
                       schedules=job.schedules(), recompute=job.recompute)
        if job.baselines and first:
            result, found_baselines = plan_with_baselines(**request)
            baselines = {n: b.evaluation.iteration_time_s for n, b in found_baselines.items()
                         if b.evaluation is not None}
        else:
            result = plan_training(**request)
        chosen = result.plan
        cache[state] = chosen.to_dict()
    check_plan_fits(chosen, found)
    evaluation = evaluate_plan(chosen, found.cluster, priced_model, profile)
    if not evaluation.feasible:
        raise ConfigError(f"the plan does not fit: {evaluation.reason}")
    return chosen.with_predicted(evaluation.predicted()), evaluation, baselines
