"""Aborting blocked gloo collectives from another thread (runtime/abort.py) on real processes: a rank that
vanishes without a TCP reset (SIGSTOP) leaves a survivor blocked in an all-reduce with it and another blocked
in a recv from that survivor. Shutting down the survivors' group sockets fails both calls at once (not after the
group's 60 s timeout), and the survivors then form a new group that works."""
from __future__ import annotations

import datetime
import os
import queue
import signal
import threading
import time

import torch.multiprocessing as mp


def _worker(rank: int, store: str, new_store: str, out) -> None:
    import torch
    import torch.distributed as dist
    from autohet_ray.runtime.abort import CollectiveSockets
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    sockets = CollectiveSockets()
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=3,
                            timeout=datetime.timedelta(seconds=60))
    pair = dist.new_group([0, 1])
    captured = sockets.capture()
    dist.barrier()
    if rank == 2:
        os.kill(os.getpid(), signal.SIGSTOP)         # gone without closing a socket
        return
    start = time.perf_counter()
    timer = threading.Timer(0.5 if rank == 1 else 1.0, lambda: out.put(("shut", rank, sockets.abort())))
    timer.start()
    try:
        if rank == 1:
            dist.all_reduce(torch.ones(4))           # needs the stopped rank 2
        else:
            dist.recv(torch.zeros(4), src=1, group=pair)   # rank 1 never sends
        out.put(("returned", rank, time.perf_counter() - start))
    except RuntimeError as err:
        out.put(("failed", rank, time.perf_counter() - start, "closed" in str(err).lower()))
    dist.destroy_process_group()
    dist.init_process_group("gloo", init_method=f"file://{new_store}", rank=rank, world_size=2)
    t = torch.full((3,), float(rank + 1))
    dist.all_reduce(t)
    out.put(("new group", rank, t.tolist(), captured))
    timer.join()             # a spawned process ends with os._exit, which would drop a timer still pending


def test_abort_wakes_blocked_collectives_and_the_process_can_rejoin(tmp_path):
    # file stores, not TCP ports picked ahead: a port released by a probe can be taken as an ephemeral port
    # by the first group's own connections before the rejoin binds it
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    stores = (str(tmp_path / "store"), str(tmp_path / "new-store"))
    procs = [ctx.Process(target=_worker, args=(r, *stores, out)) for r in range(3)]
    for p in procs:
        p.start()
    events = []
    try:
        for _ in range(6):
            try:
                events.append(out.get(timeout=120))
            except queue.Empty:
                raise AssertionError(f"events so far {events}; exit codes {[p.exitcode for p in procs]}")
    finally:
        for p in procs:
            if p.is_alive():
                os.kill(p.pid, signal.SIGKILL)
    failed = {e[1]: e for e in events if e[0] == "failed"}
    assert set(failed) == {0, 1}, events
    # rank 1 is woken by its own abort at 0.5 s; rank 0 by rank 1's (its peer closed) before its own at 1 s
    assert failed[1][2] < 5 and failed[1][3], failed[1]
    assert failed[0][2] < 5 and failed[0][3], failed[0]
    shut = {e[1]: e[2] for e in events if e[0] == "shut"}
    assert shut[1] >= 1
    rejoined = {e[1]: e for e in events if e[0] == "new group"}
    assert set(rejoined) == {0, 1} and all(e[2] == [3.0, 3.0, 3.0] and e[3] >= 2 for e in rejoined.values())


def test_abort_kind_follows_the_backend():
    from autohet_ray.runtime.abort import CollectiveSockets, NcclGroups, collective_abort
    assert isinstance(collective_abort("gloo"), CollectiveSockets)
    assert isinstance(collective_abort("nccl"), NcclGroups)
