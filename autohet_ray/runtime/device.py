"""Backend, device and dtype choice: gloo + CPU, NCCL + CUDA. Compute dtypes: bf16 (with fp32 master weights,
the default on CUDA), fp32 (the default on CPU), fp64 (exact comparisons in tests). fp16 is refused: it would
need loss scaling."""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

from autohet_ray import ConfigError

CPU_DTYPES = (torch.bfloat16, torch.float32, torch.float64)
CUDA_DTYPES = (torch.bfloat16, torch.float32, torch.float64)


def default_backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def resolve_device(device, group=None) -> torch.device:
    """The given device, else CUDA (this process's current device) under NCCL, else CPU."""
    if device is not None:
        return torch.device(device)
    if dist.get_backend(group) == "nccl":
        local = int(os.environ.get("LOCAL_RANK", torch.cuda.current_device()))
        return torch.device("cuda", local)
    return torch.device("cpu")


def resolve_dtype(dtype, device: torch.device) -> torch.dtype:
    """`dtype`, else bf16 on CUDA and fp32 on CPU; ConfigError for one the device cannot train in."""
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    allowed = CUDA_DTYPES if device.type == "cuda" else CPU_DTYPES
    if dtype not in allowed:
        raise ConfigError(f"dtype {dtype} is not supported on {device.type}; use one of {[str(d) for d in allowed]}")
    return dtype
