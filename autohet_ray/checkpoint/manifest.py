"""Per-step manifests: what a step holds, where each chunk's replicas live, and whether it is usable.

A manifest is written last, atomically, once per tier, and only when its chunks tile every tensor
exactly and all come from this step with one agreed hash per chunk. Its JSON carries a hash of its own
body, so a damaged manifest is never mistaken for a committed step.
"""
from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field

from autohet_ray.checkpoint.chunk_hash import digest
from autohet_ray.checkpoint.errors import CheckpointError, IncompleteStepError
from autohet_ray.checkpoint.keys import chunk_key
from autohet_ray.layout import Chunk, covers_exactly
from autohet_ray.safe_names import UnsafeNameError, plain_name

SCHEMA_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class ChunkRecord:
    """One saved chunk of one tensor at one step."""
    step: int
    name: str
    global_shape: tuple[int, ...]
    chunk: Chunk
    dtype: str
    digest: str                       # hash of the serialized blob (codec.digest)
    nbytes: int                       # size of the serialized blob
    replicas: tuple[str, ...] = ()    # names of the tiers holding a copy

    @property
    def key(self) -> str:
        return chunk_key(self.step, self.name, self.chunk)

    def to_dict(self) -> dict:
        return {"chunk": self.chunk.to_dict(), "digest": self.digest, "nbytes": self.nbytes,
                "replicas": list(self.replicas)}


@dataclass(frozen=True, kw_only=True)
class Manifest:
    step: int
    records: tuple[ChunkRecord, ...]
    extra: dict = field(default_factory=dict)    # plain JSON the caller wants kept (plan id, rng, ...)

    def tensors(self) -> dict[str, list[ChunkRecord]]:
        out: dict[str, list[ChunkRecord]] = defaultdict(list)
        for record in self.records:
            out[record.name].append(record)
        return dict(out)

    def problems(self) -> list[str]:
        """Why this manifest is not usable (empty when it is)."""
        return _problems(self.step, self.records)

    def to_json(self) -> bytes:
        tensors = {}
        for name, records in sorted(self.tensors().items()):
            tensors[name] = {"global_shape": list(records[0].global_shape), "dtype": records[0].dtype,
                             "chunks": [r.to_dict() for r in sorted(records, key=lambda r: r.chunk.offsets)]}
        body = {"schema_version": SCHEMA_VERSION, "step": self.step, "tensors": tensors, "extra": self.extra}
        canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
        return json.dumps({"body": body, "digest": digest(canonical.encode())}, sort_keys=True,
                          separators=(",", ":")).encode()

    @staticmethod
    def from_json(raw: bytes, *, where: str = "") -> "Manifest":
        try:
            outer = json.loads(raw)
            body = outer["body"]
            canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
            algorithm = outer["digest"].partition(":")[0]
            ok = outer["digest"] == digest(canonical.encode(), algorithm)
        except (ValueError, KeyError, TypeError) as err:
            raise CheckpointError(f"manifest {where} is unreadable: {err}") from err
        if not ok:
            raise CheckpointError(f"manifest {where} fails its own hash check")
        if body.get("schema_version") != SCHEMA_VERSION:
            raise CheckpointError(f"manifest {where} has schema_version {body.get('schema_version')!r}, "
                                  f"this code reads {SCHEMA_VERSION}")
        step = int(body["step"])
        _check_names(body, f"manifest {where}".rstrip())
        records = []
        for name, entry in body["tensors"].items():
            for raw_chunk in entry["chunks"]:
                records.append(ChunkRecord(
                    step=step, name=name, global_shape=tuple(entry["global_shape"]),
                    chunk=Chunk.from_dict(raw_chunk["chunk"]), dtype=entry["dtype"], digest=raw_chunk["digest"],
                    nbytes=int(raw_chunk["nbytes"]), replicas=tuple(raw_chunk["replicas"])))
        return Manifest(step=step, records=tuple(records), extra=body.get("extra", {}))


def _check_names(body: dict, where: str) -> None:
    """UnsafeNameError unless every tensor name is a plain name and every chunk's offsets and sizes are
    non-negative integers: together they make each chunk's key, a path in a directory tier."""
    tensors = body.get("tensors")
    if not isinstance(tensors, dict):
        raise UnsafeNameError(f"{where}: field 'tensors' must be a map of tensor name to chunks, not "
                              f"{type(tensors).__name__}")
    for name, entry in tensors.items():
        plain_name(name, where=where, field="tensor name")
        for number, raw_chunk in enumerate(entry.get("chunks", []) if isinstance(entry, dict) else []):
            chunk = raw_chunk.get("chunk") if isinstance(raw_chunk, dict) else None
            for part in ("offsets", "sizes"):
                values = chunk.get(part) if isinstance(chunk, dict) else None
                if not isinstance(values, list) or not all(type(v) is int and v >= 0 for v in values):
                    raise UnsafeNameError(f"{where}: tensors[{name!r}].chunks[{number}].chunk.{part} {values!r} "
                                          "must be a list of non-negative integers")


def _problems(step: int, records) -> list[str]:
    problems = []
    by_name: dict[str, list[ChunkRecord]] = defaultdict(list)
    for record in records:
        if record.step != step:
            problems.append(f"{record.key} belongs to step {record.step}, not {step} (mixed steps)")
        by_name[record.name].append(record)
    for name, group in sorted(by_name.items()):
        shapes = {r.global_shape for r in group}
        dtypes = {r.dtype for r in group}
        if len(shapes) > 1 or len(dtypes) > 1:
            problems.append(f"{name}: records disagree on global shape {sorted(shapes)} or dtype {sorted(dtypes)}")
            continue
        seen: dict[Chunk, str] = {}
        for r in group:
            if seen.setdefault(r.chunk, r.digest) != r.digest:
                problems.append(f"{r.key}: two different hashes for one chunk (replicas diverged)")
        if not covers_exactly(list(seen), next(iter(shapes))):
            problems.append(f"{name}: chunks {[c.to_dict() for c in seen]} do not tile shape "
                            f"{list(next(iter(shapes)))} exactly")
    return problems


def merge_records(step: int, records, *, extra: dict | None = None) -> Manifest:
    """One manifest from the records every writer reported: copies of one chunk (TP or DP replicas, or
    several tiers) merge their replica lists. Raises IncompleteStepError unless the step is usable."""
    records = list(records)
    problems = _problems(step, records)
    if problems:
        raise IncompleteStepError(step, problems)
    merged: dict[tuple[str, Chunk], ChunkRecord] = {}
    for r in records:
        have = merged.get((r.name, r.chunk))
        replicas = r.replicas if have is None else tuple(dict.fromkeys(have.replicas + r.replicas))
        merged[(r.name, r.chunk)] = ChunkRecord(
            step=r.step, name=r.name, global_shape=r.global_shape, chunk=r.chunk, dtype=r.dtype,
            digest=r.digest, nbytes=r.nbytes, replicas=replicas)
    return Manifest(step=step, records=tuple(merged.values()), extra=dict(extra or {}))
