"""Masked-language modelling for bidirectional models (BERT), as in Devlin et al. 2019: 15% of each
sequence's tokens are chosen (an exact count per sequence, at least one, as BERT's own data preparation does);
of those 80% become the mask token, 10% a random token, 10% stay. Labels hold the original token at the chosen
positions and the loss's ignore index elsewhere. The choice is seeded by (seed, step) and made on the whole
global batch, so no plan influences it."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

IGNORE_INDEX = -100             # the runtime's cross-entropy ignore index (runtime/vocab_ce.py)
MASK_PROBABILITY = 0.15
REPLACE_WITH_MASK = 0.8
REPLACE_WITH_RANDOM = 0.1
_MLM_STREAM = 0x6D6C6D5F6D61736B    # keeps the masking's random stream apart from the synthetic batches'


def mask_tokens(batch: dict, *, mask_id: int, vocab_size: int, seed: int, step: int,
                special_ids: tuple[int, ...] = (), probability: float = MASK_PROBABILITY) -> dict:
    """A copy of `batch` whose "input_ids" are masked and whose "labels" are the MLM targets; tokens in
    `special_ids` (e.g. the EOS separator) are never chosen."""
    import torch  # lazy: torch; tokenizing workers import data/ without it
    ids = batch["input_ids"]
    assert ids.dtype == torch.long and ids.dim() == 2, (ids.dtype, ids.shape)
    assert 0 <= mask_id < vocab_size and 0.0 < probability < 1.0, (mask_id, vocab_size, probability)
    gen = torch.Generator().manual_seed(((seed * 1_000_003 + step) ^ _MLM_STREAM) & ((1 << 63) - 1))
    eligible = ~torch.isin(ids, torch.tensor(list(special_ids), dtype=torch.long))
    chosen = _choose_exact(eligible, probability, gen)
    action = torch.rand(ids.shape, generator=gen)
    to_mask = chosen & (action < REPLACE_WITH_MASK)
    to_random = chosen & (action >= REPLACE_WITH_MASK) & (action < REPLACE_WITH_MASK + REPLACE_WITH_RANDOM)
    random_tokens = torch.randint(0, vocab_size, ids.shape, generator=gen)
    masked = torch.where(to_mask, torch.full_like(ids, mask_id), torch.where(to_random, random_tokens, ids))
    labels = torch.where(chosen, ids, torch.full_like(ids, IGNORE_INDEX))
    return batch | {"input_ids": masked, "labels": labels}


def _choose_exact(eligible: torch.Tensor, probability: float, gen: torch.Generator) -> torch.Tensor:
    """Per row, round(probability * eligible tokens) of its eligible positions (at least one), uniformly."""
    import torch  # lazy: torch; data/ imports without it
    counts = eligible.sum(dim=1)
    wanted = torch.clamp(torch.round(counts * probability), min=1).minimum(counts)
    keys = torch.rand(eligible.shape, generator=gen).masked_fill(~eligible, 2.0)
    ranks = keys.argsort(dim=1).argsort(dim=1)
    return ranks < wanted.unsqueeze(1)
