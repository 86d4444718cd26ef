"""Hugging Face `config.json` <-> ModelSpec (pure data; no torch). `--model hf:DIR` resolves here.

Covers the LLaMA family (llama, mistral, qwen2) and GPT-2. Dropout probabilities are ignored (the runtime
trains without dropout); any other field whose value the runtime cannot reproduce is refused by name.
"""
from __future__ import annotations

import os

from autohet_ray import ConfigError
from autohet_ray.config_io import parse_json, read_text_file
from autohet_ray.model.shape import ModelSpec, model_from_dict

LLAMA_TYPES = ("llama", "mistral", "qwen2")
GPT2_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}
CONFIG_FILE = "config.json"


def _refuse(config: dict, field: str, ok) -> None:
    """ConfigError unless `ok(value)` for the config's value of `field` (None when absent)."""
    value = config.get(field)
    if not ok(value):
        raise ConfigError(f"Hugging Face config field {field}={value!r} ({config.get('model_type')}) is not "
                          f"supported by the runtime")


def _rope_theta(config: dict) -> float:
    # transformers >= 5 writes rope_parameters; older versions rope_theta and rope_scaling
    rope = config.get("rope_parameters") or {}
    _refuse(config, "rope_scaling", lambda v: v is None or (v.get("rope_type", v.get("type")) == "default"))
    _refuse(config, "rope_parameters", lambda v: not v or (v.get("rope_type", "default") == "default"
                                                           and v.get("partial_rotary_factor", 1.0) == 1.0))
    return float(rope.get("rope_theta", config.get("rope_theta", 10000.0)))


def _llama_spec(config: dict, name: str) -> dict:
    kind = config["model_type"]
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    _refuse(config, "hidden_act", lambda v: v == "silu")
    _refuse(config, "head_dim", lambda v: v is None or v * heads == hidden)
    _refuse(config, "mlp_bias", lambda v: not v)
    # LLaMA's attention_bias also puts a bias on o_proj, which our layers do not have
    _refuse(config, "attention_bias", lambda v: not v)
    _refuse(config, "use_sliding_window", lambda v: not v)
    if kind == "mistral":
        _refuse(config, "sliding_window", lambda v: v is None or v >= config["max_position_embeddings"])
    _refuse(config, "layer_types", lambda v: v is None or all(t == "full_attention" for t in v))
    return dict(name=name, family="llama", num_layers=config["num_hidden_layers"], hidden=hidden,
                num_heads=heads, num_kv_heads=config.get("num_key_value_heads") or heads,
                ffn_hidden=config["intermediate_size"], vocab_size=config["vocab_size"],
                max_seq_len=config["max_position_embeddings"], norm_eps=float(config.get("rms_norm_eps", 1e-6)),
                rope_theta=_rope_theta(config), qkv_bias=kind == "qwen2",     # Qwen2: q/k/v biases, none on o_proj
                tie_embeddings=bool(config.get("tie_word_embeddings", False)))


def _gpt2_spec(config: dict, name: str) -> dict:
    hidden = config["n_embd"]
    _refuse(config, "activation_function", lambda v: v in GPT2_ACTIVATIONS)
    _refuse(config, "scale_attn_weights", lambda v: v is None or v is True)
    _refuse(config, "scale_attn_by_inverse_layer_idx", lambda v: not v)
    _refuse(config, "add_cross_attention", lambda v: not v)
    return dict(name=name, family="gpt", num_layers=config["n_layer"], hidden=hidden, num_heads=config["n_head"],
                num_kv_heads=config["n_head"], ffn_hidden=config.get("n_inner") or 4 * hidden,
                vocab_size=config["vocab_size"], max_seq_len=config["n_positions"],
                norm_eps=float(config.get("layer_norm_epsilon", 1e-5)),
                activation=GPT2_ACTIVATIONS[config.get("activation_function", "gelu_new")],
                tie_embeddings=bool(config.get("tie_word_embeddings", True)))


def spec_from_hf_config(config: dict, name: str) -> ModelSpec:
    """The ModelSpec of a Hugging Face `config.json` (as a dict)."""
    kind = config.get("model_type")
    if kind not in LLAMA_TYPES + ("gpt2",):
        raise ConfigError(f"Hugging Face model_type={kind!r} is not supported; supported: "
                          f"{', '.join(LLAMA_TYPES + ('gpt2',))}")
    try:
        raw = _llama_spec(config, name) if kind in LLAMA_TYPES else _gpt2_spec(config, name)
    except KeyError as e:       # a required HF field is missing
        raise ConfigError(f"{name}: config.json lacks {e.args[0]!r}") from None
    return model_from_dict(raw, source=f"{name} (config.json)")


def hf_config_from_spec(spec: ModelSpec, *, eos_token_id: int | None = None) -> dict:
    """A `config.json` that transformers loads as the same model. Token ids are not part of a ModelSpec: the
    end-of-document id comes from the dataset when there is one (None otherwise, not GPT-2's 50256 default)."""
    if spec.family == "llama":
        kind = "qwen2" if spec.qkv_bias else "llama"
        arch = "Qwen2ForCausalLM" if spec.qkv_bias else "LlamaForCausalLM"
        config = dict(hidden_size=spec.hidden, intermediate_size=spec.ffn_hidden, num_hidden_layers=spec.num_layers,
                      num_attention_heads=spec.num_heads, num_key_value_heads=spec.num_kv_heads,
                      head_dim=spec.head_dim, max_position_embeddings=spec.max_seq_len, rms_norm_eps=spec.norm_eps,
                      hidden_act="silu", rope_theta=spec.rope_theta,
                      rope_parameters={"rope_type": "default", "rope_theta": spec.rope_theta})
        if spec.qkv_bias:
            config.update(use_sliding_window=False, sliding_window=None)
        else:
            config.update(attention_bias=False, mlp_bias=False)
    elif spec.family == "gpt":
        if spec.num_kv_heads != spec.num_heads:
            raise ConfigError(f"{spec.name}: GPT-2 has no grouped-query attention (num_kv_heads={spec.num_kv_heads})")
        kind, arch = "gpt2", "GPT2LMHeadModel"
        config = dict(n_embd=spec.hidden, n_layer=spec.num_layers, n_head=spec.num_heads, n_inner=spec.ffn_hidden,
                      n_positions=spec.max_seq_len, layer_norm_epsilon=spec.norm_eps,
                      activation_function="gelu_new" if spec.activation == "gelu_tanh" else "gelu",
                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    else:
        raise ConfigError(f"{spec.name}: family={spec.family!r} has no Hugging Face export; exportable: gpt, llama")
    return dict(model_type=kind, architectures=[arch], vocab_size=spec.vocab_size,
                tie_word_embeddings=spec.tie_embeddings, torch_dtype="float32", bos_token_id=None,
                eos_token_id=eos_token_id, **config)


def read_hf_config(path: str) -> dict:
    config_path = os.path.join(path, CONFIG_FILE)
    if not os.path.isfile(config_path):
        raise ConfigError(f"{path!r}: no {CONFIG_FILE} (a Hugging Face model directory holds one)")
    config = parse_json(read_text_file(config_path, "Hugging Face config"), repr(config_path))
    if not isinstance(config, dict):
        raise ConfigError(f"{config_path!r} must hold a JSON object")
    return config


def spec_from_hf_dir(path: str, name: str | None = None) -> ModelSpec:
    """The ModelSpec of a Hugging Face model directory (its config.json), named after the directory."""
    return spec_from_hf_config(read_hf_config(path), name or os.path.basename(os.path.normpath(path)))
