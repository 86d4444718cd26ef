"""Chunk serialization: a small header (dtype, shape) + raw little-endian bytes, hashed as a whole.

Blob layout: MAGIC (4 bytes) | header length (4 bytes, little endian) | header JSON, space-padded so the
payload starts at a multiple of 64 bytes | payload. `encode` copies the tensor straight into the blob (the
snapshot's only copy). The hash of the whole blob (so dtype and shape are covered too) is recorded in the
manifest as "<algorithm>:<hex>" and checked on every read from every tier. New blobs use XXH3-128 (~10 GB/s,
it detects bit flips and truncation; integrity, not protection against a forger); blake2b-256 digests of
older manifests still verify.
"""
from __future__ import annotations

import json
import mmap
import struct
import sys

import torch

from autohet_ray.checkpoint.chunk_hash import HASH_NAME, digest, verify  # noqa: F401  (re-exported)
from autohet_ray.checkpoint.errors import CorruptChunkError

MAGIC = b"AHC1"
_LEN = struct.Struct("<I")
PAYLOAD_ALIGN = 64
assert sys.byteorder == "little", "chunk payloads are stored little endian"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    assert isinstance(dtype, torch.dtype), f"not a torch dtype: {name!r}"
    return dtype


def encode(tensor: torch.Tensor, out: bytearray | None = None) -> bytearray:
    """Serialize a tensor (any dtype and shape, scalars and empty tensors included; a GPU tensor is copied
    to host on the way) with one copy of its data; into `out` when it has exactly the right size."""
    t = tensor.detach()
    header = json.dumps({"dtype": dtype_name(t.dtype), "shape": list(t.shape)}, separators=(",", ":")).encode()
    header += b" " * (-(len(MAGIC) + _LEN.size + len(header)) % PAYLOAD_ALIGN)
    offset = len(MAGIC) + _LEN.size + len(header)
    size = offset + t.numel() * t.element_size()
    blob = out if out is not None and len(out) == size else bytearray(size)
    blob[:offset] = MAGIC + _LEN.pack(len(header)) + header
    if t.numel():
        view = torch.frombuffer(blob, dtype=torch.uint8, offset=offset).view(t.dtype).view(t.shape)
        view.copy_(t)
    return blob


def decode(blob, *, key: str, step: int, tier: str) -> torch.Tensor:
    """Parse a verified blob (any bytes-like object) back into a tensor (a fresh, writable copy)."""
    def corrupt(reason: str) -> CorruptChunkError:
        return CorruptChunkError(key, step, tier, reason)

    private = isinstance(memoryview(blob).obj, mmap.mmap) and not memoryview(blob).readonly
    blob = memoryview(blob).cast("B")
    if len(blob) < 8 or bytes(blob[:4]) != MAGIC:
        raise corrupt("bad magic or truncated header")
    (header_len,) = _LEN.unpack_from(blob, 4)
    try:
        header = json.loads(bytes(blob[8:8 + header_len]))
        dtype, shape = dtype_from_name(header["dtype"]), tuple(header["shape"])
    except (ValueError, KeyError, AssertionError) as err:
        raise corrupt(f"unreadable header: {err}") from err
    payload = blob[8 + header_len:]
    numel = 1
    for n in shape:
        numel *= n
    expected = numel * torch.empty((), dtype=dtype).element_size()
    if len(payload) != expected:
        raise corrupt(f"payload has {len(payload)} bytes, header {dtype_name(dtype)}{list(shape)} needs {expected}")
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    if private:                     # a private copy-on-write mapping (LocalDirTier): already our own copy
        return torch.frombuffer(payload, dtype=dtype).reshape(shape)
    return torch.frombuffer(bytearray(payload), dtype=dtype).reshape(shape)


def header_of(tensor: torch.Tensor) -> tuple[str, tuple[int, ...]]:
    return dtype_name(tensor.dtype), tuple(tensor.shape)
