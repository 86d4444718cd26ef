"""Plain torch model code: names, sizes, deterministic shard-cheap init, attention masks."""
import pytest
import torch

from autohet_ray.layout import Chunk, shard_chunk
from autohet_ray.model.costs import layer_params
from autohet_ray.model.spec import PRESETS
from autohet_ray.nn import build_model, init_chunk, materialize, param_shapes
from autohet_ray.nn import init as init_mod
from autohet_ray.nn.layers import apply_rotary

FAMILIES = ["tiny-gpt", "tiny-llama", "tiny-bert", "tiny-llama-kv4"]


def _model(name, seed=0, dtype=torch.float64):
    spec = PRESETS[name]
    with torch.device("meta"):
        model = build_model(spec)
    materialize(model, seed=seed, num_layers=spec.num_layers, device="cpu", dtype=dtype)
    return spec, model


@pytest.mark.parametrize("name", FAMILIES)
def test_parameter_counts_match_the_cost_model(name):
    spec = PRESETS[name]
    shapes = param_shapes(spec)
    count = lambda prefix: sum(torch.Size(s).numel() for n, s in shapes.items() if n.startswith(prefix))  # noqa
    assert count("embedding.") == layer_params(spec, "embedding")
    assert count("head.") == layer_params(spec, "head")
    for i in range(spec.num_layers):
        assert count(f"layers.{i}.") == layer_params(spec, "layer")


def test_parameter_names():
    names = set(param_shapes(PRESETS["tiny-llama"]))
    assert {"embedding.tok.weight", "layers.0.attn_norm.weight", "layers.3.attn.qkv.weight",
            "layers.3.attn.proj.weight", "layers.2.mlp.gate_up.weight", "layers.2.mlp.down.weight",
            "head.norm.weight", "head.out.weight"} <= names
    gpt = set(param_shapes(PRESETS["tiny-gpt"]))
    assert {"embedding.pos.weight", "layers.0.mlp.fc1.weight", "layers.0.attn.qkv.bias"} <= gpt
    bert = set(param_shapes(PRESETS["tiny-bert"]))
    assert {"embedding.norm.weight", "head.dense.weight", "head.out.bias"} <= bert


@pytest.mark.parametrize("shape,dim,parts", [((600, 40), 0, 4), ((40, 2100), 1, 3), ((1000,), 0, 8), ((7, 9), 1, 2)])
def test_init_chunk_equals_slice_of_whole(monkeypatch, shape, dim, parts):
    monkeypatch.setattr(init_mod, "TILE_ROWS", 64)
    monkeypatch.setattr(init_mod, "TILE_COLS", 128)
    whole = init_chunk("layers.1.mlp.fc1.weight", shape, Chunk.whole(shape), seed=3, num_layers=4)
    for i in range(parts):
        chunk = shard_chunk(shape, dim, parts, i)
        part = init_chunk("layers.1.mlp.fc1.weight", shape, chunk, seed=3, num_layers=4)
        assert torch.equal(part, whole[chunk.slices()])
    assert abs(float(whole.std()) - 0.02) < 0.004


def test_init_depends_on_seed_and_name_only():
    shape, whole = (16, 8), Chunk.whole((16, 8))
    a = init_chunk("layers.0.attn.qkv.weight", shape, whole, seed=1, num_layers=4)
    assert torch.equal(a, init_chunk("layers.0.attn.qkv.weight", shape, whole, seed=1, num_layers=4))
    assert not torch.equal(a, init_chunk("layers.1.attn.qkv.weight", shape, whole, seed=1, num_layers=4))
    assert not torch.equal(a, init_chunk("layers.0.attn.qkv.weight", shape, whole, seed=2, num_layers=4))
    assert torch.equal(init_chunk("head.norm.weight", (8,), Chunk.whole((8,)), seed=1, num_layers=4), torch.ones(8))
    assert torch.equal(init_chunk("head.out.bias", (8,), Chunk.whole((8,)), seed=1, num_layers=4), torch.zeros(8))


@pytest.mark.parametrize("name,causal", [("tiny-gpt", True), ("tiny-llama", True), ("tiny-llama-kv4", True),
                                         ("tiny-bert", False)])
def test_attention_masking(name, causal):
    spec, model = _model(name)
    ids = torch.randint(0, spec.vocab_size, (2, 10), generator=torch.Generator().manual_seed(0))
    changed = ids.clone()
    changed[:, 7:] = (changed[:, 7:] + 1) % spec.vocab_size
    a, b = model(ids), model(changed)
    assert a.shape == (2, 10, spec.vocab_size)
    assert torch.allclose(a[:, :7], b[:, :7]) == causal
    assert not torch.allclose(a[:, 7:], b[:, 7:])


def test_rotary_scores_depend_on_relative_position():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 1, 8, generator=g, dtype=torch.float64), torch.randn(1, 1, 1, 8, generator=g,
                                                                                     dtype=torch.float64)
    seq = 6
    rq, rk = apply_rotary(q.expand(1, 1, seq, 8)), apply_rotary(k.expand(1, 1, seq, 8))
    scores = rq[0, 0] @ rk[0, 0].T
    assert torch.allclose(scores[1, 0], scores[5, 4]) and torch.allclose(scores[3, 3], q[0, 0, 0] @ k[0, 0, 0])
    assert torch.allclose(rq.norm(dim=-1), q.norm(dim=-1).expand(1, 1, seq))


def test_training_reduces_loss_single_process():
    from autohet_ray.runtime import Reference
    spec = PRESETS["tiny-gpt"]
    ref = Reference(model_spec=spec, lr=1e-2)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, spec.vocab_size, (4, 8), generator=g)
    batch = {"input_ids": ids, "labels": ids.roll(-1, dims=1)}
    losses = [ref.train_step(batch)["loss"] for _ in range(20)]
    assert losses[-1] < 0.8 * losses[0]
