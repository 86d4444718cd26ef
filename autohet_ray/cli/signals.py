"""How `autohet train` and `autohet resume` end: stop signals, and the exit status of a run.

SIGTERM (`ray job stop`, a spot reclaim, Kubernetes), SIGHUP (a closed terminal) and SIGINT (Ctrl-C) each
raise in the main thread once, so the controller's exit path runs (Controller.close with the signal's name:
the newest step secured in node stores and printed before the storage is tried). A second signal while it
runs is noted and ignored: cutting the exit path short gains nothing that SIGKILL would not, and SIGKILL
leaves a resumable state.

Exit status: 0 done; 2 bad input (cli.py); EXIT_GAVE_UP (4) when a step raised or recovery gave up (after
securing what was committed; the messages say where it is); EXIT_NOT_IN_STORAGE (3) when the job ended
otherwise but the newest step it reached is not in the storage (the message says where it is instead);
128 + the signal's number when a signal stopped the job.
"""
from __future__ import annotations

import contextlib
import signal
import sys

from autohet_ray.recovery.report import EXIT_GAVE_UP, EXIT_NOT_IN_STORAGE

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


class Stopped(SystemExit):
    """A stop signal (SIGTERM or SIGHUP) in the main thread; exits with 128 + its number."""

    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signum = signum


_received: list[int] = []        # the stop signal of the running block (stop_signals), once one came


def stopped_by() -> int | None:
    """The stop signal received inside the running stop_signals block, if any. Ask this rather than the
    exception's type: Ray turns an exception raised by a signal handler during ray.wait into a plain
    SystemExit(1)."""
    return _received[0] if _received else None


def as_raised(signum: int) -> BaseException:
    """The exception a stop signal ends the run with (its exit status: 128 + its number)."""
    return KeyboardInterrupt() if signum == signal.SIGINT else Stopped(signum)


@contextlib.contextmanager
def stop_signals():
    """Install the handlers of STOP_SIGNALS (the main thread only) for the block; restore the previous ones."""
    received = _received
    received.clear()

    def stop(signum, _frame):
        if received:
            print(f"autohet: {signal.Signals(signum).name} again: still securing the newest step (SIGKILL "
                  f"leaves it resumable)", file=sys.stderr, flush=True)
            return
        received.append(signum)
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Stopped(signum)
    previous = {signum: signal.signal(signum, stop) for signum in STOP_SIGNALS}
    try:
        yield received
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def exit_status(out: dict) -> int:
    """The exit status of a run that ended without a signal (see the module docstring)."""
    if out.get("failure"):
        return EXIT_GAVE_UP
    return EXIT_NOT_IN_STORAGE if out["secured"].get("in_storage") is False else 0
