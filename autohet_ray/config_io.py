"""Reading user files (YAML, or JSON which YAML also reads) with one-line errors naming the file."""
from __future__ import annotations

import json
import os

import yaml

from autohet_ray import ConfigError


def read_structured(path: str, what: str):
    """The parsed content of a YAML/JSON file; ConfigError if it is missing or malformed. A `.json` file, or
    one whose text starts with `{` or `[`, is read as JSON (YAML 1.1 would keep a JSON number such as 1e-05
    as a string)."""
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        raise ConfigError(f"{what} file {path!r} does not exist") from None
    if path.endswith(".json") or text.lstrip()[:1] in ("{", "["):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{what} file {path!r} is not valid JSON: {exc}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{what} file {path!r} is not valid YAML/JSON: {str(exc).splitlines()[0]}") from None


def dataclass_from_dict(cls, raw: dict, what: str):
    """`cls(**raw)`, with unknown keys named in a ConfigError instead of a TypeError."""
    from dataclasses import fields
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(raw) - names)
    if unknown:
        raise ConfigError(f"{what} has unknown fields {unknown}; valid: {sorted(names)}")
    return cls(**raw)


def check_writable(path: str, what: str) -> None:
    """ConfigError unless `path` can be written: its folder exists and is writable, and it is not a folder
    (checked before the work whose result it will hold)."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ConfigError(f"{what} {path!r} is a directory; give a file name")
    if not os.path.isdir(folder):
        raise ConfigError(f"{what} {path!r}: folder {folder!r} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"{what} {path!r}: folder {folder!r} is not writable")
