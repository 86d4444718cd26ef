"""Failures that do not stop the job, each printed as it happens: one line on stderr naming the step, what
failed (a tensor's chunk, a node's keeper, an upload), the tier and the reason. The job's exit codes for an
ending that left something undone live here too, so every entry point reports them alike."""
from __future__ import annotations

import logging

log = logging.getLogger(__name__)

EXIT_NOT_IN_STORAGE = 3      # the newest step did not reach the storage (it is in node stores, or was lost)
EXIT_GAVE_UP = 4             # the job stopped on a failure: a step raised, or recovery gave up (before 3)


def one_line(reason) -> str:
    """The first non-empty line of `reason` (a Ray error carries its remote traceback below it)."""
    lines = [line.strip() for line in str(reason).splitlines() if line.strip()]
    return lines[0] if lines else type(reason).__name__


def report_failure(step: int | None, what: str, tier: str | None, reason) -> str:
    """Print `autohet: step S: WHAT [tier T]: REASON` on stderr; returns the line (without the prefix)."""
    line = f"step {step if step is not None else '-'}: {what}" + (f" [tier {tier}]" if tier else "") + \
        f": {one_line(reason)}"
    log.warning(f"autohet: {line}")
    return line
