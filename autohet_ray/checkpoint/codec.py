"""Chunk serialization: a small header (dtype, shape) + raw little-endian bytes, hashed as a whole.

Blob layout: MAGIC (4 bytes) | header length (4 bytes, little endian) | header JSON | payload.
The hash (blake2b-256 of the whole blob, so dtype and shape are covered too) is recorded in the manifest
and checked on every read from every tier.
"""
from __future__ import annotations

import hashlib
import json
import struct
import sys

import torch

from autohet_ray.checkpoint.errors import CorruptChunkError

MAGIC = b"AHC1"
_LEN = struct.Struct("<I")
HASH_NAME = "blake2b-256"
assert sys.byteorder == "little", "chunk payloads are stored little endian"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    assert isinstance(dtype, torch.dtype), f"not a torch dtype: {name!r}"
    return dtype


def digest(blob: bytes | memoryview) -> str:
    return f"{HASH_NAME}:{hashlib.blake2b(blob, digest_size=32).hexdigest()}"


def encode(tensor: torch.Tensor) -> bytes:
    """Serialize a CPU tensor (any dtype, any shape including scalars and empty tensors)."""
    t = tensor.detach()
    assert t.device.type == "cpu", f"encode a CPU copy, got a tensor on {t.device}"
    t = t.contiguous()
    header = json.dumps({"dtype": dtype_name(t.dtype), "shape": list(t.shape)}, separators=(",", ":")).encode()
    payload = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return b"".join((MAGIC, _LEN.pack(len(header)), header, payload))


def verify(blob: bytes, expected_digest: str, *, key: str, step: int, tier: str) -> None:
    """Raise CorruptChunkError unless the blob hashes to `expected_digest`."""
    got = digest(blob)
    if got != expected_digest:
        raise CorruptChunkError(key, step, tier, f"hash mismatch over {len(blob)} bytes "
                                                 f"(expected {expected_digest}, got {got})")


def decode(blob: bytes, *, key: str, step: int, tier: str) -> torch.Tensor:
    """Parse a verified blob back into a tensor (a fresh, writable copy)."""
    def corrupt(reason: str) -> CorruptChunkError:
        return CorruptChunkError(key, step, tier, reason)

    if len(blob) < 8 or blob[:4] != MAGIC:
        raise corrupt("bad magic or truncated header")
    (header_len,) = _LEN.unpack_from(blob, 4)
    try:
        header = json.loads(blob[8:8 + header_len])
        dtype, shape = dtype_from_name(header["dtype"]), tuple(header["shape"])
    except (ValueError, KeyError, AssertionError) as err:
        raise corrupt(f"unreadable header: {err}") from err
    payload = memoryview(blob)[8 + header_len:]
    numel = 1
    for n in shape:
        numel *= n
    expected = numel * torch.empty((), dtype=dtype).element_size()
    if len(payload) != expected:
        raise corrupt(f"payload has {len(payload)} bytes, header {dtype_name(dtype)}{list(shape)} needs {expected}")
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(payload), dtype=dtype).reshape(shape)


def header_of(tensor: torch.Tensor) -> tuple[str, tuple[int, ...]]:
    return dtype_name(tensor.dtype), tuple(tensor.shape)
