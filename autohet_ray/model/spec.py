"""Model presets (GPT-3, LLaMA, BERT shapes and small ones for tests) and `load_model`: a preset, a custom
model from YAML, or a Hugging Face directory. The ModelSpec type itself is in model/shape.py (re-exported here).
"""
from __future__ import annotations

from autohet_ray import ConfigError
from autohet_ray.config_io import read_structured
from autohet_ray.model.hf_config import spec_from_hf_dir
from autohet_ray.model.shape import ModelSpec, model_from_dict


def _spec(name, family, layers, hidden, heads, ffn, vocab, seq, kv_heads=None) -> ModelSpec:
    return ModelSpec(name=name, family=family, num_layers=layers, hidden=hidden, num_heads=heads,
                     num_kv_heads=kv_heads or heads, ffn_hidden=ffn, vocab_size=vocab, max_seq_len=seq)


# GPT-3 shapes from Brown et al. 2020, Table 2.1 (13B uses Megatron's 5120 hidden); vocabulary padded to
# 50304 so that every TP degree up to 16 divides it. LLaMA shapes from Touvron et al. 2023a/b; BERT-Large
# from Devlin et al. 2019.
PRESETS: dict[str, ModelSpec] = {s.name: s for s in [
    _spec("bert-large", "bert", 24, 1024, 16, 4096, 30528, 512),
    _spec("gpt3-1.3b", "gpt", 24, 2048, 16, 8192, 50304, 2048),
    _spec("gpt3-2.7b", "gpt", 32, 2560, 32, 10240, 50304, 2048),
    _spec("gpt3-6.7b", "gpt", 32, 4096, 32, 16384, 50304, 2048),
    _spec("gpt3-13b", "gpt", 40, 5120, 40, 20480, 50304, 2048),
    _spec("llama-7b", "llama", 32, 4096, 32, 11008, 32000, 2048),
    _spec("llama-13b", "llama", 40, 5120, 40, 13824, 32000, 2048),
    _spec("llama2-70b", "llama", 80, 8192, 64, 28672, 32000, 4096, kv_heads=8),
    # small models for tests, CPU runs and emulation
    _spec("tiny-gpt", "gpt", 4, 32, 4, 64, 128, 16),
    _spec("tiny-llama", "llama", 4, 32, 4, 64, 128, 16, kv_heads=2),
    _spec("tiny-bert", "bert", 4, 32, 4, 64, 128, 16),
    _spec("tiny-llama-kv4", "llama", 4, 32, 8, 64, 128, 16, kv_heads=4),    # GQA that TP4 can shard
    _spec("small-gpt", "gpt", 8, 128, 8, 512, 1024, 64),
    _spec("small-llama", "llama", 8, 128, 8, 344, 1024, 64, kv_heads=4),
]}


def load_model(name_or_path: str) -> ModelSpec:
    """A preset by name, a custom model from a YAML file, or `hf:DIR` (a Hugging Face config.json)."""
    if name_or_path in PRESETS:
        return PRESETS[name_or_path]
    if name_or_path.startswith("hf:"):            # a Hugging Face model directory (its config.json)
        return spec_from_hf_dir(name_or_path[len("hf:"):])
    if name_or_path.endswith((".yaml", ".yml", ".json")):
        return model_from_dict(read_structured(name_or_path, "model"), source=name_or_path)
    raise ConfigError(f"unknown model {name_or_path!r}; presets: {', '.join(PRESETS)}; or a path to a .yaml file, "
                      "or hf:DIR (a Hugging Face model directory)")
