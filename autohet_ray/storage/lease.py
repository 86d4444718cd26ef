"""One process at a time trains from a storage: `lease.json` in the storage names the process that holds it.

    with storage_lease(spec, url, job_id=..., break_lease=False):    # train and resume wrap their whole run
        ...

Taking it is an atomic create-if-absent: in a directory, a complete temporary file hard-linked to `lease.json`
(the link fails when the name exists); on S3, a PUT with `If-None-Match: *`. A held lease is waited for up to
LEASE_WAIT_S, then refused with one line naming the holder. It is released on every way out of the `with` (the
end, an exception, Ctrl-C, SIGTERM and SIGHUP, turned into SystemExit while it is held) and at interpreter exit.
A holder on this host whose process is provably gone (no such pid, or the pid now belongs to a process that
started at another time, or the host rebooted) is broken automatically, with a line saying so; any other
lease only with `--break-lease`. The directory and S3 ways to create, read and remove it: lease_backends.py.
"""
from __future__ import annotations

import atexit
import contextlib
import datetime
import json
import logging
import os
import signal
import socket
import threading
import time
import uuid

from autohet_ray import ConfigError
from autohet_ray.storage import lease_backends
from autohet_ray.storage.spec import location

log = logging.getLogger(__name__)

LEASE_FILE = "lease.json"
LEASE_WAIT_S = 10.0          # how long a run waits for another one's lease to be released
POLL_S = 0.25


class LeaseHeldError(ConfigError):
    """The storage's lease is held by another live process (or one this host cannot prove gone)."""


def _read_first_line(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.readline().strip()
    except OSError:
        return None


def process_start(pid: int) -> str | None:
    """The start time of process `pid` in clock ticks since boot (Linux /proc), None where unknown."""
    stat = _read_first_line(f"/proc/{pid}/stat")
    if not stat or ")" not in stat:
        return None
    fields = stat.rpartition(")")[2].split()      # the command name (field 2) may hold spaces and ')'
    return fields[19] if len(fields) > 19 else None   # field 22, starttime


def this_holder(job_id: str) -> dict:
    """The lease record of this process."""
    now = time.time()
    return {"host": socket.gethostname(), "pid": os.getpid(), "start": process_start(os.getpid()),
            "boot_id": _read_first_line("/proc/sys/kernel/random/boot_id"), "job_id": job_id, "since": now,
            "since_utc": datetime.datetime.fromtimestamp(now, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
            "token": uuid.uuid4().hex}


def gone_reason(holder: dict) -> str | None:
    """Why the holder's process is provably gone (a process on this host only), None when it may be alive."""
    if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return None
    boot_id = _read_first_line("/proc/sys/kernel/random/boot_id")
    if holder.get("boot_id") and boot_id and holder["boot_id"] != boot_id:
        return "this host rebooted since"
    pid = holder["pid"]
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return f"no process {pid} runs on this host"
    except PermissionError:
        pass                                      # alive, another user's
    start = process_start(pid)
    if holder.get("start") and start and start != holder["start"]:
        return f"pid {pid} now belongs to another process"
    return None


def describe(holder: dict | None) -> str:
    if holder is None:
        return "an unknown holder (its lease file is unreadable)"
    return (f"job {holder.get('job_id')} (pid {holder.get('pid')} on {holder.get('host')}, since "
            f"{holder.get('since_utc')} UTC)")


class StorageLease:
    """The lease of one storage (a tier spec) for one process; a context manager."""

    def __init__(self, spec: dict, url: str, *, job_id: str, break_lease: bool = False,
                 wait_s: float = LEASE_WAIT_S):
        self.spec, self.url, self.break_lease, self.wait_s = spec, url, break_lease, wait_s
        self.backend = lease_backends.backend(spec, LEASE_FILE)
        self.holder = this_holder(job_id)
        self.held = False
        self._signals: dict[int, object] = {}

    def acquire(self) -> None:
        deadline = time.monotonic() + self.wait_s
        body = json.dumps(self.holder).encode()
        while True:
            if self.backend.create(body):
                self.held = True
                atexit.register(self.release)
                return
            found = self.backend.read()
            if found is None:                     # released meanwhile: try again at once
                continue
            other, version = found
            reason = "--break-lease" if self.break_lease else gone_reason(other) if other else None
            if reason is not None:
                self._break(other, version, reason)
                continue
            if time.monotonic() >= deadline:
                raise LeaseHeldError(
                    f"storage {self.url!r} is in use by {describe(other)}: its lease {location(self.spec, LEASE_FILE)} "
                    f"was not released within {self.wait_s:g} s; wait for that run to end, or pass --break-lease "
                    "if it is gone")
            time.sleep(POLL_S)

    def _break(self, other: dict | None, version, reason: str) -> None:
        if self.backend.remove(version):
            why = "broken by --break-lease" if reason == "--break-lease" else reason
            log.warning(f"autohet: broke the lease of {describe(other)} on storage {self.url!r} ({why})")
        self.break_lease = False                  # the flag breaks one lease, never the next holder's

    def release(self) -> None:
        """Remove the lease if this process still holds it (idempotent)."""
        if not self.held:
            return
        self.held = False
        atexit.unregister(self.release)
        found = self.backend.read()
        if found is not None and found[0] is not None and found[0].get("token") == self.holder["token"]:
            self.backend.remove(found[1])

    def __enter__(self) -> "StorageLease":
        self.acquire()
        self._exit_on_signals()
        return self

    def __exit__(self, *_exc) -> None:
        try:
            self.release()
        finally:
            self._restore_signals()

    def _exit_on_signals(self) -> None:
        """SIGTERM and SIGHUP, while nothing else handles them, end the run through SystemExit (so `with`
        releases the lease) instead of killing the process where it stands."""
        if threading.current_thread() is not threading.main_thread():
            return

        def stop(signum, _frame):
            raise SystemExit(128 + signum)
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) == signal.SIG_DFL:
                self._signals[sig] = signal.signal(sig, stop)

    def _restore_signals(self) -> None:
        for sig, previous in self._signals.items():
            with contextlib.suppress(ValueError):
                signal.signal(sig, previous)
        self._signals.clear()


def new_job_id() -> str:
    """A fresh job id (a plain name: it names the job's node stores and actors)."""
    return uuid.uuid4().hex[:12]


def storage_lease(spec: dict, url: str, *, job_id: str, break_lease: bool = False,
                  wait_s: float = LEASE_WAIT_S) -> StorageLease:
    """The lease of `spec` for this process, taken by `with` (LeaseHeldError: one line naming the holder)."""
    return StorageLease(spec, url, job_id=job_id, break_lease=break_lease, wait_s=wait_s)
