"""The node's cache of s3:// datasets (`<node-store root>/datasets/<hash of the URL>`), capped in size.

A job that trains on a cached dataset holds it: a shared `flock` on `<dataset dir>.lock` for as long as the job
runs (the kernel drops it when the process ends, however it ends). Before a download the cache is trimmed to
its cap: the least recently used datasets (the lock file's mtime, touched by every hold) go first, and only a
dataset whose lock can be taken exclusively at once (no running job holds it) is ever removed."""
from __future__ import annotations

import fcntl
import os
import shutil
import sys

LOCK_SUFFIX = ".lock"


class DatasetHold:
    """A running job's hold on a cached dataset directory; `release()` (or the process's end) lets it go."""

    def __init__(self, directory: str):
        self.directory = directory
        self._fd = os.open(directory + LOCK_SUFFIX, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_SH)
        os.utime(self._fd)                          # the use that the LRU order counts

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)                      # closing the descriptor drops the flock
            self._fd = None


def cached_datasets(root: str) -> list[tuple[float, str, int]]:
    """(last use, directory, bytes) of every dataset in the cache `root`, least recently used first."""
    if not os.path.isdir(root):
        return []
    out = []
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if name.endswith(LOCK_SUFFIX) or not os.path.isdir(path):
            continue
        lock = path + LOCK_SUFFIX
        used = os.path.getmtime(lock) if os.path.exists(lock) else os.path.getmtime(path)
        out.append((used, path, _bytes_under(path)))
    return sorted(out)


def _bytes_under(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files
               if os.path.isfile(os.path.join(d, f)))


def evict_to_cap(root: str, cap_bytes: int, *, room_for: int = 0, keep: str | None = None) -> list[str]:
    """Remove least recently used datasets of the cache `root` that no job holds until it holds at most
    `cap_bytes - room_for` bytes (`keep`: a directory never removed, the one about to be used). Returns the
    directories removed; a dataset held by a running job stays, even over the cap (said on stderr)."""
    entries = cached_datasets(root)
    total = sum(size for _, _, size in entries)
    removed = []
    for _used, path, size in entries:
        if total + room_for <= cap_bytes:
            break
        if path == keep or not _remove_if_unheld(path):
            continue
        removed.append(path)
        total -= size
    if total + room_for > cap_bytes:
        print(f"autohet: dataset cache {root} holds {total / 1e9:.2f} GB, over its cap of {cap_bytes / 1e9:.2f} "
              "GB: the rest is in use by running jobs", file=sys.stderr)
    return removed


def _remove_if_unheld(path: str) -> bool:
    """Remove a cached dataset if no job holds it (its lock taken exclusively without waiting)."""
    fd = os.open(path + LOCK_SUFFIX, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        shutil.rmtree(path)
        os.unlink(path + LOCK_SUFFIX)
        return True
    finally:
        os.close(fd)
