"""Hugging Face import/export against transformers itself, on tiny random models made here (never downloaded)."""
import json

import pytest
import torch
from safetensors import safe_open

transformers = pytest.importorskip("transformers")

from autohet_ray import ConfigError  # noqa: E402
from autohet_ray.nn import build_model  # noqa: E402
from autohet_ray.nn.hf import (hf_to_local, load_hf_dir, local_to_hf, read_slice, save_hf_dir,  # noqa: E402
                               spec_from_hf_config)

VOCAB, SEQ = 128, 12


def _hf_model(kind: str):
    torch.manual_seed(0)
    small = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    if kind == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**small, rope_theta=500000.0,
                                                                       rms_norm_eps=1e-6, tie_word_embeddings=False))
    elif kind == "qwen2":
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**small, rope_theta=1e6,
                                                                       tie_word_embeddings=True))
    else:
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2,
                                                                     n_head=4, n_positions=32,
                                                                     bos_token_id=0, eos_token_id=0))
    with torch.no_grad():       # move away from the zero biases / unit norms of a fresh init
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model.float().eval()


def _hf_state(model) -> dict:
    return {n: t.detach().clone() for n, t in model.state_dict().items()}


def _ours(spec, state):
    model = build_model(spec).float().eval()
    model.load_state_dict(state, strict=True)
    return model


def _ids():
    return torch.randint(0, VOCAB, (3, SEQ), generator=torch.Generator().manual_seed(1))


def _read_dir(path) -> dict:
    index = path / "model.safetensors.index.json"
    files = set(json.loads(index.read_text())["weight_map"].values()) if index.exists() else {"model.safetensors"}
    out = {}
    for file in files:
        with safe_open(str(path / file), framework="pt") as f:
            out.update({n: f.get_tensor(n) for n in f.keys()})
    return out


@pytest.mark.parametrize("kind", ["llama", "gpt2", "qwen2"])
def test_logits_match_transformers(kind):
    hf = _hf_model(kind)
    spec = spec_from_hf_config(hf.config.to_dict(), kind)
    ours = _ours(spec, hf_to_local(_hf_state(hf), spec))
    ids = _ids()
    with torch.no_grad():
        want, got = hf(ids).logits, ours(ids)
    assert want.abs().max() > 0.5                       # the comparison is not between near-zero logits
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_spec_fields(kind):
    spec = spec_from_hf_config(_hf_model(kind).config.to_dict(), kind)
    if kind == "llama":
        assert (spec.family, spec.num_kv_heads, spec.rope_theta, spec.norm_eps, spec.tie_embeddings) == \
            ("llama", 2, 500000.0, 1e-6, False)
    else:
        assert (spec.family, spec.activation, spec.tie_embeddings, spec.max_seq_len) == ("gpt", "gelu_tanh", True, 32)


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_round_trip_through_directories(kind, tmp_path):
    hf = _hf_model(kind)
    hf.save_pretrained(tmp_path / "in")
    spec, state = load_hf_dir(str(tmp_path / "in"))
    files = save_hf_dir(str(tmp_path / "out"), spec, state, max_shard_bytes=20_000)
    assert len(files) > 1 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"

    # import then export is bit-exact: the same tensors, names and dtypes as transformers wrote
    original, exported = _read_dir(tmp_path / "in"), _read_dir(tmp_path / "out")
    assert set(exported) == set(original)
    for name, t in original.items():
        assert exported[name].dtype == t.dtype and torch.equal(exported[name], t), name
    # and our layout round-trips bit for bit too
    again = hf_to_local(local_to_hf(state, spec), spec)
    assert set(again) == set(state) and all(torch.equal(again[n], state[n]) for n in state)

    reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).float().eval()
    ids = _ids()
    with torch.no_grad():
        want = hf(ids).logits
        torch.testing.assert_close(reloaded(ids).logits, want, atol=1e-4, rtol=0)
        torch.testing.assert_close(_ours(spec, state)(ids), want, atol=1e-4, rtol=0)


def test_read_slice_reads_one_region(tmp_path):
    hf = _hf_model("llama")
    hf.save_pretrained(tmp_path)
    name = "model.layers.1.self_attn.q_proj.weight"
    got = read_slice(str(tmp_path), name, (slice(8, 16), slice(None)))
    assert torch.equal(got, hf.state_dict()[name][8:16])


@pytest.mark.parametrize("change, field", [
    ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}}, "rope_parameters"),
    ({"model_type": "falcon"}, "model_type"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"attention_bias": True}, "attention_bias"),
])
def test_unsupported_fields_are_refused_by_name(change, field):
    config = {**_hf_model("llama").config.to_dict(), **change}
    with pytest.raises(ConfigError, match=field):
        spec_from_hf_config(config, "x")


def test_checkpoint_that_does_not_match_its_config_is_refused():
    hf = _hf_model("gpt2")
    spec = spec_from_hf_config(hf.config.to_dict(), "g")
    state = _hf_state(hf)
    del state["transformer.h.1.attn.c_attn.bias"]
    with pytest.raises(ConfigError, match="c_attn.bias"):
        hf_to_local(state, spec)
