"""Names read from files (a dataset index, a checkpoint manifest, a Hugging Face index, job.json) that become
paths: each must stay inside its directory.

    plain_name(value, where=..., field=...)         one file name: no separator at all
    relative_name(value, where=..., field=...)      a relative sub-path ("a/b.bin"), every part a plain name
    path_inside(directory, value, where=..., field=..., subpath=False)   the joined path, once the name passed

A bad name raises UnsafeNameError (a ConfigError: one line, exit 2 from the CLI) naming the file, the field and
the value. Symbolic links inside the directory are not followed here: the names are checked, not the tree.
"""
from __future__ import annotations

import os

from autohet_ray import ConfigError


class UnsafeNameError(ConfigError):
    """A name read from a file would leave its directory (or is no name at all)."""


def _problem(value, *, subpath: bool) -> str | None:
    """Why `value` is not a safe name inside a directory, None when it is."""
    if not isinstance(value, str):
        return f"must be a string, not {type(value).__name__}"
    if not value:
        return "is empty"
    if "\x00" in value:
        return "holds a NUL character"
    if "\\" in value:
        return "holds a backslash"
    if value.startswith("/") or os.path.isabs(value):
        return "is an absolute path"
    parts = value.split("/")
    if not subpath and len(parts) > 1:
        return "holds a '/' (a plain file name is expected)"
    for part in parts:
        if part == "":
            return "holds an empty part ('//' or a trailing '/')"
        if part in (".", ".."):
            return f"holds a {part!r} part"
    return None


def _checked(value, where: str, field: str, *, subpath: bool) -> str:
    problem = _problem(value, subpath=subpath)
    if problem is not None:
        what = "a relative path inside its directory" if subpath else "a plain file name inside its directory"
        raise UnsafeNameError(f"{where}: {field} {value!r} {problem}; it must be {what}")
    return value


def plain_name(value, *, where: str, field: str) -> str:
    """`value`, when it is one plain file name (no '/', no '..', not absolute, not empty, no NUL)."""
    return _checked(value, where, field, subpath=False)


def relative_name(value, *, where: str, field: str) -> str:
    """`value`, when it is a relative path whose every '/'-separated part is a plain name."""
    return _checked(value, where, field, subpath=True)


def path_inside(directory: str, value, *, where: str, field: str, subpath: bool = False) -> str:
    """`directory`/`value` once `value` passed `plain_name` (or `relative_name` with `subpath`)."""
    return os.path.join(directory, _checked(value, where, field, subpath=subpath))
