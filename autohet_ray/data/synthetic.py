"""Synthetic training data: a deterministic global batch per (seed, step), the same on every rank."""
from __future__ import annotations

import torch


def synthetic_batch(*, vocab_size: int, global_batch: int, seq_len: int, seed: int, step: int) -> dict:
    """Random token ids; labels are the ids shifted by one (next-token prediction), last label ignored."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    ids = torch.randint(0, vocab_size, (global_batch, seq_len + 1), generator=gen)
    return {"input_ids": ids[:, :-1].contiguous(), "labels": ids[:, 1:].contiguous()}
