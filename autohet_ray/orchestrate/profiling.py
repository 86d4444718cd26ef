"""Profiling as Ray work: once per GPU *type* (not per GPU), on actors in a STRICT_PACK placement group on one
node of that type, pinned with bundle label selectors. Layer times come from `profile.measure` (one TP rank's
shard per TP degree, so the cost does not grow with the number of GPUs of a type); with two GPUs in the group,
a gloo ping-pong between them measures the intra-node link; one more between GPUs on two nodes measures the
inter-node link (not cached: it depends on the nodes, not on a GPU type). Results are cached on disk keyed by
device type, model, sequence length, the TP degrees and micro-batches, and software versions.
"""
from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import platform
import socket
import time

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
import torch
import torch.distributed as dist

from autohet_ray.cluster.labels import ACCELERATOR_LABEL, NODE_ID_LABEL, label_value
from autohet_ray.cluster.live import Discovered, LiveNode
from autohet_ray.job.config import TrainJob
from autohet_ray.job.plan_choice import analytic_job_profile, job_micro_batches
from autohet_ray.model.spec import ModelSpec, model_from_dict
from autohet_ray.profile.db import LinkProfile, ProfileDB, load_profile, profile_from_dict
from autohet_ray.profile.link_probe import probe_link
from autohet_ray.profile.measure import measure_profile, software_versions
from autohet_ray.runtime.device import join_device_cgroup
from autohet_ray.runtime.update_rate import update_s_per_param


class PlacementError(RuntimeError):
    """The profiling actors could not be scheduled in time."""


TP_DEGREES = (1, 2, 4, 8)
MICRO_BATCHES = (1, 2, 4)
LINK_BYTES = 4 << 20


class ProfileActor:
    def __init__(self):
        torch.set_num_threads(1)
        join_device_cgroup(ray.get_gpu_ids)        # a testbed device computes at its CPU share

    def device_name(self) -> str:
        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else (platform.processor() or "cpu")

    def measure(self, spec: dict, device_type: str, tps: tuple, micro_batches: tuple, seq_len: int) -> dict:
        model = model_from_dict(spec)
        db = measure_profile(model, device_type, tps, micro_batches, seq_len)
        db.optimizer_s_per_param[device_type] = update_s_per_param(model)
        return db.to_dict()

    def free_port(self) -> tuple[str, int]:
        addr = ray.util.get_node_ip_address()
        with socket.socket() as s:
            s.bind((addr, 0))
            return addr, s.getsockname()[1]

    def ping_pong(self, rank: int, addr: str, port: int, num_bytes: int, reps: int = 20) -> dict:
        """LinkProfile fields of the link between this actor and its peer (profile/link_probe.py)."""
        dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=2,
                                timeout=datetime.timedelta(seconds=60))
        try:
            figures = probe_link(rank, num_bytes, reps)
        finally:
            dist.destroy_process_group()
        if torch.cuda.is_available():   # the runtime all-reduces with NCCL on the GPUs, not at gloo's host rate
            figures["allreduce_bandwidth_Bps"] = None
        return figures


@contextlib.contextmanager
def _placed_actors(selectors: list[dict], strategy: str, what: str, timeout_s: float):
    """One ProfileActor per label selector, in a placement group of one GPU each (actors and group removed on
    exit); PlacementError when `what` cannot be scheduled within the timeout."""
    group = placement_group([{"GPU": 1}] * len(selectors), strategy=strategy, bundle_label_selector=selectors)
    actors = []
    try:
        ready, _ = ray.wait([group.ready()], timeout=timeout_s)
        if not ready:
            raise PlacementError(f"profiling: {what} could not be scheduled in {timeout_s:.0f} s (GPUs busy?)")
        remote_cls = ray.remote(num_cpus=0, num_gpus=1)(ProfileActor)
        actors = [remote_cls.options(scheduling_strategy=PlacementGroupSchedulingStrategy(group, i)).remote()
                  for i in range(len(selectors))]
        yield actors
    finally:
        for actor in actors:
            ray.kill(actor)
        remove_placement_group(group)


def _link(a, b) -> LinkProfile:
    addr, port = ray.get(a.free_port.remote())
    r0, _ = ray.get([a.ping_pong.remote(0, addr, port, LINK_BYTES), b.ping_pong.remote(1, addr, port, LINK_BYTES)])
    return LinkProfile(**r0)


def _inter_link(found: Discovered, timeout_s: float) -> LinkProfile | None:
    """A gloo ping-pong between GPUs on the first two nodes (None on a one-node cluster)."""
    if len(found.nodes) < 2:
        return None
    a, b = found.nodes[:2]
    with _placed_actors([{NODE_ID_LABEL: n.node_id} for n in (a, b)], "STRICT_SPREAD",
                        f"one GPU on each of nodes {a.name} and {b.name}", timeout_s) as actors:
        return _link(*actors)


def cache_key(device_type: str, spec: ModelSpec, seq_len: int, tps, micro_batches) -> str:
    raw = json.dumps([device_type, spec.to_dict(), seq_len, list(tps), list(micro_batches), software_versions()],
                     sort_keys=True)
    return f"{label_value(device_type)}-{spec.name}-{hashlib.sha256(raw.encode()).hexdigest()[:16]}"


def _profile_type(node: LiveNode, spec: ModelSpec, seq_len: int, tps: tuple, micro_batches,
                  timeout_s: float) -> tuple[ProfileDB, dict]:
    """(this type's entries, with its intra-node link when the node has two GPUs; its "types" meta entry)."""
    size = min(2, node.num_gpus)
    selector = {ACCELERATOR_LABEL: label_value(node.device_type), NODE_ID_LABEL: node.node_id}
    with _placed_actors([selector] * size, "STRICT_PACK", f"{size}x {node.device_type} on node {node.name}",
                        timeout_s) as actors:
        name = ray.get(actors[0].device_name.remote())
        part = profile_from_dict(ray.get(actors[0].measure.remote(spec.to_dict(), node.device_type, tps,
                                                                  tuple(micro_batches), seq_len)))
        if size == 2:
            part.links[f"intra:{node.device_type}"] = _link(*actors)
        return part, {"node": node.name, "device_name": name, "cached": False}


def profile_cluster(found: Discovered, spec: ModelSpec, seq_len: int, *, micro_batches=MICRO_BATCHES,
                    cache_dir: str | None = None, timeout_s: float = 60.0) -> ProfileDB:
    """A measured ProfileDB for every GPU type of the live cluster (one node of each type is profiled)."""
    start = time.perf_counter()
    db = ProfileDB(kind="measured", model=spec.name, seq_len=seq_len,
                   meta={"versions": software_versions(), "types": {}})
    for device_type in dict.fromkeys(n.device_type for n in found.nodes):
        node = max((n for n in found.nodes if n.device_type == device_type), key=lambda n: n.num_gpus)
        tps = tuple(t for t in TP_DEGREES if t <= node.num_gpus and spec.valid_tp(t))
        path = os.path.join(cache_dir, cache_key(device_type, spec, seq_len, tps, micro_batches) + ".json") \
            if cache_dir else None
        t0 = time.perf_counter()
        if path and os.path.exists(path):
            with open(path) as f:
                cached = json.load(f)
            part, info = profile_from_dict(cached["profile"]), cached["info"] | {"cached": True}
        else:
            part, info = _profile_type(node, spec, seq_len, tps, micro_batches, timeout_s)
            if path:
                os.makedirs(cache_dir, exist_ok=True)
                with open(path, "w") as f:
                    json.dump({"profile": part.to_dict(), "info": info}, f)
        info["seconds"] = time.perf_counter() - t0
        db.entries.update(part.entries)
        db.links.update(part.links)
        db.optimizer_s_per_param.update(part.optimizer_s_per_param)
        db.meta["types"][device_type] = info
        dtype = part.meta.get("dtype")
        if dtype is not None:               # the dtype the cost model prices: every type's must agree
            assert db.meta.setdefault("dtype", dtype) == dtype, (device_type, dtype, db.meta["dtype"])
    t0 = time.perf_counter()
    inter = _inter_link(found, timeout_s)
    if inter is not None:
        db.links["inter"] = inter
        db.meta["inter_link"] = {"nodes": [n.name for n in found.nodes[:2]], "seconds": time.perf_counter() - t0}
    db.meta["profile_time_s"] = time.perf_counter() - start
    db.meta["source"] = "measured on Ray placement-group actors, one node per GPU type"
    return db


def job_profile(job: TrainJob, *, found: Discovered, priced_model: ModelSpec, cluster, seq_len: int) -> ProfileDB:
    """The job's ProfileDB (analytic, measured on the cluster, or a file), made once per job (every re-plan
    prices with it)."""
    if job.profile == "analytic":
        return analytic_job_profile(job, priced_model=priced_model, cluster=cluster, seq_len=seq_len,
                                    cuda=not found.emulated)
    if job.profile == "measured":
        return profile_cluster(found, priced_model, seq_len, micro_batches=job_micro_batches(job),
                               cache_dir=job.profile_cache)
    return load_profile(job.profile)
