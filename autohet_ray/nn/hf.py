"""Hugging Face checkpoints in and out: `config.json` <-> ModelSpec, safetensors state <-> our parameter names.

Covers the LLaMA family (llama, mistral, qwen2) and GPT-2. Needs only torch and safetensors; `transformers` is
never imported. Dropout probabilities in a config are ignored (the runtime trains without dropout); any other
field whose value the runtime cannot reproduce is refused by name.

Layouts (ours on the left, see nn/layers.py):
- `attn.qkv.weight` rows, per kv head j: its `group` query heads, then key head j, then value head j. HF LLaMA
  keeps q_proj / k_proj / v_proj separate; GPT-2's `c_attn` is a Conv1D ([in, out]) whose columns are all q
  heads, then all k heads, then all v heads.
- `mlp.gate_up.weight` rows alternate gate / up per FFN column.
- GPT-2 Conv1D weights are [in, out]; ours (nn.Linear) are [out, in].
- Tied embeddings: we hold `head.out.weight` as a copy of `embedding.tok.weight`; HF files hold only the
  embedding.
"""
from __future__ import annotations

import json
import os

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from autohet_ray import ConfigError
from autohet_ray.model.spec import ModelSpec, model_from_dict

LLAMA_TYPES = ("llama", "mistral", "qwen2")
GPT2_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}
# non-parameter entries some HF versions keep in a state dict
IGNORED_SUFFIXES = (".rotary_emb.inv_freq", ".attn.bias", ".attn.masked_bias")
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


# ---- config.json <-> ModelSpec ---------------------------------------------------------------------------

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


def hf_config_from_spec(spec: ModelSpec) -> dict:
    """A `config.json` that transformers loads as the same model."""
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
                tie_word_embeddings=spec.tie_embeddings, torch_dtype="float32", **config)


# ---- state dicts -----------------------------------------------------------------------------------------

def _llama_names(spec: ModelSpec) -> dict[str, str]:
    """Our name -> HF name for the tensors that map one to one."""
    names = {"embedding.tok.weight": "model.embed_tokens.weight", "head.norm.weight": "model.norm.weight",
             "head.out.weight": "lm_head.weight"}
    for i in range(spec.num_layers):
        hf = f"model.layers.{i}."
        names.update({f"layers.{i}.attn_norm.weight": hf + "input_layernorm.weight",
                      f"layers.{i}.mlp_norm.weight": hf + "post_attention_layernorm.weight",
                      f"layers.{i}.attn.proj.weight": hf + "self_attn.o_proj.weight",
                      f"layers.{i}.mlp.down.weight": hf + "mlp.down_proj.weight"})
    return names


def _gpt2_names(spec: ModelSpec) -> dict[str, str]:
    names = {"embedding.tok.weight": "transformer.wte.weight", "embedding.pos.weight": "transformer.wpe.weight",
             "head.out.weight": "lm_head.weight"}
    for p in ("weight", "bias"):
        names[f"head.norm.{p}"] = f"transformer.ln_f.{p}"
        for i in range(spec.num_layers):
            hf = f"transformer.h.{i}."
            names.update({f"layers.{i}.attn_norm.{p}": hf + f"ln_1.{p}", f"layers.{i}.mlp_norm.{p}": hf + f"ln_2.{p}",
                          f"layers.{i}.attn.proj.{p}": hf + f"attn.c_proj.{p}",
                          f"layers.{i}.mlp.fc1.{p}": hf + f"mlp.c_fc.{p}",
                          f"layers.{i}.mlp.fc2.{p}": hf + f"mlp.c_proj.{p}"})
    return names


# Conv1D weights, stored [in, out]: transposed both ways
_GPT2_CONV1D = (".attn.proj.weight", ".mlp.fc1.weight", ".mlp.fc2.weight")


def _fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: ModelSpec) -> torch.Tensor:
    """q [heads*d, ...], k and v [kv_heads*d, ...] -> our per-kv-head interleaved rows."""
    kv, d, rest = spec.num_kv_heads, spec.head_dim, q.shape[1:]
    parts = [q.reshape(kv, -1, d, *rest), k.reshape(kv, 1, d, *rest), v.reshape(kv, 1, d, *rest)]
    return torch.cat(parts, dim=1).reshape(-1, *rest)


def _split_qkv(qkv: torch.Tensor, spec: ModelSpec) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    kv, d, rest = spec.num_kv_heads, spec.head_dim, qkv.shape[1:]
    g = spec.num_heads // kv
    x = qkv.reshape(kv, g + 2, d, *rest)
    return (x[:, :g].reshape(-1, *rest), x[:, g].reshape(-1, *rest), x[:, g + 1].reshape(-1, *rest))


def _check_keys(hf_state: dict, expected: set[str], spec: ModelSpec) -> None:
    have = {n for n in hf_state if not n.endswith(IGNORED_SUFFIXES)}
    missing, unknown = sorted(expected - have), sorted(have - expected)
    if missing or unknown:
        raise ConfigError(f"{spec.name}: checkpoint tensors do not match the config: missing {missing[:8]}, "
                          f"unexpected {unknown[:8]}")


def _expected_hf_keys(spec: ModelSpec) -> set[str]:
    names = _llama_names(spec) if spec.family == "llama" else _gpt2_names(spec)
    keys = set(names.values())
    for i in range(spec.num_layers):
        if spec.family == "llama":
            a, m = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
            keys |= {a + f"{x}_proj.weight" for x in "qkv"} | {m + "gate_proj.weight", m + "up_proj.weight"}
            keys |= {a + f"{x}_proj.bias" for x in "qkv"} if spec.qkv_bias else set()
        else:
            keys |= {f"transformer.h.{i}.attn.c_attn.weight", f"transformer.h.{i}.attn.c_attn.bias"}
    return keys


def hf_to_local(hf_state: dict[str, torch.Tensor], spec: ModelSpec) -> dict[str, torch.Tensor]:
    """HF tensors -> our whole-model state dict (same dtypes, values bit for bit)."""
    if spec.family not in ("llama", "gpt"):
        raise ConfigError(f"{spec.name}: family={spec.family!r} has no Hugging Face mapping")
    hf_state = dict(hf_state)
    if spec.tie_embeddings:     # HF saves a tied head once, as the embedding
        hf_state.pop("lm_head.weight", None)
    expected = _expected_hf_keys(spec) - ({"lm_head.weight"} if spec.tie_embeddings else set())
    _check_keys(hf_state, expected, spec)
    llama = spec.family == "llama"
    out = {}
    for ours, theirs in (_llama_names(spec) if llama else _gpt2_names(spec)).items():
        if theirs in hf_state:
            t = hf_state[theirs]
            out[ours] = t.t().contiguous() if not llama and ours.endswith(_GPT2_CONV1D) else t
    if spec.tie_embeddings:
        out["head.out.weight"] = out["embedding.tok.weight"].clone()
    for i in range(spec.num_layers):
        if llama:
            a, m = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
            for p in ("weight", "bias") if spec.qkv_bias else ("weight",):
                out[f"layers.{i}.attn.qkv.{p}"] = _fuse_qkv(*(hf_state[a + f"{x}_proj.{p}"] for x in "qkv"), spec)
            gate, up = hf_state[m + "gate_proj.weight"], hf_state[m + "up_proj.weight"]
            out[f"layers.{i}.mlp.gate_up.weight"] = torch.stack([gate, up], dim=1).reshape(-1, gate.shape[1])
        else:
            w = hf_state[f"transformer.h.{i}.attn.c_attn.weight"].t()      # [3 * hidden, hidden]: q, k, v
            b = hf_state[f"transformer.h.{i}.attn.c_attn.bias"]
            out[f"layers.{i}.attn.qkv.weight"] = _fuse_qkv(*w.chunk(3, dim=0), spec).contiguous()
            out[f"layers.{i}.attn.qkv.bias"] = _fuse_qkv(*b.chunk(3, dim=0), spec)
    return out


def local_to_hf(local_state: dict[str, torch.Tensor], spec: ModelSpec) -> dict[str, torch.Tensor]:
    """Our whole-model state dict -> HF tensors (contiguous, no shared storage, same dtypes)."""
    if spec.family not in ("llama", "gpt"):
        raise ConfigError(f"{spec.name}: family={spec.family!r} has no Hugging Face mapping")
    llama = spec.family == "llama"
    if spec.tie_embeddings:
        assert torch.equal(local_state["head.out.weight"], local_state["embedding.tok.weight"]), \
            "tied embeddings diverged"
    out = {}
    for ours, theirs in (_llama_names(spec) if llama else _gpt2_names(spec)).items():
        if ours == "head.out.weight" and spec.tie_embeddings:
            continue
        t = local_state[ours]
        out[theirs] = t.t() if not llama and ours.endswith(_GPT2_CONV1D) else t
    for i in range(spec.num_layers):
        if llama:
            a, m = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
            for p in ("weight", "bias") if spec.qkv_bias else ("weight",):
                for x, t in zip("qkv", _split_qkv(local_state[f"layers.{i}.attn.qkv.{p}"], spec)):
                    out[a + f"{x}_proj.{p}"] = t
            gate_up = local_state[f"layers.{i}.mlp.gate_up.weight"]
            out[m + "gate_proj.weight"], out[m + "up_proj.weight"] = gate_up[0::2], gate_up[1::2]
        else:
            w = torch.cat(_split_qkv(local_state[f"layers.{i}.attn.qkv.weight"], spec), dim=0)
            out[f"transformer.h.{i}.attn.c_attn.weight"] = w.t()
            out[f"transformer.h.{i}.attn.c_attn.bias"] = torch.cat(
                _split_qkv(local_state[f"layers.{i}.attn.qkv.bias"], spec), dim=0)
    return {n: t.detach().contiguous().clone() for n, t in out.items()}


# ---- directories -----------------------------------------------------------------------------------------

def _weight_map(path: str) -> dict[str, str]:
    """HF tensor name -> file name (relative to the directory)."""
    index = os.path.join(path, INDEX_FILE)
    if os.path.exists(index):
        with open(index) as f:
            return dict(json.load(f)["weight_map"])
    single = os.path.join(path, SINGLE_FILE)
    if not os.path.exists(single):
        raise ConfigError(f"{path}: neither {SINGLE_FILE} nor {INDEX_FILE} found")
    with safe_open(single, framework="pt") as f:
        return {n: SINGLE_FILE for n in f.keys()}


def read_hf_config(path: str) -> dict:
    config_path = os.path.join(path, "config.json")
    if not os.path.exists(config_path):
        raise ConfigError(f"{path}: no config.json")
    with open(config_path) as f:
        return json.load(f)


def read_slice(path: str, hf_name: str, slices) -> torch.Tensor:
    """`tensor[slices]` of one HF tensor, reading only that region from its safetensors file."""
    files = _weight_map(path)
    if hf_name not in files:
        raise ConfigError(f"{path}: no tensor {hf_name!r}")
    with safe_open(os.path.join(path, files[hf_name]), framework="pt") as f:
        return f.get_slice(hf_name)[slices]


def load_hf_dir(path: str, name: str | None = None) -> tuple[ModelSpec, dict[str, torch.Tensor]]:
    """(spec, our whole-model state) from a HF directory (config.json + one or sharded safetensors files)."""
    spec = spec_from_hf_config(read_hf_config(path), name or os.path.basename(os.path.normpath(path)))
    by_file: dict[str, list[str]] = {}
    for tensor, file in _weight_map(path).items():
        by_file.setdefault(file, []).append(tensor)
    hf_state = {}
    for file, tensors in sorted(by_file.items()):
        with safe_open(os.path.join(path, file), framework="pt") as f:
            hf_state.update({t: f.get_tensor(t) for t in tensors if not t.endswith(IGNORED_SUFFIXES)})
    return spec, hf_to_local(hf_state, spec)


def _shards(state: dict[str, torch.Tensor], max_shard_bytes: int) -> list[list[str]]:
    """Tensor names in order, packed greedily into shards of at most max_shard_bytes (a bigger tensor alone)."""
    shards, size = [[]], 0
    for name, t in state.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    return shards


def save_hf_dir(path: str, spec: ModelSpec, local_state: dict[str, torch.Tensor], *,
                max_shard_bytes: int = 5 * 2**30) -> list[str]:
    """Write config.json and the weights as HF safetensors (sharded with an index when over max_shard_bytes).

    Returns the weight files written."""
    if max_shard_bytes < 1:
        raise ConfigError(f"max_shard_bytes={max_shard_bytes} must be positive")
    config = hf_config_from_spec(spec)
    state = local_to_hf(local_state, spec)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    shards = _shards(state, max_shard_bytes)
    n = len(shards)
    files = [SINGLE_FILE] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    for file, names in zip(files, shards):
        save_file({t: state[t] for t in names}, os.path.join(path, file), metadata={"format": "pt"})
    if n > 1:
        index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in state.values())},
                 "weight_map": {t: file for file, names in zip(files, shards) for t in names}}
        with open(os.path.join(path, INDEX_FILE), "w") as f:
            json.dump(index, f, indent=2)
    return files
