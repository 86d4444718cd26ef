"""Asynchronous snapshots of one rank's shards.

`snapshot()` copies the shards into serialized blobs (one copy: the only part that stalls compute) and
returns a handle. With `background_copy` even the copy leaves the caller: it runs first in the fast lane
(from a GPU on a side CUDA stream, after the work already queued on the caller's stream), overlapping the
next step's forward and backward; the caller must call `wait_copied()` before it changes the tensors again
(the next optimizer step). A background "fast lane" hashes and writes each chunk to the node's tier and its
peer tiers (every step); a "storage lane" uploads the same bytes to the job's storage every `storage_every`
steps. Each lane yields ChunkRecords; the coordinator commits a step's manifest once every rank's lane has finished.
A new snapshot waits for the previous fast lane, and a storage step for the previous upload (backpressure,
reported as wait_seconds) so memory stays bounded.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

import torch

from autohet_ray import ConfigError
from autohet_ray.checkpoint.codec import digest, dtype_name, encode
from autohet_ray.checkpoint.faults import NO_FAULTS, Faults
from autohet_ray.checkpoint.keys import chunk_key
from autohet_ray.checkpoint.manifest import ChunkRecord
from autohet_ray.layout import Chunk


@dataclass(frozen=True, kw_only=True)
class SnapshotPolicy:
    storage_every: int = 10
    """Upload to the storage every this many steps (steps divisible by it); 0 disables the storage lane."""
    num_threads: int = 4
    """Chunks written at once per lane."""

    def __post_init__(self):
        if self.storage_every < 0 or self.num_threads < 1:
            raise ConfigError(f"SnapshotPolicy: storage_every must be >= 0 (got {self.storage_every}) and "
                              f"num_threads >= 1 (got {self.num_threads})")


@dataclass
class LaneResult:
    step: int
    records: list[ChunkRecord]
    bytes_written: dict[str, int] = field(default_factory=dict)   # tier name -> bytes
    seconds: float = 0.0


@dataclass
class _Encoded:
    name: str
    shape: tuple[int, ...]
    chunk: Chunk
    dtype: str
    blob: bytearray
    digest: str = ""


class SnapshotHandle:
    def __init__(self, step: int, copy_seconds: float, wait_seconds: float, items: list | None = None):
        self.step, self.copy_seconds, self.wait_seconds = step, copy_seconds, wait_seconds
        self.fast: Future = Future()
        self.storage: Future | None = None
        self.copied: Future = Future()    # the blobs hold the state: the caller may update the tensors again
        self.items = items or []          # the blobs, recycled for a later snapshot once both lanes are done

    def wait_copied(self, timeout: float | None = None) -> float:
        """Block until the blobs hold the state, or the lane ended without copying (failed, cancelled);
        returns the seconds waited. A failure is reported by `fast_result`, not here."""
        start = time.perf_counter()
        wait([self.copied, self.fast], timeout, return_when=FIRST_COMPLETED)
        return time.perf_counter() - start

    def settled(self) -> bool:
        return self.fast.done() and (self.storage is None or self.storage.done())

    def fast_result(self, timeout: float | None = None) -> LaneResult:
        return self.fast.result(timeout)

    def storage_result(self, timeout: float | None = None) -> LaneResult | None:
        return None if self.storage is None else self.storage.result(timeout)


def encode_shards(state: dict, owned=None, spare: dict | None = None) -> list[_Encoded]:
    """Serialized copies of the (name -> (tensor, global shape, chunk)) entries this rank writes: the one
    copy of the data a snapshot makes (hashes are computed later, off the compute path). A key may also be
    (name, chunk): a rank holding several chunks of one tensor (slices of sharded optimizer state). `spare`: buffers
    of an earlier snapshot by (name, chunk), reused when the size matches (a fresh buffer costs page faults:
    ~5x the copy itself)."""
    spare = spare if spare is not None else {}
    out = []
    for key, (tensor, shape, chunk) in state.items():
        name = key if isinstance(key, str) else key[0]
        if owned is not None and (name, chunk) not in owned:
            continue
        if tuple(tensor.shape) != tuple(chunk.sizes):
            raise ConfigError(f"{name!r}: local tensor shape {list(tensor.shape)} != chunk sizes {list(chunk.sizes)}")
        out.append(_Encoded(name, tuple(shape), chunk, dtype_name(tensor.dtype),
                            encode(tensor, out=spare.pop((name, chunk), None))))
    return out


class AsyncSnapshotter:
    def __init__(self, *, local, peers=(), storage=None, policy: SnapshotPolicy = SnapshotPolicy(),
                 faults: Faults = NO_FAULTS):
        self.local, self.peers, self.storage = local, list(peers), storage
        self.policy, self.faults = policy, faults
        self._fast_lane = ThreadPoolExecutor(1, thread_name_prefix="snap-fast")
        self._storage_lane = ThreadPoolExecutor(1, thread_name_prefix="snap-storage")
        self._io = ThreadPoolExecutor(policy.num_threads, thread_name_prefix="snap-io")
        self._storage_io = ThreadPoolExecutor(policy.num_threads, thread_name_prefix="snap-storage-io")
        self._last: SnapshotHandle | None = None
        self._last_storage: SnapshotHandle | None = None
        self._lock = threading.Lock()
        self._lent_lock = threading.Lock()
        self._lent: list[SnapshotHandle] = []        # handles whose blobs may still be in use by a lane
        self._copy_stream = None                      # side CUDA stream of background copies (made lazily)

    def wait_copied(self) -> float:
        """Wait until the newest snapshot's copy is done (its tensors may change again); seconds waited."""
        last = self._last
        return 0.0 if last is None else last.wait_copied()

    def is_storage_step(self, step: int) -> bool:
        return self.storage is not None and self.policy.storage_every > 0 and step % self.policy.storage_every == 0

    def snapshot(self, step: int, state: dict, *, owned=None, routes: dict[str, set] | None = None,
                 background_copy: bool = False) -> SnapshotHandle:
        """Copy the shards (name -> (tensor, global shape, chunk)) to CPU and write them in the background.
        `owned`: the (name, chunk)s this rank writes anywhere (None: all). `routes`: tier name -> the
        (name, chunk)s that tier takes (see peers.place_copies); a tier not named takes everything owned.
        `background_copy`: copy in the fast lane too (see the module docstring); call `wait_copied()` before
        changing the tensors."""
        if background_copy:
            return self._snapshot_in_background(step, state, owned, routes or {})
        with self._lock:
            wait_start = time.perf_counter()
            if self._last is not None:
                _wait_quietly(self._last.fast)
            if self.is_storage_step(step) and self._last_storage is not None:
                _wait_quietly(self._last_storage.storage)       # one upload at a time; other steps never wait for it
            wait_seconds = time.perf_counter() - wait_start
            copy_start = time.perf_counter()
            self.faults.maybe_fail("snapshot_copy")
            items = encode_shards(state, owned, self._reclaim())
            handle = SnapshotHandle(step, time.perf_counter() - copy_start, wait_seconds, items)
            handle.copied.set_result(None)
            with self._lent_lock:
                self._lent.append(handle)
            encoded: Future = Future()
            handle.fast = self._fast_lane.submit(self._write_fast, step, items, encoded, routes or {})
            if self.is_storage_step(step):
                handle.storage = self._storage_lane.submit(self._write_storage, step, encoded, handle.fast,
                                                           routes or {})
                self._last_storage = handle
            self._last = handle
            return handle

    def _snapshot_in_background(self, step: int, state: dict, owned, routes: dict) -> SnapshotHandle:
        with self._lock:
            handle = SnapshotHandle(step, 0.0, 0.0)
            previous_upload = self._last_storage if self.is_storage_step(step) else None
            encoded: Future = Future()
            handle.fast = self._fast_lane.submit(self._copy_then_write, handle, state, owned, _device_marker(state),
                                                 previous_upload, encoded, routes)
            if self.is_storage_step(step):
                handle.storage = self._storage_lane.submit(self._write_storage, step, encoded, handle.fast, routes)
                self._last_storage = handle
            self._last = handle
            return handle

    def _copy_then_write(self, handle: SnapshotHandle, state: dict, owned, marker, previous_upload,
                         encoded: Future, routes: dict) -> LaneResult:
        """The fast lane of a background copy: after the previous snapshot's lane (the lane runs one task at a
        time) and, on a storage step, the previous upload, copy; release the caller; then hash and write."""
        start = time.perf_counter()
        try:
            if previous_upload is not None:
                _wait_quietly(previous_upload.storage)          # one upload at a time, as in the caller's path
            handle.wait_seconds = time.perf_counter() - start
            copy_start = time.perf_counter()
            self.faults.maybe_fail("snapshot_copy")
            handle.items = self._copy_after(marker, state, owned)
            handle.copy_seconds = time.perf_counter() - copy_start
        except BaseException as err:
            handle.copied.set_exception(err)
            encoded.set_exception(err)
            raise
        with self._lent_lock:
            self._lent.append(handle)
        handle.copied.set_result(None)
        return self._write_fast(handle.step, handle.items, encoded, routes)

    def _copy_after(self, marker, state: dict, owned) -> list[_Encoded]:
        """encode_shards; device tensors are read on a side stream once `marker` (the caller's stream at
        snapshot time: the optimizer step) is reached, so compute queued after it keeps running."""
        if marker is None:
            return encode_shards(state, owned, self._reclaim())
        if self._copy_stream is None:
            self._copy_stream = torch.cuda.Stream(device=marker[1])
        with torch.cuda.stream(self._copy_stream):
            self._copy_stream.wait_event(marker[0])
            items = encode_shards(state, owned, self._reclaim())
        self._copy_stream.synchronize()
        return items

    def _reclaim(self) -> dict:
        """Blobs of settled snapshots (no lane reads them any more), by (name, chunk)."""
        spare = {}
        with self._lent_lock:
            for handle in [h for h in self._lent if h.settled()]:
                self._lent.remove(handle)
                spare.update({(item.name, item.chunk): item.blob for item in handle.items})
                handle.items = []
        return spare

    def _write_fast(self, step: int, items: list[_Encoded], encoded: Future, routes: dict) -> LaneResult:
        start = time.perf_counter()
        try:
            for item in items:
                item.digest = digest(item.blob)
        except BaseException as err:
            encoded.set_exception(err)
            raise
        encoded.set_result(items)
        tiers = [(self.local, "snapshot_write"), *((peer, "replicate") for peer in self.peers)]
        result = self._write_all(step, items, tiers, self._io, routes)
        result.seconds = time.perf_counter() - start
        return result

    def _write_storage(self, step: int, encoded: Future, fast: Future, routes: dict) -> LaneResult:
        start = time.perf_counter()
        items = encoded.result()
        fast_result = fast.result()      # the storage records also list the node and peer replicas
        result = self._write_all(step, items, [(self.storage, "upload")], self._storage_io, routes)
        known = {r.key: r.replicas for r in fast_result.records}
        result.records = [_with_replicas(r, known.get(r.key, ()) + r.replicas) for r in result.records]
        result.seconds = time.perf_counter() - start
        return result

    def _write_all(self, step: int, items: list[_Encoded], tiers, pool, routes: dict) -> LaneResult:
        """Every chunk to every tier that takes it, in order (the node tier before the peer push that reads
        from it): one batched call per tier where the tier takes batches (keepers), else one call per chunk
        on `pool`."""
        takes = {tier.name: [i for i in items if tier.name not in routes or (i.name, i.chunk) in routes[tier.name]]
                 for tier, _ in tiers}
        for tier, point in tiers:
            self._write_tier(tier, point, [(chunk_key(step, i.name, i.chunk), i.blob) for i in takes[tier.name]], pool)
        result = LaneResult(step, [], {tier.name: sum(len(i.blob) for i in takes[tier.name]) for tier, _ in tiers})
        taken = {name: {id(i) for i in chosen} for name, chosen in takes.items()}
        for item in items:
            replicas = tuple(tier.name for tier, _ in tiers if id(item) in taken[tier.name])
            if replicas:
                result.records.append(ChunkRecord(step=step, name=item.name, global_shape=item.shape,
                                                  chunk=item.chunk, dtype=item.dtype, digest=item.digest,
                                                  nbytes=len(item.blob), replicas=replicas))
        return result

    def _write_tier(self, tier, point: str, keyed: list[tuple[str, bytearray]], pool) -> None:
        """An injected fault at chunk i leaves chunks before i written (a partial step), as a crash would."""
        batch = getattr(tier, "put_chunks", None)
        if batch is None:
            def write(kb):
                self.faults.maybe_fail(point)
                tier.put_chunk(*kb)
            list(pool.map(write, keyed))
            return
        done = 0
        try:
            for _ in keyed:
                self.faults.maybe_fail(point)
                done += 1
        finally:
            if done:
                batch(keyed[:done])

    def close(self, wait: bool = True) -> None:
        """Stop the lanes; `wait=False` abandons a snapshot in flight (never committed: its manifest is missing)
        instead of waiting for it, as after a failure."""
        for pool in (self._fast_lane, self._storage_lane, self._io, self._storage_io):
            pool.shutdown(wait=wait, cancel_futures=not wait)


def _with_replicas(record: ChunkRecord, replicas) -> ChunkRecord:
    return ChunkRecord(step=record.step, name=record.name, global_shape=record.global_shape, chunk=record.chunk,
                       dtype=record.dtype, digest=record.digest, nbytes=record.nbytes,
                       replicas=tuple(dict.fromkeys(replicas)))


def _device_marker(state: dict):
    """(event, device) recorded on the current CUDA stream of the state's device tensors; None on CPU."""
    device = next((t.device for t, _, _ in state.values() if t.is_cuda), None)
    if device is None:
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event, device


def _wait_quietly(future: Future) -> None:
    """Wait for a previous lane; its failure is reported through its own handle, not this snapshot."""
    try:
        future.result()
    except Exception:
        pass
