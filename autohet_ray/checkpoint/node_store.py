"""A job's node store: a directory on one node (in RAM by default) that elastic/keeper.py serves to others."""
from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
import threading
from pathlib import Path

from autohet_ray import ConfigError
from autohet_ray.checkpoint.copy_check import checked, read_checked
from autohet_ray.checkpoint.tiers.localdir import LocalDirTier
from autohet_ray.safe_names import plain_name

STORE_ENV = "AUTOHET_NODE_STORE"


def default_store_root() -> str:
    """Where node stores live: $AUTOHET_NODE_STORE (as the node's processes see it), else `autohet-<uid>` in
    shared memory when the machine has it, else in the temp directory; made private (mode 0700) when it is new,
    refused when it exists and another user owns it or others may write into it (`private_root`). Containers
    often mount a small /dev/shm (Docker: 64 MB): give them a bigger one or point the variable at a tmpfs or
    fast local disk."""
    if os.environ.get(STORE_ENV):
        return private_root(os.environ[STORE_ENV])
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
    return private_root(os.path.join(base, f"autohet-{os.getuid()}"))


def private_root(root: str) -> str:
    """`root`, made with mode 0700 if it is missing; ConfigError (one line) unless it is a directory (not a
    link) owned by this user that neither group nor others may write to."""
    where = f"the node-store root {root!r}"
    try:
        os.makedirs(root, mode=0o700, exist_ok=True)
        info = os.lstat(root)
    except OSError as err:
        raise ConfigError(f"{where} cannot be made ({err.strerror}); set {STORE_ENV} to a directory of your "
                          "own") from None
    if not stat.S_ISDIR(info.st_mode):
        raise ConfigError(f"{where} is not a directory (a link or a file); remove it, or set {STORE_ENV} to a "
                          "directory of your own")
    if info.st_uid != os.getuid():
        raise ConfigError(f"{where} belongs to uid {info.st_uid}, not to this user (uid {os.getuid()}); remove "
                          f"it, or set {STORE_ENV} to a directory of your own")
    if info.st_mode & 0o022:
        raise ConfigError(f"{where} may be written by group or others (mode {stat.S_IMODE(info.st_mode):o}); "
                          f"`chmod 700` it, or set {STORE_ENV} to a directory of your own")
    return root


def node_store_dir(job_id: str, node_id: str) -> str:
    """A job's store on a node: `<root>/<job id>/<node id>` (jobs on one cluster never share a store)."""
    where = "a node store"
    return os.path.join(default_store_root(), plain_name(job_id, where=where, field="job id"),
                        plain_name(node_id, where=where, field="node id"))


def sweep_node_stores(node_ids) -> None:
    """Remove every job's stores of nodes that died without their keeper's close (emulated nodes share a
    host)."""
    base = Path(default_store_root())
    for node_id in node_ids:
        for store in base.glob(f"*/{node_id}"):
            shutil.rmtree(store, ignore_errors=True)


class NodeStore(LocalDirTier):
    """A job's store on one node (`node_store_dir`): a LocalDirTier without fsync (it is RAM) that closes once:
    close() waits for the writes in progress, refuses later ones and removes the directory."""

    def __init__(self, job_id: str, node_id: str, label: str):
        self._job_id, self._dir = job_id, node_store_dir(job_id, node_id)
        super().__init__(self._dir, name=label, fsync=False)
        self._writes = threading.Condition()
        self._active_writes, self._closed = 0, False

    def put_many(self, items: list[tuple[str, bytes]]) -> int:
        """Store the chunks; returns the bytes taken. Refused once the store is closed (a peer's late push must
        not bring a removed store back)."""
        with self._writes:
            if self._closed:
                raise RuntimeError(f"the node store {self._dir} of job {self._job_id} is closed")
            self._active_writes += 1
        try:
            for key, blob in items:
                self.put_chunk(key, blob)
        finally:
            with self._writes:
                self._active_writes -= 1
                self._writes.notify_all()
        return sum(len(blob) for _, blob in items)

    def put_checked(self, items: list[tuple[str, bytes]], digests: dict[str, str], source: str) -> dict:
        """Store the chunks copied from store `source` whose bytes hash to `digests` (key -> the manifest's hash);
        the rest are refused: {"bytes": taken, "refused": [copy_check refusals]}."""
        good, refused = [], []
        for key, blob in items:
            problem = checked(key, blob, digests[key], source=source, target=self.name)
            if problem:
                refused.append(problem)
            else:
                good.append((key, blob))
        return {"bytes": self.put_many(good), "refused": refused}

    def upload_checked(self, digests: dict[str, str], tier) -> dict:
        """Copy these chunks (key -> the manifest's hash), as stored, to `tier`, each only when its bytes hash to
        the manifest's: {"bytes": copied, "copied": [keys], "refused": [copy_check refusals]}."""
        out = {"bytes": 0, "copied": [], "refused": []}
        for key, expected in digests.items():
            blob, problem = read_checked(self._stored, key, expected, source=self.name, target=tier.name)
            if problem:
                out["refused"].append(problem)
                continue
            tier.put_chunk(key, bytes(blob))           # boto3 takes no memoryview
            out["bytes"] += len(blob)
            out["copied"].append(key)
        return out

    def _stored(self, key: str):
        """The chunk as the directory holds it (ChunkMissingError when absent)."""
        return LocalDirTier.get_chunk(self, key)

    def close(self) -> None:
        """Remove the node store once the writes in progress are done."""
        with self._writes:
            self._closed = True
            self._writes.wait_for(lambda: self._active_writes == 0, timeout=5.0)
        shutil.rmtree(self._dir, ignore_errors=True)
        with contextlib.suppress(OSError):               # the job's folder, once its last node store is gone
            os.rmdir(os.path.dirname(self._dir))
