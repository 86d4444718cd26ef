"""Abort a rank's blocked collectives from another thread: gloo by its sockets (below), NCCL by aborting its
communicators (`NcclGroups`, torch's documented way; not run on a GPU in this repository's tests).

A gloo send, recv or all-reduce waits on TCP sockets until its peer answers or the group's timeout (minutes)
expires; `destroy_process_group` and `ProcessGroup.abort()` called from another thread do not wake it
(tried on torch 2.13). After a node is lost, survivors can sit in such a call waiting on a survivor that has
already failed out of its own, or on a host that vanished without a TCP reset. Shutting down the group's
connected sockets wakes every blocked call with "Connection closed by peer", and the peers' calls on those
connections fail the same way; listening sockets are left alone (gloo's listener thread aborts the process
on an error). The process can then destroy the group and join a new one.

The group's sockets are the socket file descriptors that appeared while the group and its subgroups were
built; one is shut down only if it still refers to the same socket (file descriptor numbers are reused).
"""
from __future__ import annotations

import os
import socket


def socket_fds() -> dict[int, str]:
    """This process's socket file descriptors -> "socket:[inode]"."""
    out = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:              # closed since the listing
            continue
        if target.startswith("socket:"):
            out[int(name)] = target
    return out


class CollectiveSockets:
    """Create before `init_process_group`, `capture()` once every subgroup exists, `abort()` from any thread."""

    def __init__(self):
        self._before = socket_fds()
        self.fds: dict[int, str] = {}

    def capture(self) -> int:
        self.fds = {fd: ino for fd, ino in socket_fds().items() if self._before.get(fd) != ino}
        return len(self.fds)

    def abort(self) -> int:
        """Shut down the group's connected sockets; returns how many."""
        done = 0
        for fd, ino in self.fds.items():
            try:
                if os.readlink(f"/proc/self/fd/{fd}") != ino:
                    continue
                sock = socket.socket(fileno=os.dup(fd))
            except OSError:
                continue
            try:
                if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                    sock.shutdown(socket.SHUT_RDWR)
                    done += 1
            except OSError:          # already closed by its peer
                pass
            finally:
                sock.close()         # closes the duplicate only
        return done


class NcclGroups:
    """The NCCL counterpart of CollectiveSockets: `abort()` aborts every process group of this process (NCCL
    communicator abort wakes calls blocked in a collective). Needs TORCH_NCCL_ASYNC_ERROR_HANDLING=0, so that
    the watchdog does not tear the group down on its own meanwhile (see `_abort_process_group`)."""

    def capture(self) -> int:
        return 1

    def abort(self) -> int:
        import torch.distributed.distributed_c10d as c10d  # lazy: torch; this module imports without it
        c10d._abort_process_group()
        return 1


def collective_abort(backend: str):
    """Create before `init_process_group`; `capture()` once every subgroup exists; `abort()` from any thread."""
    return NcclGroups() if backend == "nccl" else CollectiveSockets()
