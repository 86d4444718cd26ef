"""Measured TP collectives: the seconds a TP group's collectives add to each layer kind, timed in a real group.

profile/measure.py times one rank's shard alone. What its collectives cost on top is not always their bytes
over the link: on a CPU host, gloo's ranks wake each other through the kernel, and every all-reduce pays that
wake-up (a few ms on a VM, varying with the host). So for a TP degree t, t spawned processes joined by the
runtime's backend build the runtime's own TP modules (runtime/parallelize.py: column- and row-parallel
linears, the vocabulary-parallel embedding and cross-entropy) into a first-and-last stage of a few layers.
Each rep runs one micro-batch through it, forward and backward, with a timestamp between the kinds (tensor
hooks mark the backward's), and then through the same shard shapes without collectives (profile/shards.py).
The layers run back to back, so each collective follows the one before, as in a step.

A kind's collectives cost the difference of the two medians, each over reps of the slowest rank. It is the
median, not the fastest rep (profile/measure.py's choice for compute), because a step pays every collective's
typical wake-up; the fastest rep would keep only the lucky ones.
"""
from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, replace
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from autohet_ray.model.costs import LAYER_KINDS
from autohet_ray.model.spec import ModelSpec, model_from_dict
from autohet_ray.nn import Embedding, Head
from autohet_ray.nn.layers import Block
from autohet_ray.profile.db import ProfileDB
from autohet_ray.profile.shards import build_shard
from autohet_ray.runtime.device import resolve_device
from autohet_ray.runtime.launch import run_world
from autohet_ray.runtime.parallelize import build_stage_model
from autohet_ray.runtime.tp import TPContext
from autohet_ray.runtime.vocab_ce import vocab_parallel_cross_entropy

WARMUP_REPS = 3
TIMED_REPS = 31
CHAIN_LAYERS = 4        # layers run back to back per rep, so that the collectives follow each other as in a step


@dataclass(kw_only=True)
class _Chain:
    """One micro-batch through embedding, a few layers and the loss, as a first-and-last stage runs it."""
    embedding: Callable
    layers: list[Callable]
    loss: Callable
    ids: torch.Tensor
    params: list[torch.Tensor]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _segments(chain: _Chain, device: torch.device) -> dict[str, tuple[float, float]]:
    """kind -> (forward, backward) seconds of one rep started together on every rank; a layer's per layer."""
    marks = {}

    def mark(name: str) -> None:
        _sync(device)
        marks[name] = time.perf_counter()

    _sync(device)
    dist.barrier()
    mark("f0")
    first = chain.embedding(chain.ids)
    mark("f1")
    last = first
    for layer in chain.layers:
        last = layer(last)
    mark("f2")
    loss = chain.loss(last)
    mark("f3")
    last.register_hook(lambda grad: mark("b1"))      # the head's backward is done
    first.register_hook(lambda grad: mark("b2"))     # the layers' backward is done
    mark("b0")
    loss.backward()
    mark("b3")
    for p in chain.params:
        p.grad = None
    k = len(chain.layers)
    return {"embedding": (marks["f1"] - marks["f0"], marks["b3"] - marks["b2"]),
            "layer": ((marks["f2"] - marks["f1"]) / k, (marks["b2"] - marks["b1"]) / k),
            "head": (marks["f3"] - marks["f2"], marks["b1"] - marks["b0"])}


def _chains(spec: ModelSpec, tp: TPContext, micro_batch: int, seq_len: int, device, dtype) -> tuple[_Chain, _Chain]:
    """(the runtime's TP stage, the same shard shapes without collectives)."""
    k = min(CHAIN_LAYERS, spec.num_layers)
    stage, _ = build_stage_model(spec, layers=(0, k), first=True, last=True, tp=tp, seed=0, device=device,
                                 dtype=dtype)
    gen = torch.Generator().manual_seed(0)          # the same ids on every rank, as a stage's ranks get them
    ids = torch.randint(0, spec.vocab_size, (micro_batch, seq_len), generator=gen).to(device)
    with_tp = _Chain(embedding=stage.embedding, layers=list(stage.layers.values()), ids=ids,
                     loss=lambda x: vocab_parallel_cross_entropy(stage.head(x), ids, tp=tp).sum(),
                     params=list(stage.parameters()))
    shard = lambda make: build_shard(make, tp.size, device, dtype, spec.num_layers)  # noqa: E731
    embedding, head = shard(lambda: Embedding(spec)), shard(lambda: Head(spec))
    blocks = [shard(lambda: Block(spec)) for _ in range(k)]
    local_ids = ids % (spec.vocab_size // tp.size)
    bare = _Chain(embedding=embedding, layers=blocks, ids=local_ids,
                  loss=lambda x: F.cross_entropy(head(x).flatten(0, 1).float(), local_ids.flatten(), reduction="sum"),
                  params=[p for m in (embedding, head, *blocks) for p in m.parameters()])
    return with_tp, bare


def _rank(rank: int, world_size: int, spec_dict: dict, micro_batch: int, seq_len: int, dtype_name: str) -> dict:
    spec, dtype = model_from_dict(spec_dict), getattr(torch, dtype_name)
    device = resolve_device(None)                   # this rank's GPU under NCCL, else the CPU
    tp = TPContext(size=world_size, rank=rank, group=dist.group.WORLD)
    chains = dict(zip(("with", "without"), _chains(spec, tp, micro_batch, seq_len, device, dtype)))
    times = {label: [] for label in chains}
    for rep in range(WARMUP_REPS + TIMED_REPS):
        for label, chain in chains.items():          # interleaved: both see the same host conditions
            seconds = _segments(chain, device)
            if rep >= WARMUP_REPS:
                times[label].append(seconds)
    return times


def _slowest_median(per_rank: list[list[dict]], kind: str, part: int) -> float:
    reps = range(len(per_rank[0]))
    return statistics.median(max(rank[rep][kind][part] for rank in per_rank) for rep in reps)


def measure_tp_collectives(spec: ModelSpec, tp: int, micro_batch: int, seq_len: int,
                           dtype: torch.dtype, backend: str) -> dict[str, tuple[float, float]]:
    """kind -> (seconds the collectives add to one micro-batch's forward, to its backward), in a `tp`-rank
    group of `backend` ("gloo": CPU ranks, one thread each; "nccl": one GPU per rank)."""
    assert tp > 1, tp
    results = run_world(_rank, tp, spec.to_dict(), micro_batch, seq_len, str(dtype).removeprefix("torch."),
                        backend=backend)
    with_tp, bare = [r["with"] for r in results], [r["without"] for r in results]
    return {kind: tuple(max(0.0, _slowest_median(with_tp, kind, part) - _slowest_median(bare, kind, part))
                        for part in (0, 1))
            for kind in LAYER_KINDS}


def tp_group_backend(device: torch.device, tp: int) -> str | None:
    """The backend of a `tp`-rank group this host can run, or None: gloo with a CPU core per rank, NCCL with
    a GPU per rank."""
    if device.type == "cuda":
        return "nccl" if torch.cuda.device_count() >= tp else None
    return "gloo" if (os.cpu_count() or 1) >= tp else None


def add_measured_tp_collectives(db: ProfileDB, spec: ModelSpec, device=None) -> None:
    """Give every TP entry of a local measured profile its collectives' measured cost where this host can run
    the group; the others stay priced from the link. `db.meta["tp_collectives"]` says which is which."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = getattr(torch, db.meta["dtype"])
    how = db.meta.setdefault("tp_collectives", {})
    for (device_type, tp, micro_batch), layers in sorted(db.entries.items()):
        if tp == 1:
            continue
        backend = tp_group_backend(device, tp)
        if backend is None:
            how[str(tp)] = f"priced from the link: this host cannot run {tp} ranks on {device.type}"
            continue
        added = measure_tp_collectives(spec, tp, micro_batch, db.seq_len, dtype, backend)
        db.entries[(device_type, tp, micro_batch)] = {
            kind: replace(p, tp_comm_fwd_s=added[kind][0], tp_comm_bwd_s=added[kind][1])
            for kind, p in layers.items()}
        how[str(tp)] = f"measured in a {tp}-rank {backend} group"
