"""The cost model's activation memory (model/costs.activation_bytes_per_token) equals what the runtime's own
block keeps for backward: the distinct storages autograd saves, counted with saved_tensors_hooks while one block
runs forward in bf16, per token as the difference between batch 4 and batch 2 (weights and rope tables do not grow
with the batch). The block's input is left out, as the model counts it where it is produced.

TP2 runs one rank's shard of the block (runtime/parallelize.py) in this process, on a one-member gloo group: the
TP all-reduce then sums nothing, but every tensor the rank keeps has the shape it has on a real TP2 rank.
"""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.distributed as dist

from autohet_ray.model.costs import activation_bytes_per_token
from autohet_ray.model.spec import ModelSpec
from autohet_ray.nn.saved_bytes import saved_bytes
from autohet_ray.runtime.parallelize import build_stage_model
from autohet_ray.runtime.tp import TPContext

SEQ = 128
TOLERANCE = 0.03

BASE = ModelSpec(name="act-llama", family="llama", num_layers=1, hidden=256, num_heads=8, num_kv_heads=8,
                 ffn_hidden=688, vocab_size=512, max_seq_len=SEQ)
SPECS = {
    "llama-mha": BASE,
    "llama-gqa": replace(BASE, name="act-llama-gqa", num_kv_heads=2),
    "gpt3": replace(BASE, name="act-gpt3", family="gpt", ffn_hidden=1024),
    "bert": replace(BASE, name="act-bert", family="bert", ffn_hidden=1024),
}


def measured_bytes_per_token(spec: ModelSpec, tp: TPContext) -> float:
    model, _ = build_stage_model(spec, layers=(0, 1), first=False, last=False, tp=tp, seed=0,
                                 device=torch.device("cpu"), dtype=torch.bfloat16)
    block = model.layers["0"]
    sizes = [saved_bytes(block, torch.randn(batch, SEQ, spec.hidden, dtype=torch.bfloat16, requires_grad=True))
             for batch in (2, 4)]
    return (sizes[1] - sizes[0]) / (2 * SEQ)


@pytest.fixture(scope="module")
def one_member_group():
    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("name", sorted(SPECS))
def test_tp1_block_keeps_what_the_model_counts(name):
    spec = SPECS[name]
    measured = measured_bytes_per_token(spec, TPContext())
    assert measured == pytest.approx(activation_bytes_per_token(spec, "layer", 1), rel=TOLERANCE)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_tp2_rank_keeps_what_the_model_counts(name, one_member_group):
    spec = SPECS[name]
    measured = measured_bytes_per_token(spec, TPContext(size=2, rank=0, group=one_member_group))
    assert measured == pytest.approx(activation_bytes_per_token(spec, "layer", 2), rel=TOLERANCE)


def test_gqa_keeps_only_the_kv_heads():
    """Grouped-query attention keeps k and v at their own kv heads: 2 x (hidden - kv_hidden) elements per token
    fewer than the same block with all heads, in the runtime as in the model."""
    mha, gqa = SPECS["llama-mha"], SPECS["llama-gqa"]
    fewer = 2 * (mha.hidden - gqa.kv_hidden) * 2          # bf16 bytes
    measured = measured_bytes_per_token(mha, TPContext()) - measured_bytes_per_token(gqa, TPContext())
    assert measured == fewer
    assert activation_bytes_per_token(mha, "layer", 1) - activation_bytes_per_token(gqa, "layer", 1) == fewer
