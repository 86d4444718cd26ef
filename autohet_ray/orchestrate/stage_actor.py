"""Stage actors: one per GPU of a plan, each hosting the runtime Engine for its plan rank.

The torch process group rendezvouses through the driver: the driver asks rank 0's actor for an address and a
free port on its node, then sets every actor up with it (set up concurrently: init_process_group blocks until
all ranks join). The gloo/NCCL socket interface is set explicitly (loopback on a single-host cluster).
"""
from __future__ import annotations

import datetime
import os
import socket
import time

import ray
import torch


class StageActor:
    def __init__(self, rank: int):
        self.rank = rank
        self.engine = None
        self.pacer = None
        torch.set_num_threads(1)

    def where(self) -> dict:
        ctx = ray.get_runtime_context()
        return {"rank": self.rank, "node_id": ctx.get_node_id(), "ip": ray.util.get_node_ip_address(),
                "labels": dict(ctx.get_node_labels()), "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
                "pid": os.getpid(), "cuda": torch.cuda.is_available()}

    def free_port(self, loopback: bool) -> tuple[str, int]:
        """An address and a free TCP port on this node, for rank 0's rendezvous store."""
        addr = "127.0.0.1" if loopback else ray.util.get_node_ip_address()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((addr, 0))
            return addr, s.getsockname()[1]

    def setup(self, *, master_addr: str, master_port: int, world_size: int, plan: dict, model_spec: dict,
              socket_ifname: str | None, seed: int, lr: float, dtype: str, pacer: dict | None,
              collective_timeout_s: float) -> dict:
        """Join the process group and build the Engine for this rank. Returns the setup seconds."""
        import torch.distributed as dist

        from autohet_ray.model.spec import model_from_dict
        from autohet_ray.orchestrate.pacer import EmulationPacer
        from autohet_ray.plan.schema import plan_from_dict
        from autohet_ray.runtime.device import default_backend
        from autohet_ray.runtime.engine import Engine

        start = time.perf_counter()
        env = {"MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port), "RANK": str(self.rank),
               "WORLD_SIZE": str(world_size), "LOCAL_RANK": "0"}
        if socket_ifname:
            env.update(GLOO_SOCKET_IFNAME=socket_ifname, NCCL_SOCKET_IFNAME=socket_ifname)
        os.environ.update(env)
        backend = default_backend()
        if backend == "nccl":
            torch.cuda.set_device(0)         # Ray exposes this actor's GPU as device 0
        dist.init_process_group(backend, rank=self.rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=collective_timeout_s))
        self.pacer = EmulationPacer(**pacer) if pacer else None
        self.engine = Engine(plan=plan_from_dict(plan), model_spec=model_from_dict(model_spec), rank=self.rank,
                             seed=seed, lr=lr, dtype=getattr(torch, dtype), pacer=self.pacer)
        return {"rank": self.rank, "setup_s": time.perf_counter() - start, "backend": backend}

    def train_step(self, batch: dict) -> dict:
        out = self.engine.train_step(batch)
        out["rank"] = self.rank
        if self.pacer is not None:
            out["emulation"] = self.pacer.report()
        return out

    def state_dict(self) -> dict:
        return self.engine.state_dict()

    def close(self) -> None:
        import torch.distributed as dist
        if dist.is_initialized():
            dist.destroy_process_group()
