"""Ray Train glue: run a plan inside a `TorchTrainer`'s `train_loop_per_worker`.

`plan_scaling_config(plan)` asks for one worker per GPU of the plan, each with a label selector for its GPU
type (and node). Ray Train sorts worker ranks by node and GPU id, so `engine_for_worker(plan, spec)` assigns
each worker its plan role by where the worker actually is (its node, then its GPU id), not by its rank; it
then re-forms the torch process group so that the process rank equals the plan rank (torch sorts the ranks
of a sub-group, so a permuted sub-group is not possible), and returns this worker's Engine.
`restore_from_train_checkpoint(engine)` and `report_step(engine, out, checkpoint_every=N)` (train_checkpoint.py)
make the run resumable: after a restart of the worker group, or under another plan; `report_step` also reports
the step's lr, grad norm, tokens/s and this worker's MFU and peak memory (`worker_step_metrics`).
"""
from __future__ import annotations

import datetime
import os
import socket

import ray
from ray.train import ScalingConfig
import torch.distributed as dist

from autohet_ray import ConfigError
from autohet_ray.cluster.labels import ACCELERATOR_LABEL, NODE_NAME_LABEL, label_value
from autohet_ray.metrics.step import worker_step_metrics
from autohet_ray.model.spec import ModelSpec
from autohet_ray.orchestrate import train_checkpoint
from autohet_ray.orchestrate.train_checkpoint import restore_from_train_checkpoint
from autohet_ray.plan.roles import WorkerPlace, assign_roles
from autohet_ray.plan.schema import Plan
from autohet_ray.runtime.engine import Engine
from autohet_ray.runtime.lr_schedule import OptimizerConfig

__all__ = ["WorkerPlace", "assign_roles", "engine_for_worker", "plan_scaling_config", "report_step",
           "restore_from_train_checkpoint"]


def plan_scaling_config(plan: Plan, *, use_gpu: bool = True, resources_per_worker: dict | None = None,
                        pin_nodes: bool = True) -> ScalingConfig:
    """One worker per plan GPU; per-worker label selectors for its GPU type (and, with `pin_nodes`, its node)."""
    per_device = [stage for pipeline in plan.pipelines for stage in pipeline.stages for _ in stage.devices]
    selectors = [{ACCELERATOR_LABEL: label_value(s.device_type)} | ({NODE_NAME_LABEL: s.node} if pin_nodes else {})
                 for s in per_device]
    return ScalingConfig(num_workers=plan.num_devices, use_gpu=use_gpu, resources_per_worker=resources_per_worker,
                         label_selector=selectors)


def _my_place(rank: int) -> WorkerPlace:
    ctx = ray.get_runtime_context()
    labels = ctx.get_node_labels()
    gpus = [str(g) for g in ray.get_gpu_ids()]
    return WorkerPlace(train_rank=rank, node=labels.get(NODE_NAME_LABEL, f"node-{ctx.get_node_id()[:8]}"),
                       device_type=labels.get(ACCELERATOR_LABEL), gpu=gpus[0] if gpus else "",
                       ip=ray.util.get_node_ip_address())


def _free_port(addr: str) -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def engine_for_worker(plan: Plan, model_spec: ModelSpec, *, seed: int = 0, lr: float | None = None, dtype=None,
                      pacer=None, timeout_s: float = 300.0, optimizer=None):
    """Inside `train_loop_per_worker`: this worker's Engine for its role in `plan` (collective: every worker
    calls it). After it returns, the default process group's ranks are plan ranks. `optimizer`: an
    OptimizerConfig (e.g. a TrainJob's) or a dict of its fields; `lr`, when given, replaces its rate; `dtype`
    None: bf16 on GPUs, fp32 on CPU."""
    rank, size = dist.get_rank(), dist.get_world_size()
    if size != plan.num_devices:
        raise ConfigError(f"the plan uses {plan.num_devices} GPUs but Ray Train started {size} workers")
    me = _my_place(rank)
    places: list = [None] * size
    dist.all_gather_object(places, me)
    single_host = len({p.ip for p in places}) == 1
    addr = "127.0.0.1" if single_host else places[0].ip
    port = [_free_port(addr) if rank == 0 else 0]
    dist.broadcast_object_list(port, src=0)
    plan_rank = assign_roles(plan, places, model_spec.num_layers)[rank]
    backend = dist.get_backend()
    dist.barrier()
    dist.destroy_process_group()
    if single_host:
        os.environ.update(GLOO_SOCKET_IFNAME="lo", NCCL_SOCKET_IFNAME="lo")
    dist.init_process_group(backend, init_method=f"tcp://{addr}:{port[0]}", rank=plan_rank, world_size=size,
                            timeout=datetime.timedelta(seconds=timeout_s))
    if isinstance(optimizer, dict):
        optimizer = OptimizerConfig.from_dict(optimizer)
    return Engine(plan=plan, model_spec=model_spec, rank=plan_rank, seed=seed, optimizer=optimizer, lr=lr,
                  dtype=dtype, pacer=pacer)


def report_step(engine, out: dict, *, checkpoint_every: int = 1, metrics: dict | None = None, cluster=None) -> bool:
    """train_checkpoint.report_step with `worker_step_metrics` (then `metrics`) in the reported dict."""
    reported = worker_step_metrics(engine, out, cluster=cluster) | (metrics or {})
    return train_checkpoint.report_step(engine, out, checkpoint_every=checkpoint_every, metrics=reported)
