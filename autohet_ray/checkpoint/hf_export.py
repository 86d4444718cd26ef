"""A committed step as a Hugging Face directory: config.json, sharded model-*.safetensors with
model.safetensors.index.json, and the tokenizer when the job had one.

Memory stays bounded: the step is assembled one unit at a time (the embedding, one layer, the head), each
tensor from its saved chunks (verified against the manifest's hashes, whatever plan saved them), mapped to the
HF tensors and packed into the shard being filled; a full shard is written and dropped. Only safetensors and
torch are needed (no transformers).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import torch
from safetensors.torch import save_file

from autohet_ray import ConfigError
from autohet_ray.checkpoint.reshard import restore
from autohet_ray.checkpoint.steps import find_manifest, latest_committed_step
from autohet_ray.layout import Chunk
from autohet_ray.model.hf_config import CONFIG_FILE, hf_config_from_spec
from autohet_ray.model.spec import ModelSpec
from autohet_ray.nn.hf import INDEX_FILE, local_to_hf
from autohet_ray.nn.model import TIED

DEFAULT_SHARD_BYTES = 5 * 2**30
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"


@dataclass
class ExportReport:
    step: int
    out: str
    files: list[str] = field(default_factory=list)
    tensors: int = 0
    bytes_written: int = 0
    bytes_fetched: dict[str, int] = field(default_factory=dict)      # tier name -> bytes read from it
    tokenizer: bool = False


def _units(spec: ModelSpec, saved: dict) -> list[list[str]]:
    """Parameter names of the step by unit, in model order (optimizer state left out)."""
    params = [n for n in saved if not n.startswith("optim.")]
    by_unit: dict[object, list[str]] = {}
    for name in params:
        head, _, rest = name.partition(".")
        unit = int(rest.partition(".")[0]) if head == "layers" else head
        by_unit.setdefault(unit, []).append(name)
    order = ["embedding", *range(spec.num_layers), "head"]
    missing = [u for u in order if u not in by_unit]
    if missing or set(by_unit) - set(order):
        raise ConfigError(f"the step's tensors do not form {spec.name}: units missing {missing[:4]}, "
                          f"unexpected {sorted(map(str, set(by_unit) - set(order)))[:4]}")
    return [sorted(by_unit[u]) for u in order]


class _ShardWriter:
    """Packs HF tensors into shards of at most max_bytes (a bigger tensor alone), written as they fill."""

    def __init__(self, out: str, max_bytes: int):
        self.out, self.max_bytes = out, max_bytes
        self.pending: dict[str, torch.Tensor] = {}
        self.pending_bytes = 0
        self.written: list[list[str]] = []          # tensor names per shard written
        self.total_bytes = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        nbytes = tensor.numel() * tensor.element_size()
        if self.pending and self.pending_bytes + nbytes > self.max_bytes:
            self.flush()
        self.pending[name] = tensor
        self.pending_bytes += nbytes
        self.total_bytes += nbytes

    def _temp(self, index: int) -> str:
        return os.path.join(self.out, f".model-{index + 1:05d}.safetensors.partial")

    def flush(self) -> None:
        if self.pending:
            save_file(self.pending, self._temp(len(self.written)), metadata={"format": "pt"})
            self.written.append(list(self.pending))
            self.pending, self.pending_bytes = {}, 0

    def finish(self) -> list[str]:
        """Name the shards model-i-of-n (n known only now) and write the index; the file names."""
        self.flush()
        n = len(self.written)
        files = [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
        for i, file in enumerate(files):
            os.replace(self._temp(i), os.path.join(self.out, file))
        index = {"metadata": {"total_size": self.total_bytes},
                 "weight_map": {t: file for file, names in zip(files, self.written) for t in names}}
        with open(os.path.join(self.out, INDEX_FILE), "w") as f:
            json.dump(index, f, indent=2)
        return files


def _check_out(out: str) -> None:
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise ConfigError(f"--out {out!r} exists and is not an empty directory; give a new directory")
    os.makedirs(out, exist_ok=True)


def write_tokenizer(out: str, tokenizer_json: str) -> None:
    """tokenizer.json as the job's dataset has it, and the config that makes transformers load it."""
    with open(os.path.join(out, TOKENIZER_FILE), "w") as f:
        f.write(tokenizer_json)
    with open(os.path.join(out, TOKENIZER_CONFIG_FILE), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast"}, f, indent=2)


def export_step(tiers, spec: ModelSpec, out: str, *, step: int | None = None,
                max_shard_bytes: int = DEFAULT_SHARD_BYTES, tokenizer_json: str | None = None,
                eos_token_id: int | None = None) -> ExportReport:
    """Write committed `step` (default: the newest) of the tiers (cheapest first) as a HF directory `out`."""
    if max_shard_bytes < 1:
        raise ConfigError(f"max shard size {max_shard_bytes} must be positive")
    config = hf_config_from_spec(spec, eos_token_id=eos_token_id)    # refuses a model HF has no class for
    if step is None:
        step = latest_committed_step(tiers)
        if step is None:
            raise ConfigError(f"no committed step in {', '.join(t.name for t in tiers)}; nothing to export")
    manifest = find_manifest(tiers, step)
    saved = manifest.tensors()
    units = _units(spec, saved)
    _check_out(out)
    report, writer, embedding = ExportReport(step=step, out=out), _ShardWriter(out, max_shard_bytes), None
    for names in units:
        needs = {n: (saved[n][0].global_shape, Chunk.whole(saved[n][0].global_shape)) for n in names}
        state, fetched = restore(manifest, needs, tiers)
        for tier, nbytes in fetched.bytes_by_tier().items():
            report.bytes_fetched[tier] = report.bytes_fetched.get(tier, 0) + nbytes
        local = {n: t for n, (t, _, _) in state.items()}
        if spec.tie_embeddings and TIED[0] in local:
            embedding = local[TIED[0]]
        if spec.tie_embeddings and TIED[1] in local and not torch.equal(local[TIED[1]], embedding):
            raise ConfigError(f"step {step}: the tied head and embedding differ; the checkpoint is not of a "
                              "tied model")
        for name, tensor in local_to_hf(local, spec).items():
            writer.add(name, tensor)
            report.tensors += 1
    report.files = writer.finish()
    report.bytes_written = writer.total_bytes
    with open(os.path.join(out, CONFIG_FILE), "w") as f:
        json.dump({**config, "torch_dtype": _dtype_name(saved)}, f, indent=2)
    if tokenizer_json is not None:
        write_tokenizer(out, tokenizer_json)
        report.tokenizer = True
    return report


def _dtype_name(saved: dict) -> str:
    dtypes = {saved[n][0].dtype for n in saved if not n.startswith("optim.")}
    assert len(dtypes) == 1, dtypes
    return dtypes.pop()
