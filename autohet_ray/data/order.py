"""The sample order: one seeded permutation per epoch, a function of (seed, epoch, number of samples) only.

No plan, pipeline count or worker enters it, so every plan, every re-plan after a loss and every resume reads
the same samples in the same order. The permutation is a keyed 4-round Feistel network (round function:
SplitMix64's finaliser) over the smallest even-bit power of two >= N, walked in cycles back into [0, N): a
bijection of [0, N) computed per position, so a batch costs O(batch) whatever N is, and integer arithmetic
only, the same on every numpy version and machine.
Global batch i is positions [i*B, (i+1)*B) of the endless sequence epoch 0, epoch 1, ...; a batch may run
across an epoch boundary, so every sample is read exactly once per epoch.
"""
from __future__ import annotations

import numpy as np

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
FEISTEL_ROUNDS = 4


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: a bijection of uint64 (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(_GOLDEN)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _round_keys(seed: int, epoch: int) -> np.ndarray:
    base = [(seed * _GOLDEN + epoch) & _MASK64, seed & _MASK64, epoch & _MASK64]
    mixed = _splitmix64(np.array(base, dtype=np.uint64))
    return _splitmix64(mixed[0] ^ (mixed[1] + np.arange(FEISTEL_ROUNDS, dtype=np.uint64) * mixed[2]))


def _feistel(x: np.ndarray, keys: np.ndarray, half_bits: int) -> np.ndarray:
    half = np.uint64((1 << half_bits) - 1)
    shift = np.uint64(half_bits)
    left, right = x >> shift, x & half
    for key in keys:
        left, right = right, left ^ (_splitmix64(right ^ key) & half)
    return (left << shift) | right


def permute(positions: np.ndarray, seed: int, epoch: int, num_samples: int) -> np.ndarray:
    """The samples at `positions` (in [0, num_samples)) of `epoch`'s order, as int64."""
    assert num_samples >= 1 and epoch >= 0, (num_samples, epoch)
    assert positions.size == 0 or (positions.min() >= 0 and positions.max() < num_samples), positions
    half_bits = max(1, ((num_samples - 1).bit_length() + 1) // 2)
    keys = _round_keys(seed, epoch)
    with np.errstate(over="ignore"):
        out = _feistel(positions.astype(np.uint64), keys, half_bits)
        outside = out >= np.uint64(num_samples)
        while outside.any():                     # cycle-walk: the domain is < 4 N, so a few rounds at most
            out[outside] = _feistel(out[outside], keys, half_bits)
            outside = out >= np.uint64(num_samples)
    return out.astype(np.int64)


def epoch_permutation(seed: int, epoch: int, num_samples: int) -> np.ndarray:
    """The whole order of `epoch` (samples 0..num_samples-1 as they are read)."""
    return permute(np.arange(num_samples, dtype=np.int64), seed, epoch, num_samples)


def sample_ids(step: int, global_batch: int, num_samples: int, seed: int) -> np.ndarray:
    """The sample ids of global batch `step` (int64 [global_batch]), in batch row order."""
    assert step >= 0 and global_batch >= 1, (step, global_batch)
    positions = np.arange(step * global_batch, (step + 1) * global_batch, dtype=np.int64)
    epochs, offsets = np.divmod(positions, num_samples)
    ids = np.empty(global_batch, dtype=np.int64)
    for epoch in np.unique(epochs):
        rows = epochs == epoch
        ids[rows] = permute(offsets[rows], seed, int(epoch), num_samples)
    return ids
