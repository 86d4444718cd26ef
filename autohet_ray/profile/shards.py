"""One TP rank's shard of a layer kind, as plain modules: the split linears (and token table) at their shard
shapes, without the TP collectives. measure.py times them alone; runtime/in_situ_cost.py beside the runtime's
TP modules."""
from __future__ import annotations

import torch
from torch import nn

from autohet_ray.nn import materialize

COLUMN_PARALLEL = ("attn.qkv", "mlp.fc1", "mlp.gate_up", "out")     # output features split by TP
ROW_PARALLEL = ("attn.proj", "mlp.fc2", "mlp.down")                  # input features split by TP


def shard_module(module: nn.Module, tp: int) -> nn.Module:
    """Replace the module's TP-split linears (and token table) by this rank's shard shapes, on meta."""
    for name, sub in list(module.named_modules()):
        parent, _, leaf = name.rpartition(".")
        owner = module.get_submodule(parent) if parent else module
        if isinstance(sub, nn.Linear) and name.endswith(COLUMN_PARALLEL):
            setattr(owner, leaf, nn.Linear(sub.in_features, sub.out_features // tp, bias=sub.bias is not None))
        elif isinstance(sub, nn.Linear) and name.endswith(ROW_PARALLEL):
            setattr(owner, leaf, nn.Linear(sub.in_features // tp, sub.out_features, bias=sub.bias is not None))
        elif isinstance(sub, nn.Embedding) and name == "tok":
            setattr(owner, leaf, nn.Embedding(sub.num_embeddings // tp, sub.embedding_dim))
    return module


def build_shard(make, tp: int, device: torch.device, dtype: torch.dtype, num_layers: int) -> nn.Module:
    with torch.device("meta"):
        module = shard_module(make(), tp)
    materialize(module, seed=0, num_layers=num_layers, device=device, dtype=dtype)
    return module
