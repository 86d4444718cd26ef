"""Build a stage's module directly in its TP shard: meta model -> TP modules -> deterministic init.

Which dimension of which parameter TP splits (None: replicated on every TP rank of the stage):
column-parallel linears split weight and bias along dim 0, row-parallel linears the weight along dim 1
(bias replicated), the vocab-parallel embedding its table along dim 0.
"""
from __future__ import annotations

import torch
from torch import nn

from autohet_ray.layout import Chunk, shard_chunk
from autohet_ray.model.spec import ModelSpec
from autohet_ray.nn import StageModel, materialize
from autohet_ray.plan.rankmap import build_rank_map
from autohet_ray.plan.schema import Plan
from autohet_ray.runtime.tp import ColumnParallelLinear, RowParallelLinear, TPContext, VocabParallelEmbedding

COLUMN_PARALLEL = ("attn.qkv", "mlp.fc1", "mlp.gate_up", "head.out")
ROW_PARALLEL = ("attn.proj", "mlp.fc2", "mlp.down")
VOCAB_PARALLEL = ("embedding.tok",)

Layout = dict[str, tuple[tuple[int, ...], Chunk]]     # param name -> (global shape, chunk held)


def _module_style(module_name: str) -> str | None:
    for style, suffixes in (("column", COLUMN_PARALLEL), ("row", ROW_PARALLEL), ("vocab", VOCAB_PARALLEL)):
        if module_name.endswith(suffixes):
            return style
    return None


def shard_dim(param_name: str) -> int | None:
    """The dimension TP splits `param_name` along, or None when TP replicates it."""
    module_name, _, kind = param_name.rpartition(".")
    style = _module_style(module_name)
    if style in ("column", "vocab"):
        return 0
    if style == "row" and kind == "weight":
        return 1
    return None


def param_chunk(param_name: str, shape: tuple[int, ...], tp_size: int, tp_rank: int) -> Chunk:
    return shard_chunk(shape, shard_dim(param_name), tp_size, tp_rank)


def _replacement(style: str, module: nn.Module, tp: TPContext, dtype: torch.dtype) -> nn.Module:
    kw = dict(tp=tp, device="meta", dtype=dtype)
    if style == "vocab":
        return VocabParallelEmbedding(module.num_embeddings, module.embedding_dim, **kw)
    cls = ColumnParallelLinear if style == "column" else RowParallelLinear
    return cls(module.in_features, module.out_features, bias=module.bias is not None, **kw)


def _apply_tp(model: nn.Module, tp: TPContext, dtype: torch.dtype) -> None:
    for name, module in list(model.named_modules()):
        style = _module_style(name)
        if style is None:
            continue
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, _replacement(style, module, tp, dtype))


def build_stage_model(spec: ModelSpec, *, layers: tuple[int, int], first: bool, last: bool, tp: TPContext,
                      seed: int, device: torch.device, dtype: torch.dtype) -> tuple[StageModel, Layout]:
    """The stage's module holding this TP rank's shard of every parameter, and the layout of each."""
    for n, what in ((spec.num_heads, "num_heads"), (spec.num_kv_heads, "num_kv_heads"),
                    (spec.ffn_hidden, "ffn_hidden"), (spec.vocab_size, "vocab_size")):
        assert n % tp.size == 0, f"{what}={n} is not divisible by TP degree {tp.size}"
    with torch.device("meta"):
        model = StageModel(spec, layers=layers, first=first, last=last).to(dtype=dtype)
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    _apply_tp(model, tp, dtype)
    layout = {name: (shape, param_chunk(name, shape, tp.size, tp.rank)) for name, shape in shapes.items()}
    materialize(model, seed=seed, num_layers=spec.num_layers, device=device, dtype=dtype, layout=layout)
    return model, layout


def rank_layouts(plan: Plan, spec: ModelSpec) -> list[Layout]:
    """Every plan rank's layout, as its Engine will build it, without building one (for the driver, which
    moves a restore's chunks to the nodes that will need them while the workers start)."""
    rank_map = build_rank_map(plan, spec.num_layers)
    shapes: dict[tuple, dict[str, tuple[int, ...]]] = {}     # (layers, first, last) -> parameter global shapes
    out = []
    for info in rank_map.ranks:
        stages = plan.pipelines[info.pipeline].stages
        stage = (tuple(stages[info.stage].layers), info.stage == 0, info.stage == len(stages) - 1)
        if stage not in shapes:
            with torch.device("meta"):
                model = StageModel(spec, layers=stage[0], first=stage[1], last=stage[2])
            shapes[stage] = {name: tuple(p.shape) for name, p in model.named_parameters()}
        tp_size = len(rank_map.tp_group(info.rank))
        out.append({name: (shape, param_chunk(name, shape, tp_size, info.tp_rank))
                    for name, shape in shapes[stage].items()})
    return out
