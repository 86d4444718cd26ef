"""Deterministic parameter initialization that is cheap to shard.

Every parameter is a function of (seed, name) only: the tensor (viewed as rows x columns) is cut into fixed
tiles, each drawn from its own generator seeded by a hash of (seed, name, tile). Any rectangular chunk is
then materialized by drawing just the tiles it touches, so a TP shard never needs the full tensor and
every shard of every plan agrees with a single-process model bit for bit.
"""
from __future__ import annotations

import hashlib
import math

import torch

from autohet_ray.layout import Chunk, overlap, to_local

TILE_ROWS = 256
TILE_COLS = 1024
INIT_STD = 0.02
# output projections of residual branches get INIT_STD / sqrt(2 * num_layers) (GPT-2)
RESIDUAL_OUTPUTS = ("attn.proj.weight", "mlp.fc2.weight", "mlp.down.weight")


def init_rule(name: str, num_layers: int) -> tuple[str, float]:
    """("zeros" | "ones" | "normal", std) for a parameter name."""
    if name.endswith(".bias"):
        return "zeros", 0.0
    if name.endswith("norm.weight"):
        return "ones", 0.0
    if name.endswith(RESIDUAL_OUTPUTS):
        return "normal", INIT_STD / math.sqrt(2 * num_layers)
    return "normal", INIT_STD


def _tile_seed(seed: int, name: str, ti: int, tj: int) -> int:
    digest = hashlib.blake2b(f"{seed}/{name}/{ti}/{tj}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def _as_2d(shape: tuple[int, ...], chunk: Chunk) -> tuple[tuple[int, int], Chunk]:
    """The tensor as rows x columns: dim 0 is rows, the rest (at most one more dim) columns."""
    assert 1 <= len(shape) <= 2, shape
    if len(shape) == 1:
        return (shape[0], 1), Chunk((chunk.offsets[0], 0), (chunk.sizes[0], 1))
    return (shape[0], shape[1]), chunk


def _normal_chunk(seed: int, name: str, shape: tuple[int, ...], chunk: Chunk) -> torch.Tensor:
    (rows, cols), region = _as_2d(shape, chunk)
    out = torch.empty(region.sizes, dtype=torch.float32)
    (r0, c0), (r1, c1) = region.offsets, region.ends
    for ti in range(r0 // TILE_ROWS, -(-r1 // TILE_ROWS)):
        for tj in range(c0 // TILE_COLS, -(-c1 // TILE_COLS)):
            tile = Chunk((ti * TILE_ROWS, tj * TILE_COLS),
                         (min(TILE_ROWS, rows - ti * TILE_ROWS), min(TILE_COLS, cols - tj * TILE_COLS)))
            common = overlap(tile, region)
            if common is None:
                continue
            gen = torch.Generator().manual_seed(_tile_seed(seed, name, ti, tj))
            values = torch.randn(tile.sizes, generator=gen, dtype=torch.float32)
            out[to_local(common, region)] = values[to_local(common, tile)]
    return out.reshape(chunk.sizes)


def init_chunk(name: str, shape: tuple[int, ...], chunk: Chunk, *, seed: int, num_layers: int,
               dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> torch.Tensor:
    """The values of `chunk` of parameter `name` (global `shape`)."""
    kind, std = init_rule(name, num_layers)
    if kind == "zeros":
        values = torch.zeros(chunk.sizes)
    elif kind == "ones":
        values = torch.ones(chunk.sizes)
    else:
        values = _normal_chunk(seed, name, tuple(shape), chunk) * std
    return values.to(dtype=dtype, device=device)


def materialize(module: torch.nn.Module, *, seed: int, num_layers: int, device: torch.device | str,
                dtype: torch.dtype, layout: dict[str, tuple[tuple[int, ...], Chunk]] | None = None) -> None:
    """Allocate a module built on the meta device and fill every parameter from (seed, name).

    `layout` maps a parameter name to (global shape, chunk this module holds); absent names hold the whole
    tensor (their local shape is the global shape).
    """
    module.to(dtype=dtype)
    module.to_empty(device=device)
    layout = layout or {}
    with torch.no_grad():
        for name, param in module.named_parameters():
            shape, chunk = layout.get(name, (tuple(param.shape), Chunk.whole(tuple(param.shape))))
            assert tuple(param.shape) == chunk.sizes, (name, param.shape, chunk)
            param.copy_(init_chunk(name, shape, chunk, seed=seed, num_layers=num_layers, dtype=dtype,
                                   device=device))
