"""Measured profiles: time the real torch layers of `autohet_ray.nn` on the local device.

For each TP degree, one TP rank's shard is built from the plain modules with the split linears (and token
table) at their shard shapes (shards.py) and run locally, without the TP collectives: the cost model prices
those from the links. `autohet profile --local` then re-times compute and collectives in situ, as a step runs
them (runtime/in_situ_cost.py); profiling on Ray keeps these figures. Forward and
backward are timed separately (a few warm-up reps, then the fastest of the timed reps: the one least disturbed
by other work on the host; on a dedicated GPU the reps agree within a few percent, on a shared CPU the median
would measure the other processes). A process under a CFS quota (a testbed device: its cgroup's share of a core)
runs at full speed until its quota of a period is spent, then waits for the next: there each timed rep is the
mean of a block of reps spanning BLOCK_PERIODS periods, so it pays its share of the waits. Memory: parameter bytes of the shard, and the bytes autograd saves for
backward during the forward (counted through `torch.autograd.graph.saved_tensors_hooks`, each storage once, parameters excluded).
"""
from __future__ import annotations

import math
import platform
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from autohet_ray import ConfigError
import autohet_ray
from autohet_ray.model.costs import LAYER_KINDS
from autohet_ray.model.spec import ModelSpec
from autohet_ray.nn import Embedding, Head
from autohet_ray.nn.layers import Block
from autohet_ray.profile.db import LayerProfile, ProfileDB
from autohet_ray.profile.shards import build_shard

WARMUP_REPS = 2
TIMED_REPS = 7
BLOCK_PERIODS = 20          # a timed block under a CFS quota spans this many quota periods


def cpu_quota_period_s() -> float | None:
    """The CFS period (seconds) of this process's cgroup v1 cpu quota where it has one (a testbed device),
    else None."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            base = f"/sys/fs/cgroup/cpu{path}"
            try:
                with open(f"{base}/cpu.cfs_quota_us") as q, open(f"{base}/cpu.cfs_period_us") as p:
                    quota, period = int(q.read()), int(p.read())
            except OSError:
                return None
            return period / 1e6 if quota > 0 else None
    return None


def reps_per_block(rep_s: float, period_s: float | None) -> int:
    """How many reps of `rep_s` seconds one timed rep averages: 1 off a quota; enough to span BLOCK_PERIODS
    quota periods under one."""
    if period_s is None or rep_s <= 0:
        return 1
    return max(1, math.ceil(BLOCK_PERIODS * period_s / rep_s))


@dataclass(frozen=True, kw_only=True)
class _Timing:
    fwd_s: float
    bwd_s: float
    activation_bytes: int


def software_versions() -> dict:
    cuda = torch.version.cuda or "none"
    return {"torch": torch.__version__, "cuda": cuda, "python": platform.python_version(),
            "autohet_ray": autohet_ray.__version__}


class _SavedBytes:
    """Counts the distinct storages autograd saves for backward, excluding parameters."""

    def __init__(self, exclude: set[int]):
        self.exclude, self.seen, self.bytes = exclude, set(), 0

    def pack(self, t: torch.Tensor):
        key = t.untyped_storage().data_ptr()
        if key not in self.exclude and key not in self.seen:
            self.seen.add(key)
            self.bytes += t.untyped_storage().nbytes()
        return t

    @staticmethod
    def unpack(t):
        return t


def sync_device(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU), so a timer reads finished work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_module(run, inputs, device: torch.device, params: list[torch.Tensor]) -> _Timing:
    """`run(x) -> output`; `inputs()` gives a fresh input. Fastest forward and backward seconds. Gradients are
    kept between reps, so each backward adds into the gradients before it, as every micro-batch of a step but
    the first does (one more read and write of the weights' size)."""
    fwds, bwds, act = [], [], 0
    exclude = {p.untyped_storage().data_ptr() for p in params}
    period_s, block = cpu_quota_period_s(), 1
    for rep in range(WARMUP_REPS + TIMED_REPS):
        fwd = bwd = 0.0
        for _ in range(block):
            x = inputs()
            counter = _SavedBytes(exclude)
            sync_device(device)
            t0 = time.perf_counter()
            with torch.autograd.graph.saved_tensors_hooks(counter.pack, counter.unpack):
                out = run(x)
            sync_device(device)
            t1 = time.perf_counter()
            out.backward(torch.ones_like(out))
            sync_device(device)
            fwd, bwd = fwd + t1 - t0, bwd + time.perf_counter() - t1
        if rep == WARMUP_REPS - 1:
            block = reps_per_block((fwd + bwd) / block, period_s)
        elif rep >= WARMUP_REPS:
            fwds.append(fwd / block)
            bwds.append(bwd / block)
            act = counter.bytes
    return _Timing(fwd_s=min(fwds), bwd_s=min(bwds), activation_bytes=act)


def _param_bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def _measure_entry(spec: ModelSpec, tp: int, micro_batch: int, seq_len: int, device: torch.device,
                   dtype: torch.dtype) -> dict[str, LayerProfile]:
    embedding = build_shard(lambda: Embedding(spec), tp, device, dtype, spec.num_layers)
    block = build_shard(lambda: Block(spec), tp, device, dtype, spec.num_layers)
    head = build_shard(lambda: Head(spec), tp, device, dtype, spec.num_layers)
    local_vocab = spec.vocab_size // tp
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, local_vocab, (micro_batch, seq_len), generator=gen).to(device)
    shape = (micro_batch, seq_len, spec.hidden)
    hidden = lambda: torch.randn(shape, generator=gen).to(device, dtype).requires_grad_()  # noqa: E731
    head_loss = lambda x: F.cross_entropy(head(x).flatten(0, 1).float(), ids.flatten(), reduction="sum")  # noqa: E731
    runs = {"embedding": (embedding, lambda: ids, embedding), "layer": (block, hidden, block),
            "head": (head_loss, hidden, head)}
    out = {}
    for kind in LAYER_KINDS:
        run, inputs, owner = runs[kind]
        t = _time_module(run, inputs, device, list(owner.parameters()))
        out[kind] = LayerProfile(fwd_s=t.fwd_s, bwd_s=t.bwd_s, param_bytes=_param_bytes(owner),
                                 activation_bytes=t.activation_bytes)
    return out


def measure_profile(model_spec: ModelSpec, device_type: str, tps, micro_batches, seq_len: int,
                    device=None, dtype: torch.dtype | None = None) -> ProfileDB:
    """A measured ProfileDB with one entry per (tp, micro-batch) for `device_type` (links not measured here)."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    if seq_len < 1 or seq_len > model_spec.max_seq_len:
        raise ConfigError(f"seq_len={seq_len} must lie in [1, {model_spec.max_seq_len}] for {model_spec.name}")
    for tp in tps:
        model_spec.check_tp(tp)
    for mb in micro_batches:
        if mb < 1:
            raise ConfigError(f"micro-batch size {mb} must be >= 1")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    start = time.perf_counter()
    db = ProfileDB(kind="measured", model=model_spec.name, seq_len=seq_len)
    for tp in tps:
        for mb in micro_batches:
            db.entries[(device_type, tp, mb)] = _measure_entry(model_spec, tp, mb, seq_len, device, dtype)
    db.meta = {"source": f"measured on {device.type} ({name}), {dtype}, one TP rank's shard, without TP collectives",
               "device_name": name, "dtype": str(dtype).removeprefix("torch."), "versions": software_versions(),
               "profile_time_s": time.perf_counter() - start}
    return db


def parse_ints(text: str, what: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in str(text).split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"{what}={text!r} must be comma-separated positive integers, e.g. 1,2") from None
    if not values or min(values) < 1:
        raise ConfigError(f"{what}={text!r} must be comma-separated positive integers, e.g. 1,2")
    return values
