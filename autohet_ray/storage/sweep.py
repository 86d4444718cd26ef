"""Removing what writers that died left in a storage: `.tmp-` files in a directory (a write that never reached
its rename) and abandoned multipart uploads on S3 (invisible, but billed). Only what is older than the job's
start is removed, so the temporaries of a writer still at work are safe."""
from __future__ import annotations

import sys
import time

from autohet_ray.storage.spec import location

S3_MARGIN_S = 2.0    # S3 reports an upload's start in whole seconds (and its clock is not ours): keep a margin


def sweep_storage(spec: dict, started_at: float, *, now: float | None = None) -> list[str]:
    """Remove the temporaries (a directory) or multipart uploads (S3) of the storage of tier spec `spec` older
    than `started_at` (a time.time() value: the job's start); one line on stderr when it removed any.
    Returns what it removed (paths or keys relative to the storage)."""
    from autohet_ray.checkpoint.tier_specs import direct_tier
    older_than_s = (time.time() if now is None else now) - started_at
    tier = direct_tier(spec)
    if spec["kind"] == "dir":
        removed = tier.sweep_temporaries(older_than_s)
        what = "temporary files"
    else:
        assert spec["kind"] == "s3", spec
        try:
            removed = tier.sweep_multipart(older_than_s + S3_MARGIN_S)
        finally:
            tier.close()
        what = "abandoned multipart uploads"
    if removed:
        print(f"autohet: removed {len(removed)} {what} older than the job's start from {location(spec, '')} "
              f"(left by writers that stopped), e.g. {removed[0]}", file=sys.stderr)
    return removed


def sweep_or_warn(spec: dict, started_at: float, when: str) -> list[str]:
    """`sweep_storage`, where a failure (an unreachable storage) is one line on stderr, not the job's end:
    nothing committed depends on the sweep."""
    try:
        return sweep_storage(spec, started_at)
    except Exception as err:      # noqa: BLE001 - reported; a later start or close sweeps again
        print(f"autohet: sweeping {location(spec, '')} at {when} failed: {type(err).__name__}: "
              f"{str(err).splitlines()[0] if str(err) else ''}", file=sys.stderr)
        return []
