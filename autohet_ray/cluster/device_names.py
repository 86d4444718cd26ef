"""Map the name CUDA reports for a GPU (`torch.cuda.get_device_name`) to a catalog device type. Pure: no torch.

A name is split into upper-case tokens without the vendor prefix ("NVIDIA A100-SXM4-80GB" -> A100 SXM4 80GB).
The first token is the model ("RTX 4090" for GeForce cards); the rest may only be form-factor or memory tokens,
so MIG slices and unknown variants ("RTX 4090 D", "H20-3e") are refused rather than guessed. When the memory is
known (from a "80GB" token or the device's total memory) it must be close to the catalog's figure: a 16 GB V100
is not the catalog's 32 GB V100. A100 needs the memory to tell 40 GB from 80 GB.
"""
from __future__ import annotations

import re

from autohet_ray import ConfigError
from autohet_ray.cluster.catalog import CATALOG

GIB = 1024 ** 3
VENDOR_TOKENS = ("NVIDIA", "TESLA", "GEFORCE")
MODELS = {"V100": "V100", "A10": "A10", "H100": "H100", "H800": "H800", "H20": "H20", "H200": "H200",
          "L40S": "L40S", "L20": "L20", "RTX 4090": "RTX-4090"}
SIZED_MODELS = {"A100": {40: "A100-40GB", 80: "A100-80GB"}}
SUFFIX = re.compile(r"^(SXM\d*|PCIE|NVL|HBM\d*E?|\d+GB)$")
MEMORY_TOLERANCE = (0.85, 1.1)      # reported GiB / catalog GB


def name_tokens(name: str) -> list[str]:
    """Upper-case tokens of a device name without vendor words: "NVIDIA GeForce RTX 4090" -> [RTX, 4090]."""
    tokens = re.split(r"[\s_-]+", name.strip().upper())
    return [t for t in tokens if t and t not in VENDOR_TOKENS]


def _split_model(tokens: list[str]) -> tuple[str, list[str]]:
    if tokens[:1] == ["RTX"] and len(tokens) > 1:
        return " ".join(tokens[:2]), tokens[2:]
    return tokens[0], tokens[1:]


def _memory_gib(suffix: list[str], total_memory: int | None) -> float | None:
    if total_memory is not None:
        return total_memory / GIB
    sizes = [int(t[:-2]) for t in suffix if re.fullmatch(r"\d+GB", t)]
    return float(sizes[0]) if sizes else None


def _unknown(name: str, why: str) -> ConfigError:
    known = ", ".join(f"{k} -> {v}" for k, v in {**MODELS, "A100": "A100-40GB/A100-80GB"}.items())
    return ConfigError(f"device name {name!r}: {why}; known CUDA models: {known} (declare other GPUs as custom "
                       f"devices in the cluster file)")


def _check_memory(name: str, device: str, gib: float | None) -> None:
    if gib is None:
        return
    ratio = gib / CATALOG[device].memory_gb
    if not MEMORY_TOLERANCE[0] <= ratio <= MEMORY_TOLERANCE[1]:
        raise _unknown(name, f"{gib:.1f} GiB of memory does not fit catalog type {device} "
                             f"({CATALOG[device].memory_gb:g} GB)")


def _sized(name: str, sizes: dict[int, str], gib: float | None) -> str:
    if gib is None:
        raise _unknown(name, f"the memory size is needed to tell {' from '.join(sizes.values())}; "
                             f"pass the device's total memory")
    size = min(sizes, key=lambda s: abs(s - gib))
    return sizes[size]


def catalog_type(name: str, total_memory: int | None = None) -> str:
    """The catalog device type of a GPU that CUDA names `name` (total memory in bytes when known).

    ConfigError for names that are no catalog type (unknown model, extra variant tokens, MIG slices, memory
    that does not fit)."""
    tokens = name_tokens(name)
    if not tokens:
        raise _unknown(name, "empty name")
    model, suffix = _split_model(tokens)
    odd = [t for t in suffix if not SUFFIX.match(t)]
    if odd:
        raise _unknown(name, f"unrecognised variant tokens {odd} after model {model}")
    gib = _memory_gib(suffix, total_memory)
    if model in SIZED_MODELS:
        device = _sized(name, SIZED_MODELS[model], gib)
    elif model in MODELS:
        device = MODELS[model]
    else:
        raise _unknown(name, f"unknown model {model!r}")
    _check_memory(name, device, gib)
    return device
