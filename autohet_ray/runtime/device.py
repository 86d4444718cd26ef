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


def node_gpu_id(index: int, visible: str | None) -> str:
    """The id of a node's `index`-th GPU as Ray names it: the entry of the node's CUDA_VISIBLE_DEVICES (`visible`,
    inherited from its raylet; unset: all its GPUs, named by index). A process that Ray gave no GPU and that sets
    CUDA_VISIBLE_DEVICES to it before CUDA starts has that GPU as its device 0, as a one-GPU actor has."""
    if not visible:
        return str(index)
    ids = [gpu.strip() for gpu in visible.split(",") if gpu.strip()]
    if not 0 <= index < len(ids):
        raise ValueError(f"GPU {index} of this node does not exist: its CUDA_VISIBLE_DEVICES is {visible!r} "
                         f"({len(ids)} GPU(s), 0 to {len(ids) - 1})")
    return ids[index]


def standby_gpu_indices(slots: list[dict], reuse: dict[str, list], real_gpu_nodes: frozenset[str]) -> dict[int, int]:
    """rank -> the GPU index on its node, for the new actors of a group that Ray gives no GPU, on real GPU nodes:
    on each node, in rank order, GPU 0, 1, ... (a node with reused actors, a joined one, gets no new actors)."""
    taken: dict[str, int] = {}
    out = {}
    for rank, slot in enumerate(slots):
        node = slot["node"]
        if node in real_gpu_nodes and not reuse.get(node):
            out[rank] = taken[node] = taken.get(node, -1) + 1
    return out


def join_device_cgroup(device_ids) -> str | None:
    """On a testbed node (its raylet's AUTOHET_DEVICE_CGROUPS: the node's cgroup v1 cpu directory, one `dev<i>`
    per device), move this process into the CPU cgroup of the one device Ray gave it, so it computes at that
    device's share; the path joined, or None off a testbed or for a process that takes no device.
    `device_ids`: a function giving the devices (Ray's get_gpu_ids), asked only on a testbed node."""
    root = os.environ.get("AUTOHET_DEVICE_CGROUPS")
    if not root:
        return None
    gpu_ids = device_ids()
    if not gpu_ids:
        return None
    if len(gpu_ids) != 1:
        raise RuntimeError(f"a testbed worker takes exactly one device; Ray gave it {gpu_ids}")
    path = os.path.join(root, f"dev{gpu_ids[0]}", "cgroup.procs")
    with open(path, "w") as f:                # cgroup v1: moves every thread of the process
        f.write(str(os.getpid()))
    return path


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
