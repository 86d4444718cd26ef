"""Reading user files (YAML, or JSON which YAML also reads) with one-line errors naming the file."""
from __future__ import annotations

import json
import math
import os
import types
import typing
from dataclasses import fields

import yaml

from autohet_ray import ConfigError


def read_text_file(path: str, what: str) -> str:
    """The UTF-8 text of a user's file; ConfigError (one line naming the file) when it is missing, a directory,
    unreadable or not text."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        raise ConfigError(f"{what} file {path!r} does not exist") from None
    except IsADirectoryError:
        raise ConfigError(f"{what} file {path!r} is a directory; give a file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} file {path!r} is not UTF-8 text (byte {exc.start}): expected YAML or "
                          "JSON") from None
    except OSError as exc:
        raise ConfigError(f"{what} file {path!r} cannot be read: {exc.strerror or exc}") from None


def read_structured(path: str, what: str):
    """The parsed content of a YAML/JSON file; ConfigError if it is missing or malformed, or holds a number
    that is not finite (NaN, infinity). A `.json` file, or one whose text starts with `{` or `[`, is read as
    JSON (YAML 1.1 would keep a JSON number such as 1e-05 as a string)."""
    text = read_text_file(path, what)
    if path.endswith(".json") or text.lstrip()[:1] in ("{", "["):
        return parse_json(text, f"{what} file {path!r}")
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{what} file {path!r} is not valid YAML/JSON: {str(exc).splitlines()[0]}") from None
    check_finite(raw, f"{what} file {path!r}")
    return raw


def parse_json(text: str, where: str):
    """`text` parsed as JSON, with every number finite; ConfigError naming `where` otherwise."""
    try:
        raw = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ConfigError(f"{where} is not valid JSON: {exc}") from None
    check_finite(raw, where)
    return raw


def check_finite(raw, where: str, field: str = "") -> None:
    """ConfigError naming the field when a number anywhere in a parsed document is NaN or infinite."""
    if isinstance(raw, float) and not math.isfinite(raw):
        raise ConfigError(f"{where}: {field or 'the document'}={raw} must be a finite number")
    if isinstance(raw, dict):
        for key, value in raw.items():
            check_finite(value, where, f"{field}.{key}" if field else str(key))
    elif isinstance(raw, list):
        for k, value in enumerate(raw):
            check_finite(value, where, f"{field}[{k}]")


def mapping(raw, where: str) -> dict:
    """`raw` if it is a mapping (an absent one: empty), else ConfigError naming `where`."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}={raw!r} must be a mapping (key: value)")
    return raw


def text_field(raw, where: str) -> str:
    """A name or other text field: a string (quote a name YAML would read as a number: name: "5")."""
    if not isinstance(raw, str):
        raise ConfigError(f"{where}={raw!r} must be text")
    return raw


def finite_number(value, what: str, *, minimum: float | None = None, above: float | None = None) -> float:
    """`value` as a float: a finite number (a flag's or a field's), >= `minimum` / > `above` where given."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{what}={value!r} must be a finite number")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{what}={value!r} must be >= {minimum}")
    if above is not None and not value > above:
        raise ConfigError(f"{what}={value!r} must be > {above}")
    return float(value)


def whole_number(value, what: str, *, minimum: int = 0) -> int:
    """`value` as an int >= `minimum` (a flag's or a field's)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{what}={value!r} must be an integer >= {minimum}")
    return value


def dataclass_from_dict(cls, raw: dict, what: str):
    """`cls(**raw)`, with unknown keys named in a ConfigError instead of a TypeError, and each value checked
    against its field's type (int, float, str, bool, dict, list and their `| None`): a wrong type, NaN or
    infinity is a ConfigError naming the field."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{what} must be a mapping of its fields, not {type(raw).__name__}")
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(raw) - names)
    if unknown:
        raise ConfigError(f"{what} has unknown fields {unknown}; valid: {sorted(names)}")
    hints = typing.get_type_hints(cls)
    try:                                         # the class's own checks speak first: their messages say more
        made = cls(**raw)
    except ConfigError:                          # (a ValueError too)
        raise
    except (TypeError, AttributeError, ValueError) as exc:   # a wrong type it tripped on, or a field missing
        for name, value in raw.items():
            check_type(value, hints[name], f"{what}: {name}")
        raise ConfigError(f"{what}: {exc}") from None
    for name, value in raw.items():
        check_type(value, hints[name], f"{what}: {name}")
    return made


_PLAIN = {int: (int,), float: (int, float), str: (str,), bool: (bool,), dict: (dict,), list: (list, tuple),
          tuple: (list, tuple)}


def check_type(value, hint, where: str) -> None:
    """ConfigError unless `value` fits the annotation `hint` (plain types, `X | None`, dict[...], list[...],
    Literal[...]); other annotations (dataclasses, which check themselves) are not checked here."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        if value not in args or isinstance(value, bool) != isinstance(args[0], bool):
            raise ConfigError(f"{where}={value!r}; valid: {', '.join(map(str, args))}")
        return
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return
        plain = [a for a in args if a is not type(None)]
        if len(plain) == 1:
            return check_type(value, plain[0], where)
        return
    base = origin or hint
    if base not in _PLAIN:
        return
    if isinstance(value, bool) and base is not bool or not isinstance(value, _PLAIN[base]):
        raise ConfigError(f"{where}={value!r} must be {_TYPE_WORDS[base]}")
    check_finite(value, where.split(":")[0], where.split(": ")[-1])


_TYPE_WORDS = {int: "an integer", float: "a number", str: "text", bool: "true or false", dict: "a mapping",
               list: "a list", tuple: "a list"}


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
