"""Copies of chunks between stores (a keeper's upload to the storage, keeper-to-keeper replicas, stage-in) count
only when the bytes copied hash to the manifest's digest. A copy that fails is refused: not written, not
counted, and reported as a plain dict (it crosses Ray) that `report_refused` prints as one line on stderr."""
from __future__ import annotations

import logging

from autohet_ray.checkpoint.chunk_hash import verify
from autohet_ray.checkpoint.errors import ChunkMissingError, CorruptChunkError
from autohet_ray.checkpoint.keys import step_of_key

log = logging.getLogger(__name__)


def refusal(key: str, source: str, target: str, reason: str) -> dict:
    return {"key": key, "step": step_of_key(key), "tensor": key.split("/")[1] if "/" in key else key,
            "source": source, "target": target, "reason": reason}


def checked(key: str, blob, expected: str, *, source: str, target: str) -> dict | None:
    """None when `blob` (read from tier `source`) hashes to `expected`, else the refusal of its copy to `target`."""
    try:
        verify(blob, expected, key=key, step=step_of_key(key) or 0, tier=source)
    except CorruptChunkError as err:
        return refusal(key, source, target, err.reason)
    return None


def read_checked(read, key: str, expected: str, *, source: str, target: str):
    """(the chunk's bytes, None) when `read(key)` gives bytes that hash to `expected`; (None, refusal) when
    they do not or the chunk is missing."""
    try:
        blob = read(key)
    except ChunkMissingError:
        return None, refusal(key, source, target, "missing in the source store")
    problem = checked(key, blob, expected, source=source, target=target)
    return (None, problem) if problem else (blob, None)


def refusal_line(r: dict) -> str:
    return (f"autohet: copy refused: step {r['step']}, tensor {r['tensor']} ({r['key']}), "
            f"{r['source']} -> {r['target']}: {r['reason']}")


def report_refused(refused: list[dict], sink: list[str] | None = None) -> None:
    """Print one line per refused copy on stderr (and keep it in `sink`, e.g. a Committer's `skipped`)."""
    for r in refused:
        line = refusal_line(r)
        log.warning(line)
        if sink is not None:
            sink.append(line)
