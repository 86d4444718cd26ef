"""One rank's share of a Hugging Face checkpoint: each parameter chunk the rank holds, read as slices of the
safetensors tensors it comes from (lazy `get_slice` reads), so no process ever holds a whole tensor it does not
own, let alone the whole model.

Our fused layouts (nn/hf.py) map a chunk of rows to runs of rows of the HF tensors:
- `attn.qkv` rows, per kv head: its query heads, its key head, its value head -> runs of q_proj / k_proj /
  v_proj rows (LLaMA), or of column blocks of GPT-2's Conv1D `c_attn` ([in, out]: all q, all k, all v);
- `mlp.gate_up` rows alternate gate / up -> a run of gate_proj rows and a run of up_proj rows;
- GPT-2 Conv1D weights are [in, out]: our chunk's transpose is read and transposed back;
- a tied head reads the embedding.
"""
from __future__ import annotations

import os

import torch
from safetensors import safe_open

from autohet_ray import ConfigError
from autohet_ray.layout import Chunk
from autohet_ray.model.hf_config import spec_from_hf_dir
from autohet_ray.model.spec import ModelSpec
from autohet_ray.nn.hf import (GPT2_CONV1D, IGNORED_SUFFIXES, expected_hf_keys, gpt2_names, llama_names,
                               weight_map)

Layout = dict[str, tuple[tuple[int, ...], Chunk]]        # param name -> (global shape, chunk held)
# ModelSpec fields that must agree between the job's model and the checkpoint's config.json
SHAPE_FIELDS = ("family", "num_layers", "hidden", "num_heads", "num_kv_heads", "ffn_hidden", "vocab_size",
                "max_seq_len", "norm_eps", "rope_theta", "activation", "qkv_bias", "tie_embeddings")


class SliceReader:
    """Regions of the tensors of a HF directory; files opened once, every read counted (`bytes_read`)."""

    def __init__(self, path: str):
        self.path, self.files = path, weight_map(path)
        self._handles: dict[str, object] = {}
        self.bytes_read = 0

    def _handle(self, name: str):
        if name not in self.files:
            raise ConfigError(f"{self.path}: no tensor {name!r}")
        file = self.files[name]
        if file not in self._handles:
            self._handles[file] = safe_open(os.path.join(self.path, file), framework="pt")
        return self._handles[file]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._handle(name).get_slice(name).get_shape())

    def read(self, name: str, slices: tuple[slice, ...]) -> torch.Tensor:
        out = self._handle(name).get_slice(name)[slices]
        self.bytes_read += out.numel() * out.element_size()
        return out

    def close(self) -> None:
        self._handles.clear()

    def __enter__(self) -> "SliceReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _qkv_runs(spec: ModelSpec, lo: int, hi: int) -> list[tuple[int, int, int]]:
    """Rows [lo, hi) of our qkv as runs (part 0/1/2 = q/k/v, first row in that part, number of rows)."""
    g, d = spec.num_heads // spec.num_kv_heads, spec.head_dim
    per_head = (g + 2) * d
    ends = (g * d, (g + 1) * d, per_head)         # where q, k and v end inside one kv head's rows
    runs, row = [], lo
    while row < hi:
        head, within = divmod(row, per_head)
        part = next(i for i, end in enumerate(ends) if within < end)
        start = within - (0, g * d, (g + 1) * d)[part]
        count = min(hi - row, ends[part] - within)
        runs.append((part, head * (g if part == 0 else 1) * d + start, count))
        row += count
    return runs


def _read_qkv(reader: SliceReader, spec: ModelSpec, layer: int, kind: str, chunk: Chunk) -> torch.Tensor:
    lo, hi = chunk.offsets[0], chunk.ends[0]
    cols = chunk.slices()[1:]
    pieces = []
    for part, first, count in _qkv_runs(spec, lo, hi):
        rows = slice(first, first + count)
        if spec.family == "llama":
            pieces.append(reader.read(f"model.layers.{layer}.self_attn.{'qkv'[part]}_proj.{kind}", (rows, *cols)))
            continue
        offset = part * spec.hidden                 # GPT-2 c_attn: q, k, v blocks of `hidden` outputs each
        rows = slice(offset + first, offset + first + count)
        name = f"transformer.h.{layer}.attn.c_attn.{kind}"
        pieces.append(reader.read(name, (rows,)) if kind == "bias" else reader.read(name, (*cols, rows)).t())
    return torch.cat(pieces, dim=0).contiguous()


def _read_gate_up(reader: SliceReader, layer: int, chunk: Chunk) -> torch.Tensor:
    """Rows [lo, hi) of our gate_up: even rows are gate_proj rows, odd rows up_proj rows (row // 2)."""
    lo, hi = chunk.offsets[0], chunk.ends[0]
    cols = chunk.slices()[1]
    base = f"model.layers.{layer}.mlp."
    gate = reader.read(base + "gate_proj.weight", (slice((lo + 1) // 2, (hi + 1) // 2), cols))
    up = reader.read(base + "up_proj.weight", (slice(lo // 2, hi // 2), cols))
    out = torch.empty(chunk.sizes, dtype=gate.dtype)
    out[lo % 2::2] = gate                  # the first even row is local row lo % 2
    out[1 - lo % 2::2] = up
    return out


def _read_param(reader: SliceReader, spec: ModelSpec, names: dict[str, str], name: str,
                shape: tuple[int, ...], chunk: Chunk) -> torch.Tensor:
    if spec.tie_embeddings and name == "head.out.weight":
        name = "embedding.tok.weight"               # HF keeps a tied head only as the embedding
    parts = name.split(".")
    if name in names:
        hf = names[name]
        if spec.family == "gpt" and name.endswith(GPT2_CONV1D):
            _check_shape(reader, hf, tuple(reversed(shape)))
            return reader.read(hf, tuple(reversed(chunk.slices()))).t().contiguous()
        _check_shape(reader, hf, shape)
        return reader.read(hf, chunk.slices())
    if parts[2:4] == ["attn", "qkv"]:
        return _read_qkv(reader, spec, int(parts[1]), parts[4], chunk)
    if parts[2:4] == ["mlp", "gate_up"]:
        return _read_gate_up(reader, int(parts[1]), chunk)
    raise ConfigError(f"{spec.name}: parameter {name!r} has no Hugging Face source")


def _check_shape(reader: SliceReader, hf_name: str, want: tuple[int, ...]) -> None:
    have = reader.shape(hf_name)
    if have != want:
        raise ConfigError(f"{reader.path}: tensor {hf_name!r} has shape {list(have)}, the model needs {list(want)}")


def check_hf_dir(path: str, spec: ModelSpec) -> None:
    """ConfigError unless the directory's config.json describes `spec` and its files hold exactly its tensors."""
    theirs = spec_from_hf_dir(path)
    differ = [f for f in SHAPE_FIELDS if getattr(theirs, f) != getattr(spec, f)]
    if differ:
        raise ConfigError(f"--init-from {path!r} holds another model than the job's {spec.name}: "
                          + ", ".join(f"{f}={getattr(theirs, f)!r} (job: {getattr(spec, f)!r})" for f in differ))
    have = {n for n in weight_map(path) if not n.endswith(IGNORED_SUFFIXES)}
    expected = expected_hf_keys(spec)
    if spec.tie_embeddings:
        have.discard("lm_head.weight")
        expected.discard("lm_head.weight")
    if have != expected:
        raise ConfigError(f"--init-from {path!r}: tensors do not match config.json: missing "
                          f"{sorted(expected - have)[:8]}, unexpected {sorted(have - expected)[:8]}")


def load_rank_state(path: str, spec: ModelSpec, layout: Layout) -> tuple[dict, int]:
    """This rank's parameters from a HF directory: (name -> (tensor, global shape, chunk), the engine's
    load_state_dict format, in the files' dtype; bytes read). Reads only the regions of `layout`."""
    if spec.family not in ("llama", "gpt"):
        raise ConfigError(f"{spec.name}: family={spec.family!r} has no Hugging Face mapping")
    check_hf_dir(path, spec)
    names = llama_names(spec) if spec.family == "llama" else gpt2_names(spec)
    state = {}
    with SliceReader(path) as reader:
        for name, (shape, chunk) in layout.items():
            tensor = _read_param(reader, spec, names, name, tuple(shape), chunk)
            assert tuple(tensor.shape) == chunk.sizes, (name, tensor.shape, chunk)
            state[name] = (tensor, tuple(shape), chunk)
        return state, reader.bytes_read
