"""The plan a job runs at each launch: the job's own at the first launch, a state's cached plan (planned
before, or ahead in the background), or the planner's; checked against the live nodes and priced by the cost
model."""
from __future__ import annotations

import json
import threading

from autohet_ray import ConfigError
from autohet_ray.cluster.live import Discovered
from autohet_ray.cluster.spec import Cluster
from autohet_ray.cost.evaluate import evaluate_plan
from autohet_ray.job.config import TrainJob, compute_dtype
from autohet_ray.job.foresight import cached_entry
from autohet_ray.metrics.step import peak_dtype
from autohet_ray.plan.schema import Plan, plan_from_dict
from autohet_ray.profile.analytic import analytic_profile, with_micro_batches


PLANNER_LOCK = threading.Lock()   # one planner run at a time: the controller's and the plan-ahead thread's


def state_key(cluster: Cluster) -> str:
    """An availability state: the GPUs alive, by node."""
    return json.dumps(cluster.to_dict(), sort_keys=True)


def job_micro_batches(job: TrainJob) -> tuple[int, ...]:
    """The micro-batch sizes the job's profile holds: the defaults, the job's fixed size and its plan's."""
    plan = plan_from_dict(job.plan) if job.plan else None
    plan_sizes = [plan.micro_batch_of(k) for k in range(len(plan.pipelines))] if plan else []
    return with_micro_batches(job.micro_batch, *plan_sizes)


def analytic_job_profile(job: TrainJob, *, priced_model, cluster: Cluster, seq_len: int, cuda: bool):
    """The job's analytic profile, priced in the dtype its workers compute in (fp64 as fp32; "auto": bf16 on
    CUDA, fp32 on CPUs, emulated GPUs included). `autohet train` and `autohet plan` both price with it."""
    dtype = peak_dtype(compute_dtype(job.dtype, cuda=cuda))
    return analytic_profile(priced_model, cluster, seq_len, job_micro_batches(job), dtype=dtype)


def plan_request(job: TrainJob, cluster: Cluster, *, profile, priced_model, seq_len: int) -> dict:
    """The planner's arguments for this job on `cluster`."""
    return dict(cluster=cluster, model=priced_model, profile=profile, global_batch=job.global_batch,
                seq_len=seq_len, micro_batch=job.micro_batch, time_limit_s=job.plan_time_limit_s,
                schedules=job.schedules(), recompute=job.recompute, optimizer_sharding=job.optimizer_sharding,
                goal=job.goal())


def choose_plan(job: TrainJob, *, found: Discovered, profile, priced_model, seq_len: int, plan: dict | None,
                first: bool, cache: dict[str, dict]):
    """(plan with its prediction, its evaluation, the baselines' iteration seconds or None, where the plan came
    from): `plan` ("given"), else the job's plan at the `first` launch ("job plan"), else the plan of this
    availability state in `cache` ("planned ahead" the first time a state planned ahead is used, then
    "cached"), else the planner's on the live nodes ("planned"; then cached: the planner is deterministic, so
    a state seen again costs no planning)."""
    from autohet_ray.planner import plan_training, plan_with_baselines  # lazy: PySCIPOpt
    baselines, source = None, "given"
    if plan is None and job.plan is not None and first:
        plan, source = job.plan, "job plan"
    if plan is None:
        with PLANNER_LOCK:                    # a state the plan-ahead thread is planning: wait for its plan
            entry = cached_entry(cache, state_key(found.cluster))   # its own, or an equivalent state's
            if entry is not None:
                plan, source = entry["plan"], "planned ahead" if entry.pop("ahead", False) else "cached"
            else:
                request = plan_request(job, found.cluster, profile=profile, priced_model=priced_model,
                                       seq_len=seq_len)
                if job.baselines and first:
                    result, found_baselines = plan_with_baselines(**request)
                    baselines = {n: b.evaluation.iteration_time_s for n, b in found_baselines.items()
                                 if b.evaluation is not None}
                else:
                    result = plan_training(**request)
                plan, source = result.plan.to_dict(), "planned"
                cache[state_key(found.cluster)] = {"plan": plan}
    chosen = plan_from_dict(plan)
    check_plan_fits(chosen, found)
    evaluation = evaluate_plan(chosen, found.cluster, priced_model, profile)
    if not evaluation.feasible:
        raise ConfigError(f"the plan does not fit: {evaluation.reason}")
    return chosen.with_predicted(evaluation.predicted()), evaluation, baselines, source


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
