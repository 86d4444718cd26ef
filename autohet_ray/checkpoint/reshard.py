"""Restore a step saved under one layout into another: plan the reads, fetch, verify, assemble.

For each chunk a new rank needs, the planner lists the saved chunks that overlap it and the overlap
regions (the layout algebra of autohet_ray.layout). Each saved chunk is fetched once, from the cheapest
tier that returns a copy whose hash matches the manifest; missing or corrupt copies fall through to the
next tier and are counted in the per-tier report.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

import torch

from autohet_ray import ConfigError
from autohet_ray.checkpoint.codec import decode, dtype_from_name, verify
from autohet_ray.checkpoint.errors import (CheckpointError, ChunkMissingError, ChunkUnavailableError,
                                           CorruptChunkError, TierUnavailableError)
from autohet_ray.checkpoint.manifest import ChunkRecord, Manifest
from autohet_ray.checkpoint.steps import find_manifest, scan_manifests
from autohet_ray.layout import Chunk, overlap, to_local


class LayoutMismatchError(CheckpointError):
    """The new layout asks for a tensor the step does not hold, or with another global shape."""


@dataclass(frozen=True)
class Piece:
    record: ChunkRecord     # a saved chunk
    region: Chunk           # the part of it the new chunk needs, in global coordinates


def plan_reads(manifest: Manifest, needs: dict[str, tuple[tuple[int, ...], Chunk]],
               saved: dict[str, list[ChunkRecord]] | None = None) -> dict[str, list[Piece]]:
    """For each needed (name -> (global shape, new chunk)), the saved pieces that tile the new chunk. A need
    may be keyed (name, chunk) instead, so that one rank may need several chunks of one tensor (the slices of
    sharded optimizer state it owns). `saved`: `manifest.tensors()`, when the caller plans the reads of many
    ranks."""
    saved = saved if saved is not None else manifest.tensors()
    plan = {}
    for key, (shape, want) in needs.items():
        name, shape = tensor_name(key), tuple(shape)
        if name not in saved:
            raise LayoutMismatchError(f"step {manifest.step} holds no tensor {name!r}")
        if saved[name][0].global_shape != shape:
            raise LayoutMismatchError(f"{name!r}: step {manifest.step} saved global shape "
                                      f"{list(saved[name][0].global_shape)}, the new layout needs {list(shape)}")
        if overlap(want, Chunk.whole(shape)) != want and want.numel:
            raise ConfigError(f"{name!r}: needed chunk {want.to_dict()} lies outside global shape {list(shape)}")
        pieces = []
        for record in saved[name]:
            region = overlap(record.chunk, want)
            if region is not None and region.numel:
                pieces.append(Piece(record, region))
        assert sum(p.region.numel for p in pieces) == want.numel, (name, want)   # manifest tiles exactly
        plan[key] = pieces
    return plan


def tensor_name(key) -> str:
    """The tensor a need is of: its key, or the name in a (name, chunk) key."""
    return key if isinstance(key, str) else key[0]


@dataclass
class TierStats:
    bytes_read: int = 0
    chunks_read: int = 0
    missing: int = 0
    corrupt: int = 0
    unavailable: int = 0


@dataclass
class RestoreReport:
    step: int
    tiers: dict[str, TierStats] = field(default_factory=dict)
    fallbacks: list[str] = field(default_factory=list)     # every copy that was missing/corrupt/unreachable
    seconds: float = 0.0
    saved_chunks_fetched: int = 0
    bytes_assembled: int = 0

    def bytes_by_tier(self) -> dict[str, int]:
        return {name: s.bytes_read for name, s in self.tiers.items()}

    def to_dict(self) -> dict:
        return asdict(self)


class ChunkFetcher:
    """Fetch verified chunks of one step from an ordered tier list (cheapest first)."""

    def __init__(self, tiers, step: int, report: RestoreReport | None = None):
        if not tiers:
            raise ConfigError("ChunkFetcher needs at least one tier")
        self.tiers, self.step = list(tiers), step
        self.report = report or RestoreReport(step)
        for tier in self.tiers:
            self.report.tiers.setdefault(tier.name, TierStats())
        self._down: set[str] = set()           # tiers that failed as a whole: not asked again this restore
        self._lock = threading.Lock()

    def _note(self, tier, field_name: str, message: str | None = None, nbytes: int = 0) -> None:
        with self._lock:
            stats = self.report.tiers[tier.name]
            setattr(stats, field_name, getattr(stats, field_name) + 1)
            stats.bytes_read += nbytes
            if message:
                self.report.fallbacks.append(message)

    def fetch(self, record: ChunkRecord) -> torch.Tensor:
        assert record.step == self.step, (record.key, self.step)
        attempts = []
        for tier in self.tiers:
            if tier.name in self._down:
                attempts.append(f"{tier.name}: unavailable (down earlier in this restore)")
                self._note(tier, "unavailable", f"{record.key}: {tier.name} unavailable: down earlier")
                continue
            try:
                blob = tier.get_chunk(record.key)
            except ChunkMissingError:
                attempts.append(f"{tier.name}: missing")
                self._note(tier, "missing")
                continue
            except TierUnavailableError as err:
                with self._lock:
                    self._down.add(tier.name)
                attempts.append(f"{tier.name}: unavailable ({err.reason})")
                self._note(tier, "unavailable", f"{record.key}: {tier.name} unavailable: {err.reason}")
                continue
            try:
                verify(blob, record.digest, key=record.key, step=self.step, tier=tier.name)
                tensor = decode(blob, key=record.key, step=self.step, tier=tier.name)
            except CorruptChunkError as err:
                attempts.append(f"{tier.name}: corrupt ({err.reason})")
                self._note(tier, "corrupt", str(err), nbytes=len(blob))
                continue
            if tuple(tensor.shape) != record.chunk.sizes or str(tensor.dtype) != f"torch.{record.dtype}":
                raise CorruptChunkError(record.key, self.step, tier.name,
                                        f"decoded {tensor.dtype}{list(tensor.shape)} but the manifest says "
                                        f"{record.dtype}{list(record.chunk.sizes)}")
            self._note(tier, "chunks_read", nbytes=len(blob))
            return tensor
        raise ChunkUnavailableError(record.key, self.step, attempts)


def restore(manifest: Manifest, needs: dict[str, tuple[tuple[int, ...], Chunk]], tiers, *,
            num_threads: int = 4) -> tuple[dict[str, tuple[torch.Tensor, tuple[int, ...], Chunk]], RestoreReport]:
    """Assemble the new local tensors of one rank: name -> (tensor, global shape, chunk), the format of
    the runtime's `load_state_dict` (keyed as `needs` is: see plan_reads). Raises ChunkUnavailableError naming
    the chunk and step when no tier holds a valid copy."""
    start = time.perf_counter()
    plan = plan_reads(manifest, needs)
    fetcher = ChunkFetcher(tiers, manifest.step)
    unique = {p.record.key: p.record for pieces in plan.values() for p in pieces}
    _prefetch(tiers, list(unique))
    with ThreadPoolExecutor(max(1, num_threads), thread_name_prefix="ckpt-fetch") as pool:
        fetched = dict(zip(unique, pool.map(fetcher.fetch, unique.values())))
    state, saved = {}, manifest.tensors()
    for key, (shape, want) in needs.items():
        dtype = dtype_from_name(saved[tensor_name(key)][0].dtype)
        out = torch.empty(want.sizes, dtype=dtype)
        for piece in plan[key]:
            out[to_local(piece.region, want)] = fetched[piece.record.key][to_local(piece.region, piece.record.chunk)]
        state[key] = (out, tuple(shape), want)
        fetcher.report.bytes_assembled += out.numel() * out.element_size()
    fetcher.report.saved_chunks_fetched = len(unique)
    fetcher.report.seconds = time.perf_counter() - start
    return state, fetcher.report


def _prefetch(tiers, keys: list[str]) -> None:
    """Let each tier that can look up keys in one call (and start pulling them) do so, for the keys no cheaper
    tier holds: a survivor's own node store answers most of them, and a peer keeper asked for them as well
    would copy them into the object store and across nodes for nothing. A copy that proves corrupt later
    still falls through to the next tier, one call per chunk."""
    for tier in tiers:
        if not keys:
            return
        prefetch = getattr(tier, "prefetch", None)
        if prefetch is None:
            continue
        try:
            held = prefetch(keys)
        except TierUnavailableError:
            continue                                 # reported by the per-chunk fetch that falls through
        keys = [key for key in keys if key not in held]


def _available(tier, key: str) -> bool:
    try:
        return tier.has(key)
    except TierUnavailableError:
        return False


def choose_restorable_step(manifest_tiers, tiers, needs_per_rank, *, exclude=()) -> tuple[int, list[str]]:
    """The newest committed step (not in `exclude`) whose saved chunks needed by every new rank are
    present in some tier; for the driver to pick one step for all ranks. Presence only: hashes are
    checked when the ranks fetch (on ChunkUnavailableError, call again with that step excluded).
    Returns (step, reasons the newer steps were skipped); raises CheckpointError if none qualifies."""
    skipped = []
    for step in sorted(scan_manifests(manifest_tiers).steps, reverse=True):
        if step in exclude:
            skipped.append(f"step {step}: excluded")
            continue
        manifest = find_manifest(manifest_tiers, step)
        keys = {p.record.key for needs in needs_per_rank for ps in plan_reads(manifest, needs).values() for p in ps}
        lost = sorted(k for k in keys if not any(_available(t, k) for t in tiers))
        if not lost:
            return step, skipped
        skipped.append(f"step {step}: no tier holds {len(lost)} needed chunk(s), e.g. {lost[0]!r}")
    raise CheckpointError("no committed step can be restored: " + ("; ".join(skipped) or "no committed step"))
