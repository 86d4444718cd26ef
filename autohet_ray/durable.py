"""Durable writes to a directory: the one primitive every writer of a storage directory uses.

`write_atomic`: the bytes go to a temporary file with a unique name beside the target
(`.<name>.tmp-<random>`, so two writers never share one and `sweep_temporaries` finds what a dead writer left),
the file is fsynced, renamed over the target, then its directory is fsynced, so after a power loss the name
never points at data that did not reach the disk. `append_line`: one whole-line O_APPEND write, fsynced.
`fsync=False` is for node stores in /dev/shm (tmpfs: fsync there has nothing to flush to).
"""
from __future__ import annotations

import os
import uuid
from pathlib import Path

TMP_MARK = ".tmp-"


def temporary_name(final: Path) -> Path:
    """A unique temporary path beside `final` (hidden, marked for the sweep)."""
    return final.with_name(f".{final.name}{TMP_MARK}{uuid.uuid4().hex}")


def is_temporary(filename: str) -> bool:
    return filename.startswith(".") and TMP_MARK in filename


def fsync_dir(path: str | Path) -> None:
    """fsync a directory, so the names created, renamed or removed in it survive a power loss."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dirs(path: Path, *, fsync: bool = True) -> None:
    """`mkdir -p path`; with `fsync`, the parent of each directory made is fsynced (its new entry is durable)."""
    missing = []
    while not path.is_dir():
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        directory.mkdir(exist_ok=True)
        if fsync:
            fsync_dir(directory.parent)


def write_temporary(final: Path, data, *, fsync: bool = True) -> Path:
    """Write `data` (bytes-like) to a fresh temporary beside `final` (fsynced); its path."""
    make_dirs(final.parent, fsync=fsync)
    tmp = temporary_name(final)
    with open(tmp, "xb") as f:
        f.write(data)
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    return tmp


def write_atomic(path: str | Path, data, *, fsync: bool = True) -> None:
    """Replace `path` with `data` atomically and durably: temporary file, fsync, rename, fsync of the
    directory. Readers see the old bytes or the new ones, never a mix."""
    final = Path(path)
    tmp = write_temporary(final, data, fsync=fsync)
    try:
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if fsync:
        fsync_dir(final.parent)


def append_line(path: str | Path, line: str, *, fsync: bool = True) -> None:
    """Append `line` and its newline in one O_APPEND write (fsynced). A torn last line a crashed writer left
    is ended first, so it stays a line of its own (which readers skip) instead of being spliced into this one."""
    assert "\n" not in line, line
    path = Path(path)
    created = not path.exists()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        data = (line + "\n").encode()
        if not created and _ends_torn(path):
            data = b"\n" + data
        written = os.write(fd, data)
        if written != len(data):                           # a regular file writes short only when full
            raise OSError(f"{path}: wrote {written} of {len(data)} bytes (disk full?)")
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    if fsync and created:
        fsync_dir(path.parent)


def _ends_torn(path: Path) -> bool:
    """Whether the file's last byte is not a newline (a non-empty file whose last line was cut short)."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        if f.tell() == 0:
            return False
        f.seek(-1, os.SEEK_END)
        return f.read(1) != b"\n"
