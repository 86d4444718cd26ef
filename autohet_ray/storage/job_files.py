"""The job's files beside its checkpoints in its storage (a tier spec, storage/spec.py): job.json (the job id and
config), profile.json (the profile every plan is priced with), plan.json (the plan running now) and
metrics.jsonl (one line per step, appended as each step completes).

In a directory every file is written durably (autohet_ray/durable.py). On S3, which cannot append, metrics.jsonl
is a series of numbered part objects (`metrics.jsonl.parts/00000000`, ...): each step rewrites only the part
it fills (at most PART_LINES lines), never the whole log. `read_lines` reads either as one log."""
from __future__ import annotations

import functools
import json
import logging
import os

from autohet_ray.durable import append_line, write_atomic
from autohet_ray.storage.spec import location

log = logging.getLogger(__name__)

JOB_FILE, PROFILE_FILE, PLAN_FILE, METRICS_FILE = "job.json", "profile.json", "plan.json", "metrics.jsonl"
PART_LINES = 16                  # lines per metrics part on S3: each step uploads at most this many
PARTS_SUFFIX = ".parts/"


def _s3(spec: dict):
    return s3_client(spec["bucket"], spec.get("endpoint_url") or os.environ.get("AWS_ENDPOINT_URL"))


@functools.lru_cache(maxsize=16)
def s3_client(bucket: str, endpoint_url: str | None):
    """The boto3 client of one storage, made once (a LineLog writes every step; boto3 clients are thread-safe)."""
    from autohet_ray.checkpoint.tiers.s3 import S3Config, make_client  # lazy: boto3, for S3 only
    return make_client(S3Config(bucket=bucket, endpoint_url=endpoint_url))


def write_text(spec: dict, name: str, text: str) -> str:
    """Write `name` under the storage (in a directory atomically and durably: a temporary of its own, fsync,
    rename, fsync of the directory); returns its location. S3 goes through boto3 (endpoint from the spec or
    AWS_ENDPOINT_URL, credentials as boto3 finds them)."""
    if spec["kind"] == "dir":
        path = location(spec, name)
        write_atomic(path, text.encode(), fsync=spec.get("fsync", True))
        return path
    _s3(spec).put_object(Bucket=spec["bucket"], Key=spec.get("prefix", "") + name, Body=text.encode())
    return location(spec, name)


def read_text(spec: dict, name: str) -> str | None:
    """The text of `name` under the storage, None when there is none."""
    if spec["kind"] == "dir":
        try:
            with open(location(spec, name)) as f:
                return f.read()
        except FileNotFoundError:
            return None
    client = _s3(spec)
    try:
        return client.get_object(Bucket=spec["bucket"], Key=spec.get("prefix", "") + name)["Body"].read().decode()
    except client.exceptions.NoSuchKey:
        return None


def _part_names(spec: dict, name: str) -> list[str]:
    """The names (relative to the storage) of the S3 parts of line log `name`, in order."""
    client, prefix = _s3(spec), spec.get("prefix", "")
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=spec["bucket"], Prefix=prefix + name + PARTS_SUFFIX)
    names = (obj["Key"][len(prefix):] for page in pages for obj in page.get("Contents", []))
    return sorted(n for n in names if n.rsplit("/", 1)[1].isdigit())


def read_lines(spec: dict, name: str = METRICS_FILE) -> list[str]:
    """Every complete line of line log `name`, in order (a directory's file, or S3's parts after a whole
    object an older version wrote). A torn last line (its writer died mid-write) is skipped with a warning."""
    texts = [read_text(spec, name) or ""]
    if spec["kind"] == "s3":
        texts += [read_text(spec, part) or "" for part in _part_names(spec, name)]
    lines = []
    for text in texts:
        body, _, torn = text.rpartition("\n") if not text.endswith("\n") else (text[:-1], "", "")
        if torn:
            log.warning(f"autohet: {location(spec, name)}: skipped a torn last line ({len(torn)} bytes, its writer "
                        f"stopped mid-write)")
        lines += body.split("\n") if body else []
    return lines


def read_metrics(spec: dict) -> list[dict]:
    """The job's per-step metrics (metrics.jsonl, read by `read_lines`); a line that is not a JSON object (the
    torn line of a writer that died, ended by the next append) is skipped with a warning."""
    out = []
    for number, line in enumerate(read_lines(spec, METRICS_FILE), 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if not isinstance(record, dict):
            log.warning(f"autohet: {location(spec, METRICS_FILE)}: skipped line {number}, not a JSON object "
                        f"(a torn write): {line[:60]!r}")
            continue
        out.append(record)
    return out


class LineLog:
    """A text file of the storage that grows by one line at a time, durable after each `append` (a directory:
    one whole-line O_APPEND write, fsynced; S3: the part being filled rewritten, a new part every PART_LINES
    lines; a resumed job starts a new part)."""

    def __init__(self, spec: dict, name: str, *, part_lines: int = PART_LINES):
        assert part_lines >= 1, part_lines
        self.spec, self.name, self.part_lines = spec, name, part_lines
        self.part: list[str] = []
        if spec["kind"] == "s3":
            parts = _part_names(spec, name)
            self.part_index = int(parts[-1].rsplit("/", 1)[1]) + 1 if parts else 0

    def append(self, line: str) -> None:
        assert "\n" not in line, line
        if self.spec["kind"] == "dir":
            os.makedirs(self.spec["path"], exist_ok=True)
            append_line(location(self.spec, self.name), line, fsync=self.spec.get("fsync", True))
            return
        if len(self.part) == self.part_lines:
            self.part, self.part_index = [], self.part_index + 1
        self.part.append(line)
        write_text(self.spec, f"{self.name}{PARTS_SUFFIX}{self.part_index:08d}", "".join(x + "\n" for x in self.part))
