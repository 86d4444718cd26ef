"""Command-line options generated from a dataclass's fields (TrainJob, and the OptimizerConfig inside it): each
flag is its field's name (`seq_len` -> `--seq-len`), with the field's type, default and docstring as its help.
A field added to the dataclass is a flag with no second edit.

A flag nobody typed stays out of the parsed arguments (argparse.SUPPRESS), so `overrides` holds exactly the
fields the command line sets: they override the job file's, which override the dataclass's defaults."""
from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import sys
import textwrap
import types
import typing

import yaml

from autohet_ray.config_io import read_structured

NESTED_SEP = "."                # dest of a nested dataclass's field: "optimizer.lr"


@functools.cache
def field_docs(cls) -> dict[str, str]:
    """{field name: its docstring (the string literal right under it in the class body), one line}; a
    subclass's fields and those it inherits."""
    docs = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            docs |= _own_field_docs(klass)
    return docs


def _own_field_docs(cls) -> dict[str, str]:
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    docs = {}
    for node, after in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) \
                and isinstance(after.value.value, str):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def _plain(hint):
    """`X` of `X | None`; the hint itself otherwise."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return hint


def _default_of(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _shown(value) -> str:
    if value is dataclasses.MISSING:
        return "none: required, here or in --config"
    if isinstance(value, tuple):
        return " ".join(map(str, value))
    return "none" if value is None else str(value)


def flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


def _kind(hint, f: dataclasses.Field, reference: dict) -> dict:
    """argparse keywords for the field's type."""
    base = _plain(hint)
    if f.name in reference:                        # a mapping field given on the command line by reference
        return {"type": str, "metavar": reference[f.name]}
    if base is bool:
        return {"action": argparse.BooleanOptionalAction}
    if typing.get_origin(base) is typing.Literal:         # argparse shows the choices in --help
        return {"type": str, "choices": typing.get_args(base)}
    metavar = f.name.upper()
    if typing.get_origin(base) is tuple and typing.get_args(base)[-1] is Ellipsis:     # tuple[X, ...]
        item = typing.get_args(base)[0]
        if typing.get_origin(item) is typing.Literal:
            return {"type": str, "nargs": "*", "choices": typing.get_args(item)}
        return {"type": item, "nargs": "*", "metavar": metavar}
    if typing.get_origin(base) is tuple:
        items = typing.get_args(base)
        return {"type": items[0], "nargs": len(items), "metavar": metavar}
    if base in (int, float, str):
        return {"type": base, "metavar": metavar}
    return {"type": yaml_value, "metavar": "YAML"}         # a mapping or list: inline YAML, or a YAML/JSON file


def yaml_value(text: str):
    """A structured flag value: a .yaml/.yml/.json file's content, else the text itself read as YAML."""
    if text.endswith((".yaml", ".yml", ".json")):
        return read_structured(text, "flag value")
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise argparse.ArgumentTypeError(f"not YAML: {str(exc).splitlines()[0]}") from None


def add_options(parser, cls, *, skip=(), reference: dict | None = None, aliases: dict | None = None,
                notes: dict | None = None, prefix: str = "") -> list[str]:
    """One flag per field of `cls` (a nested dataclass field: one per field of it, under the same names);
    `reference`: {field: metavar} of mapping fields a flag names by text (resolved by the caller); `aliases`:
    {field: [older spellings]}; `notes`: {field: text added to the help}. The dests it added."""
    reference, aliases, notes = reference or {}, aliases or {}, notes or {}
    hints, docs, dests = typing.get_type_hints(cls), field_docs(cls), []
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        if dataclasses.is_dataclass(_plain(hints[f.name])) and f.name not in reference:
            dests += add_options(parser, _plain(hints[f.name]), skip=skip, aliases=aliases, notes=notes,
                                 prefix=f"{prefix}{f.name}{NESTED_SEP}")
            continue
        help_text = " ".join(filter(None, (docs.get(f.name) or f.metadata.get("help"), notes.get(f.name))))
        assert help_text, f"{cls.__name__}.{f.name} has no docstring: it is the flag's help"
        help_text = f"{help_text} (default: {_shown(_default_of(f))})".replace("%", "%%")
        kind = _kind(hints[f.name], f, reference)
        parser.add_argument(flag_of(f.name), dest=prefix + f.name, default=argparse.SUPPRESS, help=help_text, **kind)
        for old in aliases.get(f.name, ()):
            add_deprecated(parser, old, flag_of(f.name), dest=prefix + f.name, default=argparse.SUPPRESS, **kind)
        dests.append(prefix + f.name)
    return dests


class _Deprecated(argparse.Action):
    """A deprecated spelling of a flag: stores as the flag does, with a one-line note on stderr."""

    def __init__(self, *args, new_flag: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.new_flag = new_flag

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"autohet: {option_string} is deprecated; use {self.new_flag}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_deprecated(parser, old: str, new_flag: str, **kind) -> None:
    """`old` read as `new_flag` is (same dest and type), hidden from --help, with a deprecation note."""
    assert "action" not in kind, f"{old}: a deprecated switch is not supported"
    parser.add_argument(old, action=_Deprecated, new_flag=new_flag, help=argparse.SUPPRESS, **kind)


def overrides(args: argparse.Namespace, dests: list[str]) -> dict:
    """The fields the command line set, nested ({"optimizer": {"lr": ...}}) as the dataclass nests them."""
    out: dict = {}
    for dest in dests:
        if hasattr(args, dest):
            *outer, name = dest.split(NESTED_SEP)
            into = out
            for part in outer:
                into = into.setdefault(part, {})
            value = getattr(args, dest)
            into[name] = tuple(value) if isinstance(value, list) else value
    return out
