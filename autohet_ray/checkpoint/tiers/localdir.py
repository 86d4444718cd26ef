"""Local-directory tier: the embedded default storage. Write-then-rename with fsync of the file and then of its
directory (autohet_ray/durable.py); manifests are created with a hard link, which fails if the name exists (an
atomic create-if-absent)."""
from __future__ import annotations

import mmap
import os
import time
from pathlib import Path

from autohet_ray import ConfigError
from autohet_ray.checkpoint.errors import ChunkMissingError
from autohet_ray.checkpoint.keys import MANIFEST_PREFIX, manifest_key, step_of_manifest_key
from autohet_ray.checkpoint.tiers.base import resolve_existing_manifest
from autohet_ray.durable import TMP_MARK, fsync_dir, is_temporary, write_atomic, write_temporary
MMAP_MIN_BYTES = 1 << 20      # bigger chunks are mapped (private copy-on-write) instead of read into memory


class LocalDirTier:
    def __init__(self, root: str | Path, *, name: str = "localdir", fsync: bool = True):
        self.name = name
        self.root = Path(root)
        if self.root.exists() and not self.root.is_dir():
            raise ConfigError(f"LocalDirTier root {str(self.root)!r} exists and is not a directory")
        self.root.mkdir(parents=True, exist_ok=True)
        self._fsync = fsync

    def _path(self, key: str) -> Path:
        assert key and not key.startswith("/") and ".." not in key.split("/"), key
        return self.root / key

    def _sync_dir(self, path: Path) -> None:
        if self._fsync:
            fsync_dir(path)

    def put_chunk(self, key: str, blob: bytes) -> None:
        write_atomic(self._path(key), blob, fsync=self._fsync)

    def get_chunk(self, key: str) -> bytes | memoryview:
        """The chunk's bytes; from MMAP_MIN_BYTES on, a private copy-on-write mapping of the file (no copy
        made; files are replaced by rename, never rewritten in place, so the mapping stays whole)."""
        try:
            with open(self._path(key), "rb") as f:
                if os.fstat(f.fileno()).st_size < MMAP_MIN_BYTES:
                    return f.read()
                return memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY))
        except FileNotFoundError:
            raise ChunkMissingError(key, self.name) from None

    def has(self, key: str) -> bool:
        return self._path(key).is_file()

    def prefetch(self, keys: list[str]) -> set[str]:
        """The keys held (nothing to bring closer: the files are here); see restore's use of it."""
        return {key for key in keys if self.has(key)}

    def list(self, prefix: str = "") -> list[str]:
        return [k for k in self._list_all(prefix) if not k.startswith(MANIFEST_PREFIX)]

    def _list_all(self, prefix: str) -> list[str]:
        out = []
        for dirpath, _, files in os.walk(self.root):
            rel = Path(dirpath).relative_to(self.root).as_posix()
            for fname in files:
                if is_temporary(fname):
                    continue
                key = fname if rel == "." else f"{rel}/{fname}"
                if key.startswith(prefix):
                    out.append(key)
        return sorted(out)

    def delete(self, key: str) -> None:
        self.delete_many([key])

    def delete_many(self, keys: list[str]) -> None:
        parents = set()
        for key in keys:
            path = self._path(key)
            path.unlink(missing_ok=True)
            parents.add(path.parent)
        for parent in sorted(parents, key=lambda p: len(p.parts), reverse=True):
            while parent != self.root:                # prune directories left empty (a collected step)
                try:
                    parent.rmdir()
                except OSError:
                    break
                parent = parent.parent

    def put_manifest(self, step: int, body: bytes) -> None:
        final = self._path(manifest_key(step))
        tmp = write_temporary(final, body, fsync=self._fsync)
        try:
            os.link(tmp, final)                   # atomic; FileExistsError when already committed
        except FileExistsError:
            resolve_existing_manifest(self.name, step, final.read_bytes(), body)
        finally:
            tmp.unlink()
        self._sync_dir(final.parent)

    def get_manifest(self, step: int) -> bytes:
        try:
            return self._path(manifest_key(step)).read_bytes()
        except FileNotFoundError:
            raise ChunkMissingError(manifest_key(step), self.name) from None

    def list_manifests(self) -> list[int]:
        steps = (step_of_manifest_key(k) for k in self._list_all(MANIFEST_PREFIX))
        return sorted(s for s in steps if s is not None)

    def delete_manifest(self, step: int) -> None:
        self._path(manifest_key(step)).unlink(missing_ok=True)
        self._sync_dir(self._path(manifest_key(step)).parent)

    def sweep_temporaries(self, older_than_s: float) -> list[str]:
        """Remove temporary files left by writers that died before their rename (the local analog of
        abandoned multipart uploads). Returns the removed paths, relative to the root."""
        cutoff, removed = time.time() - older_than_s, []
        for path in self.root.rglob(f".*{TMP_MARK}*"):
            if path.is_file() and path.stat().st_mtime < cutoff:
                path.unlink(missing_ok=True)
                removed.append(path.relative_to(self.root).as_posix())
        return sorted(removed)
