"""Removing what writers that died left in a storage: `.tmp-` files in a directory (a write that never reached
its rename) and abandoned multipart uploads on S3 (invisible, but billed). Only what is older than the job's
start is removed, at its start and at its close, so the temporaries of a writer still at work are safe.

A directory's temporaries are dated by their mtime. S3 dates an upload in whole seconds by its own clock (and
some servers, moto among them, report a fixed date), so at the start the uploads the server dates before the
start (less a margin) are aborted and the ids of the other pending ones are kept; at the close those still
pending are aborted (they began before the start); uploads begun after the start are never touched then."""
from __future__ import annotations

import logging
import time

from autohet_ray.checkpoint.tier_specs import direct_tier
from autohet_ray.storage.spec import location

log = logging.getLogger(__name__)

S3_MARGIN_S = 2.0


class StorageSweeper:
    """The sweeps of one job (`started_at`: its start, a time.time() value) over the storage of tier spec `spec`."""

    def __init__(self, spec: dict, started_at: float):
        self.spec, self.started_at = spec, started_at
        self.pending_at_start: set[str] = set()         # S3 upload ids pending at the start, not yet aborted

    def at_start(self) -> list[str]:
        tier = self._tier()
        if self.spec["kind"] == "dir":
            return self._said(tier.sweep_temporaries(time.time() - self.started_at))
        try:
            removed = tier.sweep_multipart(time.time() - self.started_at + S3_MARGIN_S)
            self.pending_at_start = set(tier.multipart_ids())
        finally:
            tier.close()
        return self._said(removed)

    def at_close(self) -> list[str]:
        tier = self._tier()
        if self.spec["kind"] == "dir":
            return self._said(tier.sweep_temporaries(time.time() - self.started_at))
        try:
            removed = tier.abort_multipart(self.pending_at_start)
        finally:
            tier.close()
        self.pending_at_start = set()
        return self._said(removed)

    def _tier(self):
        assert self.spec["kind"] in ("dir", "s3"), self.spec
        return direct_tier(self.spec)

    def _said(self, removed: list[str]) -> list[str]:
        """`removed`, after one line on stderr when it is not empty."""
        what = "temporary files" if self.spec["kind"] == "dir" else "abandoned multipart uploads"
        if removed:
            log.warning(f"autohet: removed {len(removed)} {what} older than the job's start from "
                        f"{location(self.spec, '')} (left by writers that stopped), e.g. {removed[0]}")
        return removed


def sweep_or_warn(sweep, spec: dict, when: str) -> list[str]:
    """`sweep()` (a StorageSweeper's at_start or at_close), where a failure (an unreachable storage) is one line
    on stderr, not the job's end: nothing committed depends on the sweep."""
    try:
        return sweep()
    except Exception as err:      # noqa: BLE001 - reported; a later start or close sweeps again
        log.warning(f"autohet: sweeping {location(spec, '')} at {when} failed: {type(err).__name__}: "
                    f"{str(err).splitlines()[0] if str(err) else ''}")
        return []
