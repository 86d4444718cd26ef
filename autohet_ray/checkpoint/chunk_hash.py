"""Chunk digests, without torch: the node keepers check every copy they take and serve, and a keeper process
that imported torch would pay ~1.5 s of CPU at every start for nothing.

New blobs use XXH3-128 (~10 GB/s; detects bit flips and truncation: integrity, not protection against a
forger); blake2b-256 digests of older manifests still verify.
"""
from __future__ import annotations

import hashlib

import xxhash

from autohet_ray.checkpoint.errors import CorruptChunkError

HASH_NAME = "xxh3-128"
_HASHES = {"xxh3-128": lambda b: xxhash.xxh3_128(b).hexdigest(),
           "blake2b-256": lambda b: hashlib.blake2b(b, digest_size=32).hexdigest()}


def digest(blob, algorithm: str = HASH_NAME) -> str:
    """"<algorithm>:<hex>" of any bytes-like object."""
    return f"{algorithm}:{_HASHES[algorithm](blob)}"


def verify(blob, expected_digest: str, *, key: str, step: int, tier: str) -> None:
    """Raise CorruptChunkError unless the blob hashes to `expected_digest`."""
    algorithm = expected_digest.partition(":")[0]
    if algorithm not in _HASHES:
        raise CorruptChunkError(key, step, tier, f"unknown hash algorithm {algorithm!r} in the manifest; "
                                                 f"known: {', '.join(_HASHES)}")
    got = digest(blob, algorithm)
    if got != expected_digest:
        raise CorruptChunkError(key, step, tier, f"hash mismatch over {len(blob)} bytes "
                                                 f"(expected {expected_digest}, got {got})")
