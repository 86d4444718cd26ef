"""In-memory tier: the payload of a node keeper. Optionally spills the oldest chunks to a local directory."""
from __future__ import annotations

import threading
from pathlib import Path

from autohet_ray import ConfigError
from autohet_ray.checkpoint.errors import ChunkMissingError
from autohet_ray.checkpoint.tiers.base import resolve_existing_manifest
from autohet_ray.checkpoint.tiers.localdir import LocalDirTier


class MemoryTier:
    """Thread-safe dict of blobs. With `max_bytes` and `spill_dir`, the oldest chunks beyond the budget
    move to disk (not fsynced: the spill is a cache of this process, not a durable copy)."""

    def __init__(self, name: str = "memory", *, max_bytes: int | None = None, spill_dir: str | Path | None = None):
        if (max_bytes is None) != (spill_dir is None):
            raise ConfigError(f"MemoryTier {name!r}: give both max_bytes and spill_dir or neither "
                              f"(got max_bytes={max_bytes!r}, spill_dir={spill_dir!r})")
        if max_bytes is not None and max_bytes < 0:
            raise ConfigError(f"MemoryTier {name!r}: max_bytes must be >= 0, got {max_bytes}")
        self.name = name
        self._max_bytes = max_bytes
        self._spill = LocalDirTier(spill_dir, name=f"{name}-spill", fsync=False) if spill_dir else None
        self._chunks: dict[str, bytes] = {}
        self._manifests: dict[int, bytes] = {}
        self._resident = 0
        self._lock = threading.Lock()

    def put_chunk(self, key: str, blob: bytes) -> None:
        blob = bytes(blob)                      # own the bytes (never a view of a caller's buffer)
        with self._lock:
            old = self._chunks.pop(key, None)
            self._resident -= len(old) if old is not None else 0
            self._chunks[key] = blob
            self._resident += len(blob)
            if self._spill is not None:          # spill under the lock: a victim is never invisible
                self._spill.delete(key)
                for victim_key, victim in self._evict_locked():
                    self._spill.put_chunk(victim_key, victim)

    def _evict_locked(self) -> list[tuple[str, bytes]]:
        victims = []
        while self._max_bytes is not None and self._resident > self._max_bytes and self._chunks:
            key = next(iter(self._chunks))     # insertion order: oldest first
            blob = self._chunks.pop(key)
            self._resident -= len(blob)
            victims.append((key, blob))
        return victims

    def get_chunk(self, key: str) -> bytes:
        with self._lock:
            blob = self._chunks.get(key)
            if blob is not None:
                return blob
            if self._spill is not None and self._spill.has(key):
                return self._spill.get_chunk(key)
        raise ChunkMissingError(key, self.name)

    def has(self, key: str) -> bool:
        with self._lock:
            return key in self._chunks or (self._spill is not None and self._spill.has(key))

    def list(self, prefix: str = "") -> list[str]:
        with self._lock:
            keys = {k for k in self._chunks if k.startswith(prefix)}
            if self._spill is not None:
                keys.update(self._spill.list(prefix))
        return sorted(keys)

    def delete(self, key: str) -> None:
        self.delete_many([key])

    def delete_many(self, keys: list[str]) -> None:
        with self._lock:
            for key in keys:
                blob = self._chunks.pop(key, None)
                self._resident -= len(blob) if blob is not None else 0
            if self._spill is not None:
                self._spill.delete_many(keys)

    def put_manifest(self, step: int, body: bytes) -> None:
        with self._lock:
            existing = self._manifests.setdefault(step, bytes(body))
        resolve_existing_manifest(self.name, step, existing, body)

    def get_manifest(self, step: int) -> bytes:
        with self._lock:
            if step in self._manifests:
                return self._manifests[step]
        raise ChunkMissingError(f"manifest of step {step}", self.name)

    def list_manifests(self) -> list[int]:
        with self._lock:
            return sorted(self._manifests)

    def delete_manifest(self, step: int) -> None:
        with self._lock:
            self._manifests.pop(step, None)

    def usage(self) -> dict[str, int]:
        with self._lock:
            resident, count = self._resident, len(self._chunks)
        spilled = len(self._spill.list()) if self._spill is not None else 0
        return {"resident_bytes": resident, "resident_chunks": count, "spilled_chunks": spilled}
