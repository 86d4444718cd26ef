"""The figures of one training step, from every worker's report: loss, learning rate and grad norm (before
clipping), speed measured vs predicted (emulated figures say so, in emulated seconds), tokens/s, MFU per GPU
type, peak memory per device, snapshot and data waits, the samples consumed and the pacer's overruns.

Model FLOPs (for MFU) come from model/costs.py: per token and layer 2 x (matmul parameters) + 4·s·h for QK^T
and AV (full s x s, no causal halving), the head's 2·h·V, the embedding 0; forward + backward = 3 x forward.
Recomputation is not counted (it is hardware work, not model work). A GPU type's achieved FLOPs are the
FLOPs of the layers its stages hold times the samples their pipelines processed, over the step time, split
evenly across the TP ranks of each stage; its MFU divides that per GPU by the catalog's dense peak for the
dtype the workers compute in (bf16: bf16_tflops; fp32, and fp64 used for exact comparisons: fp32_tflops).
"""
from __future__ import annotations

from typing import Callable

from autohet_ray.cluster.catalog import lookup
from autohet_ray.model.costs import layer_flops_per_token
from autohet_ray.profile.precision import precision

FLOPS_SOURCE = "model/costs.py layer FLOPs x3 (fwd+bwd), no recompute"
CUDA_PEAK_SOURCE = "torch.cuda.max_memory_allocated (reset each step)"
NO_PEAK_SOURCE = "none: CPU ranks have no per-step peak (None, not measured)"


def stage_flops_per_sample(spec, stage, seq_len: int, *, last: bool) -> float:
    """Model FLOPs (forward + backward) of one sample through `stage`'s layers (and the head when `last`)."""
    per_token = stage.num_layers * layer_flops_per_token(spec, "layer", seq_len)
    if last:
        per_token += layer_flops_per_token(spec, "head", seq_len)
    return 3.0 * per_token * seq_len


def flops_by_device_type(plan, spec, seq_len: int) -> dict[str, tuple[float, int]]:
    """Device type -> (model FLOPs its GPUs compute in one step, its GPUs in the plan)."""
    out: dict[str, tuple[float, int]] = {}
    for k, pipeline in enumerate(plan.pipelines):
        samples = plan.samples_of(k)
        for i, stage in enumerate(pipeline.stages):
            flops = samples * stage_flops_per_sample(spec, stage, seq_len, last=i == len(pipeline.stages) - 1)
            total, gpus = out.get(stage.device_type, (0.0, 0))
            out[stage.device_type] = (total + flops, gpus + stage.tp)
    return out


def peak_dtype(dtype: str) -> str:
    """The catalog peak a compute dtype is measured against ("float64" runs are priced as fp32)."""
    name = str(dtype).removeprefix("torch.")
    return "float32" if name == "float64" else precision(name).dtype


def throughput(plan, spec, seq_len: int, *, global_batch: int, step_s: float, dtype: str,
               device: Callable[[str], object]) -> dict:
    """tokens/s, overall MFU and, per GPU type, achieved model TFLOPS per GPU and MFU; `device(name)` is the
    catalog (or custom) DeviceType of a type name."""
    assert step_s > 0, step_s
    prec = precision(peak_dtype(dtype))
    by_type = flops_by_device_type(plan, spec, seq_len)
    tflops = {t: flops / gpus / step_s / 1e12 for t, (flops, gpus) in by_type.items()}
    peaks = {t: prec.peak_tflops(device(t)) for t in by_type}
    total_peak = sum(peaks[t] * gpus for t, (_, gpus) in by_type.items())
    total_tflops = sum(flops for flops, _ in by_type.values()) / step_s / 1e12
    return {"tokens_per_s": global_batch * seq_len / step_s, "mfu": total_tflops / total_peak,
            "mfu_by_device_type": {t: tflops[t] / peaks[t] for t in by_type},
            "model_tflops_per_gpu_by_device_type": tflops, "mfu_peak_dtype": prec.dtype,
            "flops_source": FLOPS_SOURCE}


def peak_memory(outs: list[dict]) -> dict:
    """Per device ("node:gpu") the step's peak allocated bytes as the workers measured them (None on CPU)."""
    per_device = {o["device"]: o.get("peak_memory_bytes") for o in outs if "device" in o}
    measured = any(v is not None for v in per_device.values())
    return {"peak_memory_bytes_per_device": per_device,
            "peak_memory_source": CUDA_PEAK_SOURCE if measured else NO_PEAK_SOURCE}


def step_metrics(outs: list[dict], wall: float, *, step: int, job, evaluation, profile_kind: str,
                 time_scale: float, data_wait_s: float, plan=None, spec=None, seq_len: int | None = None,
                 device: Callable[[str], object] | None = None) -> dict:
    """`plan`, `spec`, `seq_len` and `device` (the cluster's device lookup): what the step's model FLOPs are
    counted on (emulated runs: the priced model, whose times the clock emulates); without them no MFU."""
    scale = time_scale if job.paced else 1.0
    m = {"step": step, "loss": outs[0]["loss"], "lr": outs[0]["lr"], "grad_norm": outs[0]["grad_norm"],
         "wall_s": wall, "emulated": job.paced, "time_scale": scale, "iteration_s": wall / scale,
         "clock": "emulated" if job.paced else "wall",
         "samples_per_s": job.global_batch / (wall / scale), "predicted_iteration_s": evaluation.iteration_time_s,
         "predicted_samples_per_s": evaluation.samples_per_s, "profile_kind": profile_kind,
         "snapshot_copy_s": max(o.get("snapshot_copy_s", 0.0) for o in outs),
         "snapshot_wait_s": max(o.get("snapshot_wait_s", 0.0) for o in outs),
         "compute_s": max(o["timings"]["step"] for o in outs), "data_wait_s": data_wait_s}
    if plan is not None:
        m |= throughput(plan, spec, seq_len, global_batch=job.global_batch, step_s=m["iteration_s"],
                        dtype=outs[0]["dtype"], device=device)
    m |= peak_memory(outs)
    if any("sample_ids" in o for o in outs):             # each pipeline's first stage reports its samples
        m["sample_ids"] = sorted(i for o in outs for i in o.get("sample_ids", ()))
    if job.paced:
        by_op: dict[str, int] = {}
        for o in outs:
            for op, n in o["emulation"]["overruns"].items():
                by_op[op] = by_op.get(op, 0) + n
        m |= {"overruns": sum(by_op.values()), "overruns_by_op": by_op,
              "overrun_s": max(o["emulation"]["overrun_s"] for o in outs),
              "op_seconds_max": {op: max(o["timings"].get(op, 0.0) for o in outs) for op in outs[0]["timings"]},
              "critical_rank": critical_rank(outs, scale)}
    return m


def run_figures(history: list[dict], emulated: bool, global_batch: int) -> dict:
    """A run's final loss and its steady-state iteration (the median past the first, warm-up step), measured
    and predicted."""
    if not history:
        return {"emulated": emulated}
    steady = history[1:] or history
    measured = sorted(m["iteration_s"] for m in steady)[len(steady) // 2]
    return {"final_loss": history[-1]["loss"], "measured_iteration_s": measured,
            "predicted_iteration_s": history[-1]["predicted_iteration_s"],
            "measured_samples_per_s": global_batch / measured,
            "predicted_samples_per_s": history[-1]["predicted_samples_per_s"], "emulated": emulated}


def critical_rank(outs: list[dict], scale: float) -> dict:
    """The paced rank whose step took longest: its pacer phases and flush wait in emulated seconds."""
    o = max(outs, key=lambda o: o["timings"]["step"])
    return {"rank": o["rank"], "step_s": o["timings"]["step"] / scale,
            "flush_s": o["timings"].get("flush", 0.0) / scale,
            **{k: v / scale for k, v in o["emulation"]["phases"].items()}}


def start_peak_memory(engine) -> None:
    """Reset the CUDA allocator's peak before a step (no-op on CPU)."""
    import torch  # lazy: torch; metrics/ imports without it
    if engine.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(engine.device)


def rank_measurements(engine) -> dict:
    """What a rank adds to its step report: its device ("node:gpu", as plans key devices), its compute dtype
    and its peak allocated bytes since start_peak_memory (None on CPU: no per-step peak is measured there)."""
    import torch  # lazy: torch; metrics/ imports without it
    info = engine.info
    cuda = engine.device.type == "cuda"
    return {"device": f"{info.node}:{info.device}", "dtype": str(engine.dtype).removeprefix("torch."),
            "peak_memory_bytes": int(torch.cuda.max_memory_allocated(engine.device)) if cuda else None}


def worker_step_metrics(engine, out: dict, *, cluster=None) -> dict:
    """One worker's figures of the step `out` (engine.train_step's result), on the wall clock of its step:
    lr, grad norm, tokens/s of the global batch, model TFLOPS and MFU of this worker's GPU (its stage's
    layers x its pipeline's samples, split over the stage's TP ranks, vs the catalog peak for the compute
    dtype; `cluster` resolves custom device types), and its peak allocated bytes since the last report (CUDA
    only; left out on CPU). Resets the CUDA peak for the next step."""
    plan, info, step_s = engine.plan, engine.info, out["timings"]["step"]
    pipeline = plan.pipelines[info.pipeline]
    stage = pipeline.stages[info.stage]
    flops = plan.samples_of(info.pipeline) * stage_flops_per_sample(
        engine.spec, stage, plan.seq_len, last=info.stage == len(pipeline.stages) - 1) / stage.tp
    device = cluster.device(stage.device_type) if cluster is not None else lookup(stage.device_type)
    measured = rank_measurements(engine)
    start_peak_memory(engine)
    tflops = flops / step_s / 1e12
    m = {"lr": float(out["lr"]), "grad_norm": float(out["grad_norm"]), "step_s": step_s, "clock": "wall",
         "tokens_per_s": sum(plan.samples_of(k) for k in range(len(plan.pipelines))) * plan.seq_len / step_s,
         "device_type": stage.device_type, "model_tflops": tflops,
         "mfu": tflops / precision(peak_dtype(measured["dtype"])).peak_tflops(device),
         "peak_memory_source": NO_PEAK_SOURCE if measured["peak_memory_bytes"] is None else CUDA_PEAK_SOURCE}
    if measured["peak_memory_bytes"] is not None:
        m["peak_memory_bytes"] = measured["peak_memory_bytes"]
    return m
