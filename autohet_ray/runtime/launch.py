"""Start N local processes joined by a torch.distributed group (gloo on loopback), for tests and benchmarks.

`run_world(fn, world_size, *args)` calls `fn(rank, world_size, *args)` in every process after
init_process_group and returns the list of their return values (rank order). A failure in any rank raises.
"""
from __future__ import annotations

import datetime
import os
import socket
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from autohet_ray.runtime.device import default_backend


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, fn, world_size: int, port: int, backend: str, threads: int, timeout_s: float,
            out_dir: str, args: tuple) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo",
                      NCCL_SOCKET_IFNAME="lo", RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    torch.set_num_threads(threads)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))
    try:
        result = fn(rank, world_size, *args)
        torch.save(result, os.path.join(out_dir, f"{rank}.pt"))
        dist.barrier()          # rank 0 hosts the store: nobody leaves while others may still need it
    finally:
        dist.destroy_process_group()
    # The result is saved. Leave without interpreter teardown: destroying gloo groups that engines still hold
    # can end in std::terminate (SIGABRT, "terminate called without an active exception") after a good run.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# Ranks fork from one server process that has imported torch and the runtime once (per calling process), instead
# of each spawned rank importing them again (about 2 s of CPU a rank). The server forks before any thread or
# CUDA context exists, so every rank starts as clean as a spawned one.
PRELOADED_MODULES = ["torch", "torch.distributed", "autohet_ray.runtime"]


def _start_method() -> str:
    mp.set_forkserver_preload(PRELOADED_MODULES)
    return "forkserver"


def run_world(fn, world_size: int, *args, backend: str | None = None, threads_per_rank: int = 1,
              timeout_s: float = 300.0) -> list:
    """Run `fn(rank, world_size, *args)` on `world_size` new processes; their results in rank order.

    `fn` must be importable by the children (a module-level function) and return something torch.save-able.
    """
    backend = backend or default_backend()
    with tempfile.TemporaryDirectory(prefix="autohet-world-") as out_dir:
        mp.start_processes(_worker, nprocs=world_size, join=True, start_method=_start_method(),
                           args=(fn, world_size, _free_port(), backend, threads_per_rank, timeout_s, out_dir,
                                 tuple(args)))
        return [torch.load(os.path.join(out_dir, f"{r}.pt"), weights_only=False) for r in range(world_size)]
