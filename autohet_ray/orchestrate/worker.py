"""The worker actor: one per plan rank, hosting the runtime Engine, snapshotting its shards into its node's
store and a peer node's store (elastic jobs: every step) and the durable storage (every N steps; plain jobs
write there directly), and restoring its chunks of a saved step from the cheapest tier that holds them.

A threaded actor (max_concurrency=3): `fast_records(step)` answers while the next `train_step` computes, so
the controller commits a step's manifest without stalling compute. `where()` (health pings) and
`abort_collectives()` run in their own "control" threads, so they answer even when every other thread waits.
"""
from __future__ import annotations

import ctypes
import datetime
import gc
import os
import threading
import time

import ray
import torch
import torch.distributed as dist

from autohet_ray import label_records
from autohet_ray.checkpoint import AsyncSnapshotter, Manifest, SnapshotPolicy, restore
from autohet_ray.checkpoint.codec import digest, encode
from autohet_ray.checkpoint.errors import ChunkUnavailableError
from autohet_ray.checkpoint.hf_weights import load_rank_state
from autohet_ray.checkpoint.tiers.base import put_all
from autohet_ray.elastic.tiers import build_tier
from autohet_ray.emulate.pacer import EmulationPacer
from autohet_ray.job.config import compute_dtype
from autohet_ray.layout import Chunk, overlap, to_local
from autohet_ray.metrics.step import rank_measurements, start_peak_memory
from autohet_ray.model.spec import model_from_dict
from autohet_ray.plan.schema import plan_from_dict
from autohet_ray.runtime.abort import collective_abort
from autohet_ray.runtime.device import default_backend, join_device_cgroup, node_gpu_id
from autohet_ray.runtime.engine import Engine
from autohet_ray.runtime.lr_schedule import OptimizerConfig

_MALLOC_TRIM = getattr(ctypes.CDLL(None), "malloc_trim", None)     # glibc's; absent elsewhere (musl)


def release_host_memory() -> None:
    """Give the dropped engine's host memory back to the system before the next plan's engine is built: its
    modules, hooks and optimizer refer to each other (cycles, freed only by the collector), and glibc may keep
    the freed heap pages of tensors below its mmap threshold until trimmed. (The leak a reused worker had, about
    one state size per recovery, was the engine kept alive: Engine.release.)"""
    gc.collect()
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def holdings_of(engine) -> list[tuple[str, Chunk, int]]:
    """(name, chunk, bytes) of everything this rank's snapshots store (for place_copies): the engine's own
    list, where sharded optimizer state is this rank's slices only."""
    return engine.snapshot_holdings()


class Worker:
    def __init__(self, rank: int, gpu_index: int | None = None):
        """`gpu_index`: a standby worker's GPU on a real node (Ray gives it none): its device 0, before CUDA starts."""
        if gpu_index is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = node_gpu_id(gpu_index, os.environ.get("CUDA_VISIBLE_DEVICES"))
        self.rank, self.engine, self.snapshotter, self.pacer, self.pinned_gpu = rank, None, None, None, gpu_index
        self.handles: dict = {}          # step -> SnapshotHandle; threads share it: only under _handles_lock
        self._handles_lock = threading.Lock()
        self._copy_wait_s = 0.0
        torch.set_num_threads(1)
        self.device_cgroup = join_device_cgroup(ray.get_gpu_ids) if gpu_index is None else None

    @ray.method(concurrency_group="control")
    def where(self) -> dict:
        ctx = ray.get_runtime_context()
        return {"rank": self.rank, "node_id": ctx.get_node_id(), "pid": os.getpid(),
                "labels": dict(ctx.get_node_labels()), "cuda": torch.cuda.is_available(),
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "device_cgroup": self.device_cgroup}

    def host_store(self, world_size: int, timeout_s: float, loopback: bool = True) -> tuple[str, int]:
        """Start the rendezvous store here (as rank 0) before any rank joins: a rank whose client connects
        before the store listens backs off for ~0.3 s (measured), which a recovery would wait for. Its address:
        loopback when every rank is on this host, else this node's IP."""
        addr = "127.0.0.1" if loopback else ray.util.get_node_ip_address()
        self._store = dist.TCPStore(addr, 0, world_size, is_master=True, wait_for_workers=False,
                                    timeout=datetime.timedelta(seconds=timeout_s))
        return addr, self._store.port

    def setup(self, *, master_addr: str, master_port: int, world_size: int, plan: dict, model_spec: dict,
              seed: int, dtype: str, collective_timeout_s: float, lr: float | None = None,
              optimizer: dict | None = None, socket_ifname: str | None = "lo", rank: int | None = None,
              pacer: dict | None = None) -> dict:
        """Join the process group (NCCL on this actor's GPU when it has one, else gloo; over `socket_ifname`
        when given) and build this rank's Engine (as `rank` when a reused actor takes a new place).
        `dtype`: a TrainJob dtype ("auto": bf16 on this actor's GPU, fp32 on CPU); `optimizer`: OptimizerConfig
        fields (`lr`, when given, replaces its rate)."""
        started_at, start = time.time(), time.perf_counter()
        if rank is not None:
            self.rank = rank
        backend = default_backend()
        if self.pinned_gpu is not None and backend != "nccl":   # Ray reset it (RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO)
            raise RuntimeError(f"this standby worker is pinned to its node's GPU {self.pinned_gpu} but sees no GPU "
                               f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})")
        os.environ["LOCAL_RANK"] = "0"                 # the store is passed explicitly
        if socket_ifname:
            os.environ.update(GLOO_SOCKET_IFNAME=socket_ifname, NCCL_SOCKET_IFNAME=socket_ifname)
        if backend == "nccl":
            torch.cuda.set_device(0)                  # Ray exposes this actor's GPU as device 0
            os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "0"     # the driver aborts (abort_collectives)
        sockets = collective_abort(backend)
        timeout = datetime.timedelta(seconds=collective_timeout_s)
        store = getattr(self, "_store", None) if self.rank == 0 else None
        if store is None:
            store = dist.TCPStore(master_addr, master_port, world_size, is_master=False, timeout=timeout)
        dist.init_process_group(backend, store=store, rank=self.rank, world_size=world_size, timeout=timeout)
        joined = time.perf_counter()
        self.pacer = EmulationPacer(**pacer) if pacer else None
        self.engine = Engine(plan=plan_from_dict(plan), model_spec=model_from_dict(model_spec), rank=self.rank,
                             seed=seed, optimizer=OptimizerConfig.from_dict(optimizer or {}), lr=lr,
                             dtype=getattr(torch, compute_dtype(dtype, cuda=backend == "nccl")), pacer=self.pacer)
        sockets.capture()                     # the engine has built every subgroup
        place = self.engine.rank_map.ranks[self.rank]
        label_records(rank=self.rank, pipeline=place.pipeline, stage=place.stage,
                      device=f"{place.device_type} {place.node}:{place.device}")
        self.collective_sockets = sockets
        built = self.engine.groups_built
        return {"rank": self.rank, "backend": backend, "setup_s": time.perf_counter() - start, "started_at": started_at,
                "join_s": joined - start, "engine_s": time.perf_counter() - joined, "groups_s": built.seconds,
                "groups_created": built.created, "groups_kept": built.kept}

    @ray.method(concurrency_group="control")
    def abort_collectives(self) -> int:
        """Make a running `train_step` fail fast: it stops at its next forward or backward, and a collective
        it waits in is woken. Called from another thread by the driver once a node is known lost. Returns the
        sockets shut down."""
        if self.engine is not None:
            self.engine.abort()               # stop computing at the next forward or backward
        sockets, self.collective_sockets = getattr(self, "collective_sockets", None), None
        return sockets.abort() if sockets is not None else 0

    def load_hf(self, path: str) -> dict:
        """Load this rank's slices of a Hugging Face checkpoint (step 0 of an --init-from job)."""
        start = time.perf_counter()
        state, nbytes = load_rank_state(path, self.engine.spec, self.engine.layout)
        self.engine.load_state_dict(state)
        return {"rank": self.rank, "bytes_read": nbytes, "seconds": time.perf_counter() - start}

    def holdings(self) -> list[tuple[str, Chunk, int]]:
        return holdings_of(self.engine)

    def configure_snapshots(self, *, routes: dict[str, list], local: dict, peers: list[dict], storage: dict | None,
                            storage_every: int, num_threads: int = 2) -> None:
        """`routes`: tier name (the local, peer and storage specs' names) -> the (name, chunk)s it takes."""
        self.close_snapshots()
        self.snapshotter = AsyncSnapshotter(
            local=build_tier(local), peers=[build_tier(p) for p in peers],
            storage=build_tier(storage) if storage else None,
            policy=SnapshotPolicy(storage_every=storage_every if storage else 0, num_threads=num_threads))
        self.routes = {tier: set(items) for tier, items in routes.items()}
        self.owned = set().union(*self.routes.values())

    def eval_step(self, batch: dict) -> dict:
        return self.engine.eval_step(batch)

    def snapshot_now(self, background_copy: bool = False) -> None:
        """Snapshot the current state as the engine's current step (nothing ran since it completed)."""
        assert self.snapshotter is not None, "configure_snapshots first"
        step = self.engine.step
        self.keep_snapshot(step, self.snapshotter.snapshot(step, self.engine.snapshot_state(), owned=self.owned,
                                                           routes=self.routes, background_copy=background_copy))

    def keep_snapshot(self, step: int, handle) -> None:
        """Remember a step's snapshot handle (fast_records and storage_records read it from other threads)."""
        with self._handles_lock:
            self.handles[step] = handle

    def _snapshot_of(self, step: int):
        with self._handles_lock:
            return self.handles.get(step)

    def train_step(self, batch: dict, snapshot: bool) -> dict:
        """One step; then (when `snapshot`) snapshot the shards in the background: the copy itself runs
        beside the next step's forward and backward, which waits for it only before its optimizer step."""
        self.engine.before_update = self._await_copy
        self._copy_wait_s = 0.0
        previous = self._snapshot_of(self.engine.step)    # the last step's snapshot, if it took one
        start_peak_memory(self.engine)
        out = self.engine.train_step(batch)
        out["rank"] = self.rank
        out |= rank_measurements(self.engine)
        info, plan = self.engine.info, self.engine.plan
        if "sample_ids" in batch and info.stage == 0 and info.tp_rank == 0:   # what this pipeline consumed
            start = plan.sample_offset(info.pipeline)
            out["sample_ids"] = batch["sample_ids"][start:start + plan.samples_of(info.pipeline)].tolist()
        if self.pacer is not None:
            out["emulation"] = self.pacer.report()
        if previous is not None:          # its copy finished before this step's update
            out["snapshot_copy_s"] = previous.copy_seconds
            out["snapshot_wait_s"] = self._copy_wait_s + previous.wait_seconds
        if snapshot:
            self.snapshot_now(background_copy=True)
        return out

    def _as_text(self, err: Exception, what: str) -> RuntimeError:
        """`err` as plain text: checkpoint errors do not survive Ray's pickling."""
        return RuntimeError(f"rank {self.rank}: {what} failed: {type(err).__name__}: {err}")

    def _await_copy(self) -> None:
        """The engine's before_update: the previous snapshot's copy must be done before its tensors change."""
        if self.snapshotter is not None:
            self._copy_wait_s = self.snapshotter.wait_copied()

    def fast_records(self, step: int, timeout_s: float = 120.0) -> list:
        """The node+peer records of `step` once its fast lane has written them."""
        try:
            return self._snapshot_of(step).fast_result(timeout_s).records
        except Exception as err:
            raise self._as_text(err, f"snapshot of step {step}") from None

    def storage_records(self, step: int, timeout_s: float = 600.0) -> list | None:
        try:
            result = self._snapshot_of(step).storage_result(timeout_s)     # waits outside the lock
        except Exception as err:
            raise self._as_text(err, f"upload of step {step}") from None
        with self._handles_lock:
            for old in [s for s in self.handles if s < step]:
                self.handles.pop(old)
        return None if result is None else result.records

    def write_live_chunks(self, step: int, wanted: list[dict]) -> list[str]:
        """After a loss, before this survivor is reset: write to this node's store each chunk of committed
        `step` in `wanted` (the chunks no live store holds any more) that this rank holds live (a data-parallel
        or TP copy of a lost rank's, or a slice of sharded optimizer state it owns), while it is still at `step`
        and its bytes hash as the manifest recorded.
        Returns the keys written."""
        if self.engine is None or self.snapshotter is None or self.engine.step != step:
            return []
        live: dict[str, list] = {}          # no collective: the lost ranks are gone. Whole tensors and slices
        for name, held, tensor in self.engine.live_regions():
            live.setdefault(name, []).append((held, tensor))
        blobs = []
        for want in wanted:
            region = Chunk(offsets=tuple(want["offsets"]), sizes=tuple(want["sizes"]))
            for held, tensor in live.get(want["name"], []):
                if overlap(region, held) != region:             # this rank holds only part of it here, or none
                    continue
                blob = bytes(encode(tensor.detach()[to_local(region, held)].cpu()))
                if digest(blob) == want["digest"]:
                    blobs.append((want["key"], blob))
                    break
        put_all(self.snapshotter.local, blobs)
        return [key for key, _ in blobs]

    def restore(self, *, manifest_json: bytes, tiers: list[dict], num_threads: int = 4) -> dict:
        """Fetch this rank's chunks of the manifest's step (tiers cheapest first), verify, load."""
        manifest = Manifest.from_json(manifest_json, where="sent by the controller")
        built = [build_tier(spec) for spec in tiers]
        start = time.perf_counter()
        try:
            state, report = restore(manifest, self.engine.restore_needs(), built, num_threads=num_threads)
        except ChunkUnavailableError as err:  # no valid copy: the controller skips this step, naming the chunk
            attempts = [tuple(a.split(": ", 1)) if ": " in a else (a, "") for a in err.attempts]
            return {"rank": self.rank, "step": manifest.step,
                    "unavailable": {"key": err.key, "step": err.step, "attempts": attempts}}
        except Exception as err:
            raise self._as_text(err, f"restore of step {manifest.step}") from None
        fetch_s = time.perf_counter() - start
        start = time.perf_counter()
        self.engine.load_state_dict(state)
        load_s = time.perf_counter() - start
        return {"rank": self.rank, "step": manifest.step, "fetch_s": fetch_s, "load_s": load_s,
                "bytes_by_tier": report.bytes_by_tier(), "fallbacks": report.fallbacks[:5],
                "tier_read_s": {t.name: t.read_seconds() for t in built}}

    def reset(self) -> int:
        """Leave the (possibly broken) process group and drop the engine, keeping the process and its imports
        for the next plan. Returns this process id."""
        self.close_snapshots(wait=False)          # a snapshot in flight is abandoned, not awaited
        with self._handles_lock:
            if self.engine is not None:
                self.engine.release()
            self.engine, self.handles = None, {}
        if dist.is_initialized():
            dist.destroy_process_group()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()              # the next plan's engine gets this GPU's memory back
        self._store = None
        release_host_memory()
        return os.getpid()

    def close_snapshots(self, wait: bool = True) -> None:
        if self.snapshotter is not None:
            self.snapshotter.close(wait=wait)
            self.snapshotter = None

    def close(self) -> None:
        self.close_snapshots()
        if dist.is_initialized():
            dist.destroy_process_group()
