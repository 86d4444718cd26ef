"""Hugging Face checkpoints in and out, whole models in one process: safetensors state <-> our parameter names
(config.json <-> ModelSpec lives in model/hf_config.py; per-rank loading and the export of a committed step in
checkpoint/hf_weights.py and checkpoint/hf_export.py).

Covers the LLaMA family (llama, mistral, qwen2) and GPT-2. Needs only torch and safetensors; `transformers` is
never imported.

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
from autohet_ray.model.hf_config import hf_config_from_spec, spec_from_hf_dir
from autohet_ray.model.spec import ModelSpec
from autohet_ray.safe_names import plain_name

# non-parameter entries some HF versions keep in a state dict
IGNORED_SUFFIXES = (".rotary_emb.inv_freq", ".attn.bias", ".attn.masked_bias")
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


# ---- state dicts -----------------------------------------------------------------------------------------

def llama_names(spec: ModelSpec) -> dict[str, str]:
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


def gpt2_names(spec: ModelSpec) -> dict[str, str]:
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
GPT2_CONV1D = (".attn.proj.weight", ".mlp.fc1.weight", ".mlp.fc2.weight")


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


def expected_hf_keys(spec: ModelSpec) -> set[str]:
    names = llama_names(spec) if spec.family == "llama" else gpt2_names(spec)
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
    expected = expected_hf_keys(spec) - ({"lm_head.weight"} if spec.tie_embeddings else set())
    _check_keys(hf_state, expected, spec)
    llama = spec.family == "llama"
    out = {}
    for ours, theirs in (llama_names(spec) if llama else gpt2_names(spec)).items():
        if theirs in hf_state:
            t = hf_state[theirs]
            out[ours] = t.t().contiguous() if not llama and ours.endswith(GPT2_CONV1D) else t
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
    """Our state dict -> HF tensors (contiguous, no shared storage, same dtypes). `local_state` may hold only
    some units (the embedding, whole layers, the head: what an exporter assembles at a time); the HF tensors
    of exactly those are returned."""
    if spec.family not in ("llama", "gpt"):
        raise ConfigError(f"{spec.name}: family={spec.family!r} has no Hugging Face mapping")
    llama = spec.family == "llama"
    tied = ("head.out.weight", "embedding.tok.weight")
    if spec.tie_embeddings and all(n in local_state for n in tied):
        assert torch.equal(*(local_state[n] for n in tied)), "tied embeddings diverged"
    out = {}
    for ours, theirs in (llama_names(spec) if llama else gpt2_names(spec)).items():
        if ours not in local_state or (ours == "head.out.weight" and spec.tie_embeddings):
            continue
        t = local_state[ours]
        out[theirs] = t.t() if not llama and ours.endswith(GPT2_CONV1D) else t
    for i in range(spec.num_layers):
        if f"layers.{i}.attn.qkv.weight" not in local_state:
            continue
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

def weight_map(path: str) -> dict[str, str]:
    """HF tensor name -> file name (relative to the directory)."""
    index = os.path.join(path, INDEX_FILE)
    if os.path.exists(index):
        with open(index) as f:
            files = dict(json.load(f)["weight_map"])
        for tensor, file in files.items():               # each becomes a path in the directory
            plain_name(file, where=index, field=f"weight_map[{tensor!r}]")
        return files
    single = os.path.join(path, SINGLE_FILE)
    if not os.path.exists(single):
        raise ConfigError(f"{path}: neither {SINGLE_FILE} nor {INDEX_FILE} found")
    with safe_open(single, framework="pt") as f:
        return {n: SINGLE_FILE for n in f.keys()}


def read_slice(path: str, hf_name: str, slices) -> torch.Tensor:
    """`tensor[slices]` of one HF tensor, reading only that region from its safetensors file."""
    files = weight_map(path)
    if hf_name not in files:
        raise ConfigError(f"{path}: no tensor {hf_name!r}")
    with safe_open(os.path.join(path, files[hf_name]), framework="pt") as f:
        return f.get_slice(hf_name)[slices]


def load_hf_dir(path: str, name: str | None = None) -> tuple[ModelSpec, dict[str, torch.Tensor]]:
    """(spec, our whole-model state) from a HF directory (config.json + one or sharded safetensors files)."""
    spec = spec_from_hf_dir(path, name)
    by_file: dict[str, list[str]] = {}
    for tensor, file in weight_map(path).items():
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
