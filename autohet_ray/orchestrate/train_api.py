"""Ray Train glue: run an autohet job inside a `TorchTrainer`'s `train_loop_per_worker`, as deep as the CLI.

The driver asks for workers with `cluster_scaling_config(cluster)` (one worker per GPU of the cluster file,
each with a label selector for its GPU type) or `plan_scaling_config(plan)` (one per GPU of a fixed plan). In
the loop, `start_worker(job)` (every worker) plans from the workers Ray Train actually started (their nodes and
GPU types; the job's plan when given and it fits them, or the plan of the checkpoint being restored when the
workers are the same), gives each worker its plan role by where it is (Ray Train sorts ranks by node and GPU
id, so not by its rank), re-forms the torch process group so that the process rank equals the plan rank (torch
sorts the ranks of a sub-group, so a permuted sub-group is not possible), builds its Engine, opens the job's
data, and restores the newest checkpoint (or the job's Hugging Face weights at step 0). `TrainReporter.report`
(every worker, every step) sends every stage's figures through `ray.train.report`, with a checkpoint every
`checkpoint_every` steps and at once when Ray Train announces a preemption (train_checkpoint.py).

Only public Ray APIs: the preemption comes from `ray.train.get_preemption_info()` (Train V2), not from the
GCS drain state that the controller of the CLI path reads (elastic/spot.py).
"""
from __future__ import annotations

import datetime
import json
import os
import socket
from dataclasses import dataclass, replace

import ray
import ray.train
from ray.train import ScalingConfig
import torch
import torch.distributed as dist

from autohet_ray import ConfigError
from autohet_ray.cluster.labels import ACCELERATOR_LABEL, EMULATED_LABEL, NODE_NAME_LABEL, label_value
from autohet_ray.cluster.live import Discovered
from autohet_ray.cluster.spec import Cluster, Node, cluster_from_dict
from autohet_ray.data.training import TrainingData
from autohet_ray.job.config import TrainJob, compute_dtype, job_from_dict
from autohet_ray.metrics.step import worker_step_metrics
from autohet_ray.model.spec import ModelSpec, model_from_dict
from autohet_ray.orchestrate import train_checkpoint
from autohet_ray.orchestrate.train_checkpoint import checkpoint_manifest, restore_from_train_checkpoint
from autohet_ray.plan.roles import IDLE, WorkerPlace, assign_roles, nodes_of_places, plan_fits_places
from autohet_ray.plan.schema import Plan, plan_from_dict
from autohet_ray.runtime.engine import Engine
from autohet_ray.runtime.lr_schedule import OptimizerConfig

__all__ = ["TrainReporter", "WorkerPlace", "assign_roles", "cluster_scaling_config", "engine_for_worker",
           "plan_scaling_config", "report_step", "restore_from_train_checkpoint", "start_worker"]


def _scaling_config(per_worker: list[dict], *, use_gpu: bool, resources_per_worker: dict | None,
                    min_workers: int | None = None) -> ScalingConfig:
    num = len(per_worker) if min_workers is None else (min_workers, len(per_worker))
    return ScalingConfig(num_workers=num, use_gpu=use_gpu, resources_per_worker=resources_per_worker,
                         label_selector=per_worker)


def plan_scaling_config(plan: Plan, *, use_gpu: bool = True, resources_per_worker: dict | None = None,
                        pin_nodes: bool = True) -> ScalingConfig:
    """One worker per plan GPU; per-worker label selectors for its GPU type (and, with `pin_nodes`, its node)."""
    per_device = [stage for pipeline in plan.pipelines for stage in pipeline.stages for _ in stage.devices]
    return _scaling_config([{ACCELERATOR_LABEL: label_value(s.device_type)}
                            | ({NODE_NAME_LABEL: s.node} if pin_nodes else {}) for s in per_device],
                           use_gpu=use_gpu, resources_per_worker=resources_per_worker)


def cluster_scaling_config(cluster: Cluster, *, use_gpu: bool = True, resources_per_worker: dict | None = None,
                           pin_nodes: bool = False, min_workers: int | None = None) -> ScalingConfig:
    """One worker per GPU of `cluster`, each with a label selector for its GPU type (and, with `pin_nodes`,
    its node's autohet.io/node name); `start_worker` plans on the workers Ray Train then starts. With
    `min_workers`, Ray Train may start fewer (elastic: a restart after a lost node then re-plans on fewer);
    Ray Train then gives a group of n workers the first n selectors, in the cluster file's node order."""
    if min_workers is not None and not 1 <= min_workers <= cluster.num_gpus:
        raise ConfigError(f"min_workers={min_workers!r} must be between 1 and the cluster's {cluster.num_gpus} GPUs")
    return _scaling_config([{ACCELERATOR_LABEL: label_value(n.device)} | ({NODE_NAME_LABEL: n.name} if pin_nodes
                                                                           else {})
                            for n in cluster.nodes for _ in range(n.count)],
                           use_gpu=use_gpu, resources_per_worker=resources_per_worker, min_workers=min_workers)


def _my_place(rank: int) -> WorkerPlace:
    ctx = ray.get_runtime_context()
    labels = ctx.get_node_labels()
    gpus = [str(g) for g in ray.get_gpu_ids()]
    return WorkerPlace(train_rank=rank, node=labels.get(NODE_NAME_LABEL, f"node-{ctx.get_node_id()[:8]}"),
                       node_id=ctx.get_node_id(), device_type=labels.get(ACCELERATOR_LABEL),
                       gpu=gpus[0] if gpus else "", ip=ray.util.get_node_ip_address(),
                       emulated=labels.get(EMULATED_LABEL) == "true")


def gather_places() -> list[WorkerPlace]:
    """Collective: where every worker of the group is, by its Ray Train rank."""
    places: list = [None] * dist.get_world_size()
    dist.all_gather_object(places, _my_place(dist.get_rank()))
    return places


def _free_port(addr: str) -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def _form_plan_group(plan: Plan, places: list[WorkerPlace], num_layers: int, *, timeout_s: float,
                     allow_idle: bool) -> tuple[int, dist.TCPStore]:
    """Collective over Ray Train's process group: replace it by the plan's, whose ranks are plan ranks (the
    workers the plan leaves IDLE join none), and open the group's figures store (a torch TCPStore served by
    Ray Train rank 0, which every worker, idle or not, reaches). Returns (this worker's plan rank, the store)."""
    rank, size = dist.get_rank(), dist.get_world_size()
    roles = assign_roles(plan, places, num_layers, allow_idle=allow_idle)
    single_host = len({p.ip for p in places}) == 1
    host = lambda train_rank: "127.0.0.1" if single_host else places[train_rank].ip   # noqa: E731
    leader = roles.index(0)                 # plan rank 0 serves the plan group's rendezvous
    group_port = [_free_port(host(leader)) if rank == leader else 0]
    dist.broadcast_object_list(group_port, src=leader)
    store_port = [_free_port(host(0)) if rank == 0 else 0]
    dist.broadcast_object_list(store_port, src=0)
    backend = dist.get_backend()
    dist.barrier()
    dist.destroy_process_group()
    if single_host:
        os.environ.update(GLOO_SOCKET_IFNAME="lo", NCCL_SOCKET_IFNAME="lo")
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(host(0), store_port[0], size, rank == 0, timeout=timeout)
    plan_rank = roles[rank]
    if plan_rank != IDLE:
        dist.init_process_group(backend, init_method=f"tcp://{host(leader)}:{group_port[0]}", rank=plan_rank,
                                world_size=plan.num_devices, timeout=timeout)
    return plan_rank, store


def engine_for_worker(plan: Plan, model_spec: ModelSpec, *, seed: int = 0, lr: float | None = None, dtype=None,
                      pacer=None, timeout_s: float = 300.0, optimizer=None):
    """Inside `train_loop_per_worker`, with a plan that uses every worker (plan_scaling_config): this worker's
    Engine for its role in `plan` (collective: every worker calls it). After it returns, the default process
    group's ranks are plan ranks. `optimizer`: an OptimizerConfig (e.g. a TrainJob's) or a dict of its fields;
    `lr`, when given, replaces its rate; `dtype` None: bf16 on GPUs, fp32 on CPU."""
    if dist.get_world_size() != plan.num_devices:
        raise ConfigError(f"the plan uses {plan.num_devices} GPUs but Ray Train started {dist.get_world_size()} "
                          "workers")
    plan_rank, _ = _form_plan_group(plan, gather_places(), model_spec.num_layers, timeout_s=timeout_s,
                                    allow_idle=False)
    return _engine(plan, model_spec, plan_rank, seed=seed, lr=lr, dtype=dtype, pacer=pacer, optimizer=optimizer)


def _engine(plan, model_spec, plan_rank: int, *, seed, lr=None, dtype=None, pacer=None, optimizer=None) -> Engine:
    if isinstance(optimizer, dict):
        optimizer = OptimizerConfig.from_dict(optimizer)
    return Engine(plan=plan, model_spec=model_spec, rank=plan_rank, seed=seed, optimizer=optimizer, lr=lr,
                  dtype=dtype, pacer=pacer)


def _found_of(places: list[WorkerPlace], base: Cluster) -> Discovered:
    """The live cluster the workers make (their nodes, GPU types, GPUs per node), with the link figures and
    custom device types of the job's cluster file `base` (nodes it does not name get its fabric's figure)."""
    nodes = nodes_of_places(places)
    nic = {n.name: n.nic_gbps for n in base.nodes}
    cluster = Cluster(name=base.name, inter_node_gbps=base.inter_node_gbps, custom_devices=base.custom_devices,
                      nodes=tuple(Node(name=n.name, device=n.device_type, count=n.num_gpus,
                                       nic_gbps=nic.get(n.name, base.inter_node_gbps)) for n in nodes))
    for n in nodes:
        cluster.device(n.device_type)        # a ConfigError naming the known devices if unknown
    return Discovered(cluster=cluster, nodes=tuple(nodes))


def workers_summary(places: list[WorkerPlace]) -> list[list]:
    """The workers as a checkpoint records them: [node, GPU type, workers there] by node name."""
    return [[n.name, n.device_type, n.num_gpus] for n in nodes_of_places(places)]


def choose_worker_plan(job: TrainJob, places: list[WorkerPlace], *, restoring: dict | None) -> tuple[dict, str]:
    """On one worker: (plan dict, where it came from) for the workers at `places`. Restoring a checkpoint
    (`restoring`: its manifest's extra) saved by the same workers: its plan ("checkpoint"). Else the job's plan
    on a first start ("given"; it must fit the workers), else the planner's on these workers ("planned"), with
    the job's objective, schedules and profile, priced for `priced_as` when given."""
    from autohet_ray.job.plan_choice import choose_plan  # lazy: PySCIPOpt
    from autohet_ray.orchestrate.profiling import job_profile  # lazy: the measured profiler's Ray actors
    if job.profile == "measured":
        raise ConfigError("profile='measured' cannot run inside Ray Train (its workers hold the GPUs); measure "
                          "with `autohet profile` first and pass the profile DB .json")
    model = model_from_dict(job.model)
    if restoring is not None and restoring.get("workers") == workers_summary(places):
        return restoring["plan"], "checkpoint"
    given = job.plan if restoring is None else None
    if given is not None:
        plan_fits_places(plan_from_dict(given), places, model.num_layers, strict=True)
    priced = model_from_dict(job.priced_as) if job.priced_as else model
    seq_len = job.priced_seq_len or job.seq_len or model.max_seq_len
    found = _found_of(places, cluster_from_dict(job.cluster))
    profile = job_profile(job, found=found, priced_model=priced, cluster=found.cluster, seq_len=seq_len)
    plan, _, _, source = choose_plan(replace(job, baselines=False, plan=given), found=found, profile=profile,
                                     priced_model=priced, seq_len=seq_len, plan=None, first=True, cache={})
    executed = replace(plan, model=model.name, model_spec=model.to_dict(), seq_len=job.seq_len or model.max_seq_len)
    return executed.to_dict(), "given" if source == "job plan" else source


@dataclass
class WorkerStart:
    """What `start_worker` gives each worker."""
    plan: Plan
    plan_rank: int              # IDLE: the plan leaves this worker's GPU out; it only takes part in the reports
    engine: Engine | None       # None on an IDLE worker
    data: TrainingData | None   # None on an IDLE worker
    plan_source: str            # "checkpoint", "given" or "planned"
    restored: int | None        # the step restored from a checkpoint; None: started at step 0 (or the HF weights)
    workers: list               # workers_summary of the group
    store: dist.TCPStore        # the group's figures store (TrainReporter)

    @property
    def step(self) -> int:
        return self.restored or 0 if self.engine is None else self.engine.step


def start_worker(job: TrainJob, *, initial: ray.train.Checkpoint | None = None) -> WorkerStart:
    """Collective, at the start of `train_loop_per_worker` (every worker): plan on the workers Ray Train started
    (see choose_worker_plan), build this worker's Engine for its role (none for a worker the plan leaves out),
    open the job's data, and restore the newest checkpoint of this run (else `initial`, e.g. another run's),
    checking that its data position continues with this data; with nothing to restore, load the job's
    `init_from` Hugging Face weights (if any). `job`: a TrainJob or its dict."""
    if isinstance(job, dict):
        job = job_from_dict(job)
    places = gather_places()
    checkpoint = ray.train.get_checkpoint() or initial
    restoring = checkpoint_manifest(checkpoint).extra if checkpoint is not None else None
    choice: list = [choose_worker_plan(job, places, restoring=restoring) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(choice, src=0)
    plan, source = plan_from_dict(choice[0][0]), choice[0][1]
    model = model_from_dict(job.model)
    cuda = torch.cuda.is_available() and dist.get_backend() == "nccl"
    plan_rank, store = _form_plan_group(plan, places, model.num_layers, timeout_s=job.collective_timeout_s,
                                        allow_idle=True)
    start = WorkerStart(plan=plan, plan_rank=plan_rank, engine=None, data=None, plan_source=source,
                        restored=checkpoint_manifest(checkpoint).step if checkpoint is not None else None,
                        workers=workers_summary(places), store=store)
    if plan_rank == IDLE:
        return start
    start.engine = _engine(plan, model, plan_rank, seed=job.seed, optimizer=job.optimizer,
                           dtype=getattr(torch, compute_dtype(job.dtype, cuda=cuda)))
    start.data = TrainingData(data=job.data, model=model, global_batch=plan.global_batch, seq_len=plan.seq_len,
                              seed=job.seed)
    restored = restore_from_train_checkpoint(start.engine, initial=initial, data=start.data, init_from=job.init_from)
    assert restored == start.restored, (restored, start.restored)
    return start


def step_figures(payloads: list[dict]) -> dict:
    """The figures of one step from every plan rank's (worker_step_metrics plus its place and the loss): the
    loss, tokens/s, lr and grad norm, the MFU per GPU type (the mean over its ranks), and every stage's figures
    (its first TP rank's)."""
    first = payloads[0]
    stages: dict = {}
    by_type: dict[str, list[float]] = {}
    for m in payloads:
        stages.setdefault((m["pipeline"], m["stage"]), m)
        by_type.setdefault(m["device_type"], []).append(m["mfu"])
    keep = ("pipeline", "stage", "rank", "device_type", "step_s", "model_tflops", "mfu", "peak_memory_source",
            "peak_memory_bytes")
    return {k: first[k] for k in ("loss", "lr", "grad_norm", "step_s", "clock", "tokens_per_s")} | {
        "mfu_by_device_type": {t: sum(v) / len(v) for t, v in sorted(by_type.items())},
        "stages": [{k: m[k] for k in keep if k in m} for _, m in sorted(stages.items())]}


class TrainReporter:
    """Every worker, every step: `report(out)` (a plan rank, after its train_step) or `stand_by()` (an IDLE
    worker) sends the step's figures (step_figures: every stage's) through `ray.train.report`, the same dict
    from every worker, with a checkpoint every `checkpoint_every` steps (0: never) and at once on the first step
    after Ray Train announces a preemption of any node of the group (ray.train.get_preemption_info: the early
    flush a spot notice gets in the CLI path; Ray Train restarts the run from it once the node goes). Every
    checkpoint records the data position and the workers that saved it. Returns whether a checkpoint went."""

    def __init__(self, start: WorkerStart, *, checkpoint_every: int = 1, cluster=None,
                 watch_preemption: bool = True):
        train_checkpoint.check_checkpoint_every(checkpoint_every)
        self.start, self.checkpoint_every, self.cluster = start, checkpoint_every, cluster
        self.watch_preemption = watch_preemption
        self.flushed_for: set[str] = set()          # preempted nodes whose early flush is done
        self.preemption_flushes: list[int] = []     # the steps flushed early

    def _due(self, step: int) -> tuple[bool, bool]:
        """(checkpoint due, because of a preemption); the same on every worker."""
        preempted = False
        if self.watch_preemption:
            info = ray.train.get_preemption_info()       # a barrier: every worker calls it every step
            if info is not None and not set(info.preempted_node_ids) <= self.flushed_for:
                self.flushed_for |= set(info.preempted_node_ids)
                self.preemption_flushes.append(step)
                preempted = True
        every = self.checkpoint_every
        return preempted or (every > 0 and step % every == 0), preempted

    def _figures(self, step: int) -> dict:
        store, num = self.start.store, self.start.plan.num_devices
        return step_figures([json.loads(store.get(f"{step}/{r}")) for r in range(num)])

    def report(self, out: dict, *, metrics: dict | None = None) -> bool:
        engine, store = self.start.engine, self.start.store
        mine = worker_step_metrics(engine, out, cluster=self.cluster) | {
            "rank": engine.rank, "pipeline": engine.info.pipeline, "stage": engine.info.stage,
            "loss": float(out["loss"])}
        store.set(f"{engine.step}/{engine.rank}", json.dumps(mine))
        if engine.step > 2:                    # every worker has read step - 2 (it reported step - 1 since)
            store.delete_key(f"{engine.step - 2}/{engine.rank}")
        due, preempted = self._due(engine.step)
        figures = self._figures(engine.step) | ({"preemption_flush": True} if preempted else {})
        extra = {"workers": self.start.workers} | (self.start.data.state(engine.step) if self.start.data else {})
        return train_checkpoint.report_step(engine, out, checkpoint=due, metrics=figures | (metrics or {}),
                                            extra=extra)

    def stand_by(self, steps: int) -> None:
        """An IDLE worker: take part in every report of the steps up to `steps`."""
        for step in range(self.start.step + 1, steps + 1):
            due, preempted = self._due(step)
            figures = {"step": step} | self._figures(step) | ({"preemption_flush": True} if preempted else {})
            train_checkpoint.report_idle(figures, checkpoint=due)


def report_step(engine, out: dict, *, checkpoint_every: int = 1, metrics: dict | None = None, cluster=None) -> bool:
    """`ray.train.report` of one step of a plan that uses every worker (engine_for_worker), from every worker:
    this worker's figures (worker_step_metrics), with a checkpoint every `checkpoint_every` steps."""
    train_checkpoint.check_checkpoint_every(checkpoint_every)
    figures = worker_step_metrics(engine, out, cluster=cluster) | (metrics or {})
    due = checkpoint_every > 0 and engine.step % checkpoint_every == 0
    return train_checkpoint.report_step(engine, out, checkpoint=due, metrics=figures)
