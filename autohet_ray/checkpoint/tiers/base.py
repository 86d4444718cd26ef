"""The storage-tier interface every tier implements (memory/keeper, local directory, S3, throttled).

Keys are the strings of `checkpoint/keys.py`. Blobs are opaque bytes: tiers never interpret or verify them
(the reader verifies hashes against the manifest). Manifests are created atomically and at most once:
`put_manifest` of a different body for a committed step raises ManifestExistsError; the same body is a no-op.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

from autohet_ray.checkpoint.errors import ManifestExistsError


@runtime_checkable
class Tier(Protocol):
    name: str

    def put_chunk(self, key: str, blob: bytes) -> None: ...
    def get_chunk(self, key: str) -> bytes: ...          # ChunkMissingError / TierUnavailableError
    def has(self, key: str) -> bool: ...
    def list(self, prefix: str = "") -> list[str]: ...   # chunk keys (never manifests) under prefix, sorted
    def delete(self, key: str) -> None: ...              # idempotent
    def delete_many(self, keys: list[str]) -> None: ...  # idempotent; one request where the tier allows
    def put_manifest(self, step: int, body: bytes) -> None: ...
    def get_manifest(self, step: int) -> bytes: ...      # ChunkMissingError when absent
    def list_manifests(self) -> list[int]: ...           # steps with a manifest, ascending
    def delete_manifest(self, step: int) -> None: ...    # idempotent


def put_all(tier: Tier, items: list[tuple[str, bytes]]) -> None:
    """Write (key, blob) pairs: one batch where the tier takes batches (a keeper: one actor call), else one by
    one."""
    batch = getattr(tier, "put_chunks", None)
    if batch is not None:
        batch(items)
        return
    for key, blob in items:
        tier.put_chunk(key, blob)


def resolve_existing_manifest(tier_name: str, step: int, existing: bytes, body: bytes) -> None:
    """Conditional create lost the race: fine when the stored manifest is ours, a conflict otherwise."""
    if existing != body:
        raise ManifestExistsError(step, tier_name)
