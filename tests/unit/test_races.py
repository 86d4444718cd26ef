"""The two races of issue 31, each forced with events rather than left to luck: a reader pauses in the middle of
its pass over a shared map while a second thread writes to it. Before the locks, the reader failed every time:
the notice board's `pending()` saw a notice without its acknowledgement event (KeyError), and the worker's
`storage_records` saw its handle map change size mid-iteration (RuntimeError)."""
from __future__ import annotations

import threading

import torch

from autohet_ray.checkpoint.snapshot import SnapshotHandle
from autohet_ray.recovery.notice_board import Notices
from autohet_ray.orchestrate.worker import Worker

WAIT_S = 10.0


class PausingDict(dict):
    """A dict whose first method named `pause_in` (or its iteration, "__iter__") stops until `go` is set,
    after setting `inside`: the interleaving the race needs, every time."""

    def __init__(self, *args, pause_in: str):
        super().__init__(*args)
        self.pause_in, self.inside, self.go = pause_in, threading.Event(), threading.Event()

    def _pause(self):
        if not self.inside.is_set():
            self.inside.set()
            assert self.go.wait(WAIT_S), "the test never released the paused thread"

    def setdefault(self, key, default=None):
        if self.pause_in == "setdefault":
            self._pause()
        return super().setdefault(key, default)

    def __iter__(self):
        for k, key in enumerate(super().__iter__()):
            yield key
            if k == 0 and self.pause_in == "__iter__":
                self._pause()


def run_in_thread(fn, *args) -> tuple[threading.Thread, dict]:
    out = {}

    def body():
        try:
            out["result"] = fn(*args)
        except Exception as exc:                # noqa: BLE001 - the race's symptom is the finding
            out["error"] = exc
    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, out


def interleave(paused: PausingDict, first, second) -> tuple[dict, dict]:
    """Run `first` until it pauses inside `paused`, run `second` meanwhile (it may block, as a lock makes it),
    then let both finish. Their outcomes."""
    a, out_a = run_in_thread(first)
    assert paused.inside.wait(WAIT_S), "the first call never reached the paused map"
    b, out_b = run_in_thread(second)
    b.join(0.5)                                  # unguarded: done (and wrong) by now; guarded: blocked
    paused.go.set()
    a.join(WAIT_S)
    b.join(WAIT_S)
    assert not a.is_alive() and not b.is_alive(), "a thread hung: the lock deadlocked"
    return out_a, out_b


def test_a_notice_is_never_seen_without_its_acknowledgement_event():
    board = Notices()
    board.acked = PausingDict(pause_in="setdefault")      # post() pauses between its two maps
    out_post, out_pending = interleave(board.acked, lambda: board.post("node-1", {"action": "terminate"}),
                                       board.pending)
    assert "error" not in out_post and "error" not in out_pending, (out_post, out_pending)
    assert out_pending["result"] in ({}, {"node-1": {"action": "terminate"}})
    assert board.pending() == {"node-1": {"action": "terminate"}}
    board.ack("node-1")
    assert board.pending() == {} and board.wait_ack("node-1", 0.0)


def test_storage_records_prunes_while_a_step_keeps_its_snapshot():
    threads = torch.get_num_threads()
    try:
        worker = Worker(rank=0)
    finally:
        torch.set_num_threads(threads)
    worker.handles = PausingDict({1: SnapshotHandle(1, 0, 0), 2: SnapshotHandle(2, 0, 0),
                                  3: SnapshotHandle(3, 0, 0)}, pause_in="__iter__")
    out_records, out_keep = interleave(worker.handles, lambda: worker.storage_records(3),
                                       lambda: worker.keep_snapshot(4, SnapshotHandle(4, 0, 0)))
    assert "error" not in out_records and "error" not in out_keep, (out_records, out_keep)
    assert out_records["result"] is None               # no storage lane in these snapshots
    assert sorted(worker.handles) == [3, 4]            # the older steps pruned, the new one kept
