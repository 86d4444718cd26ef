"""Embedding, head and a stage model (a contiguous range of layers) built from a ModelSpec.

Parameter names are the same in every stage and in the whole model: `embedding.tok.weight`,
`layers.{i}.attn.qkv.weight` (global layer index i), `head.out.weight`, ...
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from autohet_ray.model.spec import ModelSpec
from autohet_ray.nn.init import init_chunk
from autohet_ray.nn.layers import Block, make_norm


class Embedding(nn.Module):
    """Token embedding (+ learned positions for gpt/bert; + token type 0 and LayerNorm for bert)."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.tok = nn.Embedding(spec.vocab_size, spec.hidden)
        self.pos = nn.Embedding(spec.max_seq_len, spec.hidden) if spec.family != "llama" else None
        self.tok_type = nn.Embedding(2, spec.hidden) if spec.family == "bert" else None
        self.norm = make_norm(spec, spec.hidden) if spec.family == "bert" else None

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids)
        if self.pos is not None:
            x = x + self.pos.weight[: ids.shape[1]]
        if self.tok_type is not None:
            x = x + self.tok_type.weight[0]
        return self.norm(x) if self.norm is not None else x


class Head(nn.Module):
    """Final norm + untied output projection (bert: dense + GELU + LayerNorm + decoder with bias)."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        bert = spec.family == "bert"
        self.dense = nn.Linear(spec.hidden, spec.hidden) if bert else None
        self.norm = make_norm(spec, spec.hidden)
        self.out = nn.Linear(spec.hidden, spec.vocab_size, bias=bert)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.dense is not None:
            x = F.gelu(self.dense(x))
        return self.out(self.norm(x))


class StageModel(nn.Module):
    """Layers [start, end), with the embedding when `first` and the head when `last`.

    forward takes token ids [batch, seq] on a first stage, hidden states [batch, seq, hidden] otherwise, and
    returns logits [batch, seq, vocab] on a last stage, hidden states otherwise.
    """

    def __init__(self, spec: ModelSpec, *, layers: tuple[int, int], first: bool, last: bool):
        super().__init__()
        start, end = layers
        assert 0 <= start < end <= spec.num_layers or (start == end and first and last), layers
        self.embedding = Embedding(spec) if first else None
        self.layers = nn.ModuleDict({str(i): Block(spec) for i in range(start, end)})
        self.head = Head(spec) if last else None
        self.recompute = False     # keep only each block's input; rebuild the rest in the backward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embedding is not None:
            x = self.embedding(x)
        for block in self.layers.values():
            x = checkpoint(block, x, use_reentrant=False) if self.recompute and torch.is_grad_enabled() else block(x)
        return self.head(x) if self.head is not None else x


def build_model(spec: ModelSpec) -> StageModel:
    """The whole model (all layers, embedding and head)."""
    return StageModel(spec, layers=(0, spec.num_layers), first=True, last=True)


def param_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """Global shape of every parameter of the whole model, without allocating it."""
    with torch.device("meta"):
        model = build_model(spec)
    return {name: tuple(p.shape) for name, p in model.named_parameters()}


TIED = ("embedding.tok.weight", "head.out.weight")
"""A model with tied embeddings holds one tensor twice: the first stage's embedding and the last stage's head
(so stages own disjoint parameters); their gradients are summed and their values stay equal."""


def tied_names(spec: ModelSpec) -> tuple[str, str] | None:
    """(embedding, head) parameter names when `spec` ties them, else None."""
    return TIED if spec.tie_embeddings else None


def init_tied_head(model: nn.Module, layout: dict, *, seed: int, num_layers: int) -> None:
    """Give a stage's tied head the embedding's initial values (chunk by chunk, as `materialize` does).
    `layout`: name -> (global shape, chunk held)."""
    params = dict(model.named_parameters())
    shape, chunk = layout[TIED[1]]
    with torch.no_grad():
        head = params[TIED[1]]
        head.copy_(init_chunk(TIED[0], shape, chunk, seed=seed, num_layers=num_layers, dtype=head.dtype,
                              device=head.device))
