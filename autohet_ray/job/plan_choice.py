"""The plan a job runs at each launch: the job's own at the first launch, a state's cached plan, or the
planner's; checked against the live nodes and priced by the cost model."""
from __future__ import annotations

import json

from autohet_ray import ConfigError
from autohet_ray.cluster.live import Discovered
from autohet_ray.cost.evaluate import evaluate_plan
from autohet_ray.job.config import TrainJob
from autohet_ray.plan.schema import Plan, plan_from_dict


def choose_plan(job: TrainJob, *, found: Discovered, profile, priced_model, seq_len: int, plan: dict | None,
                first: bool, cache: dict[str, dict]):
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


def check_plan_fits(plan: Plan, found: Discovered) -> None:
    """ConfigError when the plan needs GPUs (node, type, index) the live cluster lacks."""
    nodes = {n.name: n for n in found.nodes}
    for k, pipeline in enumerate(plan.pipelines):
        for j, stage in enumerate(pipeline.stages):
            where = f"pipeline {k} stage {j}"
            live = nodes.get(stage.node)
            if live is None:
                have = ", ".join(f"{n.name} ({n.num_gpus}x {n.device_type})" for n in found.nodes)
                raise ConfigError(f"the plan needs {stage.tp}x {stage.device_type} on node {stage.node!r} for "
                                  f"{where}, but the Ray cluster has no such node; it has: {have}")
            if live.device_type != stage.device_type:
                raise ConfigError(f"the plan puts {where} on {stage.node!r} as {stage.device_type}, but that node "
                                  f"has {live.device_type} GPUs")
            if max(stage.devices) >= live.num_gpus:
                raise ConfigError(f"the plan needs GPU {max(stage.devices)} of node {stage.node!r} for {where}, "
                                  f"but that node has only {live.num_gpus} {live.device_type} GPUs")
