"""The node's cache of s3:// datasets (`<node-store root>/datasets/<hash of the URL>`), capped in size, and
the local directory a job trains from (`held_dataset`).

A job that trains on a cached dataset holds it: a shared `flock` on `<dataset dir>.lock` for as long as the job
runs (the kernel drops it when the process ends, however it ends). Before a download the cache is trimmed to
its cap: the least recently used datasets (the lock file's mtime, touched by every hold) go first, and only a
dataset whose lock can be taken exclusively at once (no running job holds it) is ever removed."""
from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil

from autohet_ray.checkpoint.node_store import default_store_root
from autohet_ray.storage.datasets import download_dataset

log = logging.getLogger(__name__)

LOCK_SUFFIX = ".lock"
DEFAULT_CACHE_GB = 50.0           # a job's `dataset_cache_gb` unless it sets one


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
        log.warning(f"autohet: dataset cache {root} holds {total / 1e9:.2f} GB, over its cap of {cap_bytes / 1e9:.2f} "
                    "GB: the rest is in use by running jobs")
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


def local_dataset(data: str | None, endpoint_url: str | None = None) -> str | None:
    """A local directory of the dataset `data`: the path itself, or the node store's cache of an s3:// dataset
    (beside the node stores, shared by the jobs and resumes on this node; shards whose hash matches are not
    fetched again)."""
    return held_dataset(data, endpoint_url)[0]


def held_dataset(data: str | None, endpoint_url: str | None = None,
                 cache_gb: float = DEFAULT_CACHE_GB) -> tuple[str | None, DatasetHold | None]:
    """`local_dataset`, and for an s3:// dataset the caller's hold on its cached copy (release it when the job
    ends): the cache is first trimmed to `cache_gb`, least recently used datasets that no job holds first."""
    if data is None or not data.startswith("s3://"):
        return data, None
    directory = dataset_cache_dir(data, default_store_root())
    os.makedirs(os.path.dirname(directory), exist_ok=True)
    hold = DatasetHold(directory)              # held before the trim: no other job removes it meanwhile
    try:
        evict_to_cap(os.path.dirname(directory), int(cache_gb * 1e9), keep=directory)
        return download_dataset(data, directory, endpoint_url=endpoint_url), hold
    except BaseException:
        hold.release()
        raise


def dataset_cache_dir(url: str, store_root: str) -> str:
    return os.path.join(store_root, "datasets", hashlib.sha256(url.encode()).hexdigest()[:16])
