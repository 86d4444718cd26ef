"""Reading user files (YAML, or JSON which YAML also reads) with one-line errors naming the file."""
from __future__ import annotations

import yaml

from autohet_ray import ConfigError


def read_structured(path: str, what: str):
    """The parsed content of a YAML/JSON file; ConfigError if it is missing or malformed."""
    try:
        with open(path) as f:
            return yaml.safe_load(f)
    except FileNotFoundError:
        raise ConfigError(f"{what} file {path!r} does not exist") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{what} file {path!r} is not valid YAML/JSON: {str(exc).splitlines()[0]}") from None
