"""Object keys of chunks and manifests, shared by every tier.

    step-0000000012/layers.3.mlp.fc1.weight/0_512-512_1024     a chunk: offsets-sizes
    step-0000000012/optim.step/s                                a scalar (0-dim) chunk
    manifests/step-0000000012.json                              the step's manifest (committed last)
"""
from __future__ import annotations

import re

from autohet_ray import ConfigError
from autohet_ray.layout import Chunk

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
_STEP_DIR = re.compile(r"^step-(\d{10})/")
_MANIFEST = re.compile(r"^manifests/step-(\d{10})\.json$")
MANIFEST_PREFIX = "manifests/"


def check_name(name: str) -> str:
    if not _NAME.match(name):
        raise ConfigError(f"tensor name {name!r} is not a valid checkpoint name; "
                          "use letters, digits, '_', '.', '-' (not starting with '.' or '-')")
    return name


def step_prefix(step: int) -> str:
    assert 0 <= step < 10**10, step
    return f"step-{step:010d}/"


def chunk_key(step: int, name: str, chunk: Chunk) -> str:
    if not chunk.offsets:
        return f"{step_prefix(step)}{check_name(name)}/s"
    offsets = "_".join(map(str, chunk.offsets))
    sizes = "_".join(map(str, chunk.sizes))
    return f"{step_prefix(step)}{check_name(name)}/{offsets}-{sizes}"


def step_of_key(key: str) -> int | None:
    found = _STEP_DIR.match(key)
    return int(found.group(1)) if found else None


def manifest_key(step: int) -> str:
    assert 0 <= step < 10**10, step
    return f"{MANIFEST_PREFIX}step-{step:010d}.json"


def step_of_manifest_key(key: str) -> int | None:
    found = _MANIFEST.match(key)
    return int(found.group(1)) if found else None
