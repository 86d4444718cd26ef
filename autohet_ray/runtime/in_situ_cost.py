"""In-situ profile: what each layer kind costs as the runtime runs it, timed in a real group of ranks.

profile/measure.py times each kind alone: one rank, plain modules, torch's fused cross-entropy, the fastest
of a few reps. A step runs them otherwise, and on a CPU host the gap exceeds the cost model's error budget:
- every rank of a node computes at once, sharing the memory bus and caches;
- the last stage's loss is the runtime's vocabulary-parallel cross-entropy (runtime/vocab_ce.py);
- a step pays every op's typical time, not its luckiest;
- a TP group's collectives cost more than their bytes over the link: on a CPU host gloo's ranks wake each
  other through the kernel, a few ms per all-reduce on a VM.

So `ranks` spawned processes, joined by the runtime's backend, each build a first-and-last stage of a few
layers; with TP degree t, every t consecutive ranks form a TP group holding the runtime's own TP modules
(runtime/parallelize.py). Each rep runs a step's worth of micro-batches through the stage, each started together
on every rank, forward and backward, with a timestamp between the kinds (tensor hooks mark the backward's).
As in a step, the first backward allocates the gradients and the others add into them (on a CPU host a fresh
gradient costs its allocation's page faults). A rep's figure is its mean micro-batch. With t > 1 the
same shard shapes also run without collectives (profile/shards.py, the runtime's loss on the local
vocabulary), interleaved rep by rep so that both see the same host conditions. The layers run back to back,
so each op follows the one before, as in a step.

Per kind and direction, each rep's slowest TP group (a group's figure: the mean over its ranks; one rank when
t = 1), median over reps: compute = the stage without collectives (the runtime's own stage when t = 1);
collectives = the stage with them minus compute. Each rep also times the engine's update on every rank at
once (runtime/update_rate.py), the slowest rank's, median over reps.
"""
from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, replace
from typing import Callable

import torch
import torch.distributed as dist

from autohet_ray.model.costs import LAYER_KINDS
from autohet_ray.model.spec import ModelSpec, model_from_dict
from autohet_ray.nn import Embedding, Head
from autohet_ray.nn.layers import Block
from autohet_ray.profile.db import ProfileDB
from autohet_ray.profile.measure import sync_device
from autohet_ray.profile.shards import build_shard
from autohet_ray.runtime.device import resolve_device
from autohet_ray.runtime.launch import run_world
from autohet_ray.runtime.parallelize import build_stage_model
from autohet_ray.runtime.tp import TPContext
from autohet_ray.runtime.update_rate import UpdateTimer
from autohet_ray.runtime.vocab_ce import vocab_parallel_cross_entropy

WARMUP_REPS = 2
TIMED_REPS = 15
MICROBATCHES_PER_REP = 4
CHAIN_LAYERS = 4        # layers run back to back per micro-batch


@dataclass(kw_only=True)
class _Chain:
    """One micro-batch through embedding, a few layers and the loss, as a first-and-last stage runs it."""
    embedding: Callable
    layers: list[Callable]
    loss: Callable
    ids: torch.Tensor
    params: list[torch.Tensor]


@dataclass(frozen=True, kw_only=True)
class KindCost:
    """Seconds of one micro-batch of a layer kind on one rank (a layer's: per layer)."""
    compute_fwd_s: float
    compute_bwd_s: float
    tp_comm_fwd_s: float | None       # None at TP 1
    tp_comm_bwd_s: float | None



def _microbatch(chain: _Chain, device: torch.device) -> dict[str, tuple[float, float]]:
    """kind -> (forward, backward) seconds of one micro-batch started together on every rank; a layer's per
    layer."""
    marks = {}

    def mark(name: str) -> None:
        sync_device(device)
        marks[name] = time.perf_counter()

    sync_device(device)
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
    k = len(chain.layers)
    return {"embedding": (marks["f1"] - marks["f0"], marks["b3"] - marks["b2"]),
            "layer": ((marks["f2"] - marks["f1"]) / k, (marks["b2"] - marks["b1"]) / k),
            "head": (marks["f3"] - marks["f2"], marks["b1"] - marks["b0"])}


def _rep(chain: _Chain, device: torch.device) -> dict[str, tuple[float, float]]:
    """kind -> mean (forward, backward) seconds over a step's worth of micro-batches: the first backward
    allocates the gradients, the others add into them."""
    for p in chain.params:
        p.grad = None
    runs = [_microbatch(chain, device) for _ in range(MICROBATCHES_PER_REP)]
    return {kind: tuple(sum(run[kind][part] for run in runs) / len(runs) for part in (0, 1)) for kind in runs[0]}


def _chain_layers(spec: ModelSpec) -> int:
    return min(CHAIN_LAYERS, spec.num_layers)


def _runtime_chain(spec: ModelSpec, tp: TPContext, ids: torch.Tensor, device, dtype) -> _Chain:
    stage, _ = build_stage_model(spec, layers=(0, _chain_layers(spec)), first=True, last=True,
                                 tp=tp, seed=0, device=device, dtype=dtype)
    return _Chain(embedding=stage.embedding, layers=list(stage.layers.values()), ids=ids,
                  loss=lambda x: vocab_parallel_cross_entropy(stage.head(x), ids, tp=tp).sum(),
                  params=list(stage.parameters()))


def _bare_chain(spec: ModelSpec, tp_size: int, ids: torch.Tensor, device, dtype) -> _Chain:
    """The shard shapes of a `tp_size` rank without its collectives, the loss on the local vocabulary."""
    shard = lambda make: build_shard(make, tp_size, device, dtype, spec.num_layers)  # noqa: E731
    embedding, head = shard(lambda: Embedding(spec)), shard(lambda: Head(spec))
    blocks = [shard(lambda: Block(spec)) for _ in range(_chain_layers(spec))]
    local_ids = ids % (spec.vocab_size // tp_size)
    return _Chain(embedding=embedding, layers=blocks, ids=local_ids,
                  loss=lambda x: vocab_parallel_cross_entropy(head(x), local_ids, tp=TPContext()).sum(),
                  params=[p for m in (embedding, head, *blocks) for p in m.parameters()])


def _tp_context(rank: int, world_size: int, tp: int) -> TPContext:
    """Every `tp` consecutive ranks form a TP group (each rank creates every group, as torch requires)."""
    if tp == 1:
        return TPContext()
    groups = [dist.new_group(list(range(s, s + tp))) for s in range(0, world_size, tp)]
    return TPContext(size=tp, rank=rank % tp, group=groups[rank // tp])


class InSituTimer:
    """One rank's part of a TP degree's in-situ entry: the runtime's stage of a few layers and, with TP, the
    bare shards. `rep()` times one rep of each, back to back, on every rank of the world at once (so each rank
    of the world must build one, in the same order: the TP groups are created here)."""

    def __init__(self, rank: int, world_size: int, spec: ModelSpec, tp: int, micro_batch: int, seq_len: int,
                 dtype: torch.dtype):
        self.device = resolve_device(None)          # this rank's GPU under NCCL, else the CPU
        context = _tp_context(rank, world_size, tp)
        gen = torch.Generator().manual_seed(0)      # the same ids on every rank, as a stage's ranks get them
        ids = torch.randint(0, spec.vocab_size, (micro_batch, seq_len), generator=gen).to(self.device)
        self.chains = {"with": _runtime_chain(spec, context, ids, self.device, dtype)}
        if tp > 1:
            self.chains["without"] = _bare_chain(spec, tp, ids, self.device, dtype)

    def rep(self) -> dict[str, dict[str, tuple[float, float]]]:
        """label ("with", and "without" at TP > 1) -> kind -> mean (forward, backward) seconds of a
        micro-batch."""
        return {label: _rep(chain, self.device) for label, chain in self.chains.items()}


def _rank(rank: int, world_size: int, spec_dict: dict, tp: int, micro_batch: int, seq_len: int,
          dtype_name: str) -> dict:
    spec = model_from_dict(spec_dict)
    timer = InSituTimer(rank, world_size, spec, tp, micro_batch, seq_len, getattr(torch, dtype_name))
    update = UpdateTimer(spec, timer.device)
    times = {label: [] for label in timer.chains} | {"update_s": []}
    for rep in range(WARMUP_REPS + TIMED_REPS):
        seconds = timer.rep()
        update_s = update.rep()         # every rank updates at once, as a step's ranks do
        if rep >= WARMUP_REPS:
            for label in timer.chains:
                times[label].append(seconds[label])
            times["update_s"].append(update_s)
    return times | {"update_params": update.params}


def _median_of_slowest(per_rank: list[list], tp: int, figure: Callable[[object], float]) -> float:
    """Median over reps of the slowest TP group's `figure` in that rep, a group's figure being the mean over its
    ranks (one rank when t = 1). The slowest, not the typical: a step is synchronous (every hand-off between
    stages and every gradient sync waits for the slower side), so it pays the slowest of the devices computing
    at once. A group's mean, not its slowest rank: a collective ends together on every rank of a group, so a
    rank that waits for its peers counts the wait in the segment before, and the slowest rank of each segment
    would count every wait twice."""
    groups = [per_rank[s: s + tp] for s in range(0, len(per_rank), tp)]
    return statistics.median(max(sum(figure(rank[rep]) for rank in group) / tp for group in groups)
                             for rep in range(len(per_rank[0])))


def kind_costs(per_rank: list[dict[str, list]], tp: int) -> dict[str, KindCost]:
    """kind -> its in-situ cost, from every rank's timed reps (label -> [InSituTimer.rep()'s entry])."""
    with_tp = [r["with"] for r in per_rank]
    bare = [r["without"] for r in per_rank] if tp > 1 else with_tp
    out = {}
    for kind in LAYER_KINDS:
        compute = [_median_of_slowest(bare, tp, lambda rep: rep[kind][part]) for part in (0, 1)]
        comm = [max(0.0, _median_of_slowest(with_tp, tp, lambda rep: rep[kind][part]) - compute[part])
                for part in (0, 1)]
        out[kind] = KindCost(compute_fwd_s=compute[0], compute_bwd_s=compute[1],
                             tp_comm_fwd_s=comm[0] if tp > 1 else None, tp_comm_bwd_s=comm[1] if tp > 1 else None)
    return out


def update_s_per_param_in_situ(per_rank: list[dict]) -> float:
    """The update's seconds per parameter, from every rank's timed reps: the slowest rank's, median over reps."""
    return _median_of_slowest([r["update_s"] for r in per_rank], 1, lambda seconds: seconds) / \
        per_rank[0]["update_params"]


def measure_in_situ(spec: ModelSpec, tp: int, ranks: int, micro_batch: int, seq_len: int, dtype: torch.dtype,
                    backend: str) -> tuple[dict[str, KindCost], float]:
    """(kind -> its in-situ cost, the update's seconds per parameter) on `ranks` processes at once (a multiple
    of `tp`) of `backend` ("gloo": CPU ranks, one thread each; "nccl": one GPU per rank)."""
    assert ranks % tp == 0, (ranks, tp)
    results = run_world(_rank, ranks, spec.to_dict(), tp, micro_batch, seq_len, str(dtype).removeprefix("torch."),
                        backend=backend)
    return kind_costs(results, tp), update_s_per_param_in_situ(results)


def with_kind_costs(layers: dict, costs: dict[str, KindCost]) -> dict:
    """A profile entry (kind -> LayerProfile) with its compute and TP collectives replaced by in-situ costs."""
    return {kind: replace(p, fwd_s=costs[kind].compute_fwd_s, bwd_s=costs[kind].compute_bwd_s,
                          tp_comm_fwd_s=costs[kind].tp_comm_fwd_s, tp_comm_bwd_s=costs[kind].tp_comm_bwd_s)
            for kind, p in layers.items()}


def devices_on_host(device: torch.device) -> int:
    """Ranks this host can run one per device: its GPUs, or its CPU cores."""
    return torch.cuda.device_count() if device.type == "cuda" else os.cpu_count() or 1


def group_backend(device: torch.device, ranks: int) -> str | None:
    """The backend of a `ranks`-process group this host can run, or None: gloo with a CPU core per rank,
    NCCL with a GPU per rank."""
    if devices_on_host(device) < ranks:
        return None
    return "nccl" if device.type == "cuda" else "gloo"


def ranks_for(tp: int, ranks: int | None) -> int:
    """Processes to run a TP degree's entry on: `ranks` rounded down to a multiple of `tp`, at least `tp`."""
    return tp if ranks is None else max(tp, ranks - ranks % tp)


def add_in_situ_costs(db: ProfileDB, spec: ModelSpec, ranks: int | None = None, device=None) -> None:
    """Replace the compute of every entry of a local measured profile by its in-situ figure, and give TP
    entries their collectives' measured cost, where this host can run the group; the others keep the
    isolated compute of profile/measure.py and price TP collectives from the link. Where a group ran, the
    device type's update rate is the in-situ one (every rank updating at once; the median over the groups
    run). `db.meta` says which is which ("compute", "tp_collectives", "update")."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = getattr(torch, db.meta["dtype"])
    compute, collectives = db.meta.setdefault("compute", {}), db.meta.setdefault("tp_collectives", {})
    update_rates: dict[str, list[float]] = {}
    for (device_type, tp, micro_batch), layers in sorted(db.entries.items()):
        n = ranks_for(tp, ranks)
        backend = group_backend(device, n)
        if backend is None:
            compute[str(tp)] = f"isolated (one rank alone): this host cannot run {n} ranks on {device.type}"
            if tp > 1:
                collectives[str(tp)] = f"priced from the link: this host cannot run {n} ranks on {device.type}"
            continue
        costs, update_rate = measure_in_situ(spec, tp, n, micro_batch, db.seq_len, dtype, backend)
        db.entries[(device_type, tp, micro_batch)] = with_kind_costs(layers, costs)
        update_rates.setdefault(device_type, []).append(update_rate)
        compute[str(tp)] = (f"in situ: the runtime's stage of {_chain_layers(spec)} layers on {n} {backend} "
                            f"ranks at once, the slowest rank's (TP group's), median of {TIMED_REPS} reps")
        if tp > 1:
            collectives[str(tp)] = f"measured in {n // tp} {tp}-rank {backend} group(s)"
    for device_type, rates in update_rates.items():
        db.optimizer_s_per_param[device_type] = statistics.median(rates)
        db.meta["update"] = "in situ: every rank updating at once, the slowest rank's, median over reps"
