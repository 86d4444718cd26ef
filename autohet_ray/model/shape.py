"""ModelSpec: the shape of a transformer, and `model_from_dict`, its check from a mapping (a YAML file or a
Hugging Face config mapped by model/hf_config.py). model/spec.py holds the presets and `load_model`.

A model is `num_layers` identical transformer layers, plus an embedding (held by a pipeline's first stage)
and a head (final norm + output projection + loss, held by the last stage). The output projection is a
separate tensor from the embedding, so that first and last stage own disjoint parameters; with
`tie_embeddings` the two hold equal values (a Hugging Face model with tied embeddings).
"""
from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, fields

from autohet_ray import ConfigError
from autohet_ray.config_io import text_field

FAMILIES = ("gpt", "llama", "bert")
ACTIVATIONS = ("gelu", "gelu_tanh")


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    name: str
    family: str             # "gpt" (learned positions, LayerNorm, GELU), "llama" (RMSNorm, RoPE, SwiGLU, GQA), "bert"
    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int       # == num_heads unless grouped-query attention
    ffn_hidden: int
    vocab_size: int
    max_seq_len: int        # positions table size (gpt/bert) and the default sequence length
    # numerics options; the defaults are the presets' (and older plans') behaviour
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0         # llama
    activation: str = "gelu"            # gpt/bert MLP: "gelu" (erf) or "gelu_tanh"; llama is always SwiGLU
    qkv_bias: bool = False              # llama: biases on the q/k/v projections (Qwen2); gpt/bert always have them
    tie_embeddings: bool = False        # head.out.weight equals embedding.tok.weight

    @property
    def head_dim(self) -> int:
        return self.hidden // self.num_heads

    @property
    def kv_hidden(self) -> int:
        return self.num_kv_heads * self.head_dim

    def to_dict(self) -> dict:
        return asdict(self)

    def valid_tp(self, tp: int) -> bool:
        """TP shards heads, kv heads, the FFN and the vocabulary evenly."""
        return all(x % tp == 0 for x in (self.num_heads, self.num_kv_heads, self.ffn_hidden, self.vocab_size))

    def check_tp(self, tp: int) -> None:
        if not self.valid_tp(tp):
            valid = [t for t in (1, 2, 4, 8, 16) if self.valid_tp(t)]
            raise ConfigError(f"TP degree {tp} does not divide {self.name}'s heads={self.num_heads}, "
                              f"kv_heads={self.num_kv_heads}, ffn={self.ffn_hidden}, vocab={self.vocab_size}; "
                              f"valid TP degrees: {valid}")


def model_from_dict(raw, source: str = "<model>") -> ModelSpec:
    all_fields = {f.name: f for f in fields(ModelSpec)}
    names = list(all_fields)
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: a model file must be a mapping with fields {names}")
    raw = dict(raw)
    raw.setdefault("num_kv_heads", raw.get("num_heads"))
    for name, f in all_fields.items():          # the numerics options are optional
        if name not in raw and f.default is not MISSING:
            raw[name] = f.default
    missing = [n for n in names if n not in raw]
    unknown = sorted(set(raw) - set(names))
    if missing or unknown:
        raise ConfigError(f"{source}: missing fields {missing}, unknown fields {unknown}; fields: {names}")
    text_field(raw["name"], f"{source}: name")
    if raw["family"] not in FAMILIES:
        raise ConfigError(f"{source}: family={raw['family']!r}; valid: {', '.join(FAMILIES)}")
    if raw["activation"] not in ACTIVATIONS:
        raise ConfigError(f"{source}: activation={raw['activation']!r}; valid: {', '.join(ACTIVATIONS)}")
    for key in ("qkv_bias", "tie_embeddings"):
        if not isinstance(raw[key], bool):
            raise ConfigError(f"{source}: {key}={raw[key]!r} must be true or false")
    for key in ("norm_eps", "rope_theta"):
        if isinstance(raw[key], bool) or not isinstance(raw[key], (int, float)) or not raw[key] > 0:
            raise ConfigError(f"{source}: {key}={raw[key]!r} must be a positive number")
        raw[key] = float(raw[key])
    for key in names[2:names.index("max_seq_len") + 1]:
        if isinstance(raw[key], bool) or not isinstance(raw[key], int) or raw[key] < 1:
            raise ConfigError(f"{source}: {key}={raw[key]!r} must be a positive integer")
    if raw["hidden"] % raw["num_heads"] or raw["num_heads"] % raw["num_kv_heads"]:
        raise ConfigError(f"{source}: hidden={raw['hidden']} must be divisible by num_heads={raw['num_heads']}, "
                          f"and num_heads by num_kv_heads={raw['num_kv_heads']}")
    return ModelSpec(**{k: raw[k] for k in names})
