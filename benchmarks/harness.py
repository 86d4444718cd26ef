"""What every benchmark case shares: the case itself (name, what it measures, its inputs, its result fields), running
one in this process with its output kept, and the record the runner writes to benchmarks/measured/.

A case's module has `main(argv=None)`, which prints its progress and ends with one JSON line: its result."""
from __future__ import annotations

import contextlib
import datetime
import importlib
import io
import json
import os
import pathlib
import subprocess
import sys
import time
from dataclasses import dataclass

REPO = pathlib.Path(__file__).resolve().parents[1]
MEASURED = REPO / "benchmarks" / "measured"


@dataclass(frozen=True, kw_only=True)
class Case:
    """One benchmark."""
    name: str                      # what `python -m benchmarks run NAME` takes
    module: str                    # the module under benchmarks/ whose main(argv) runs it
    measures: str                  # one line: what it measures, and in which world (predicted, emulated, ...)
    inputs: str                    # its options, as `--help` lists them; after `--` on the runner's command line
    result_fields: tuple[str, ...]  # the keys of its final JSON line that carry the figures
    quick: tuple[str, ...] | None = None  # the options of `--quick` (under a minute here); None: no quick form
    parts: tuple[str, ...] = ()    # sub-cases, run alone as NAME:PART (the module takes `--part PART`)

    @property
    def file(self) -> pathlib.Path:
        """The module's source file."""
        path = REPO / "benchmarks" / self.module.replace(".", "/")
        return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


class _Tee(io.TextIOBase):
    """Writes through to `out` and keeps a copy."""

    def __init__(self, out):
        self.out, self.kept = out, io.StringIO()

    def write(self, text: str) -> int:
        self.kept.write(text)
        return self.out.write(text)

    def flush(self) -> None:
        self.out.flush()


def last_json_object(text: str) -> dict | None:
    """The last line of `text` that is a JSON object, or None."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                found = json.loads(line)
                if isinstance(found, dict):
                    return found
    return None


def run_module(module: str, argv: list[str]) -> tuple[int, dict | None]:
    """(exit code, the final JSON object it printed) of benchmarks.<module>'s main(argv), run in this process with
    its printed output passed through; sys.argv reads as the script's own command line meanwhile."""
    main = importlib.import_module(f"benchmarks.{module}").main
    tee, saved_argv = _Tee(sys.stdout), sys.argv
    sys.argv = [f"benchmarks/{module.replace('.', '/')}.py", *argv]
    try:
        with contextlib.redirect_stdout(tee):
            try:
                code = main(argv)
            except SystemExit as stop:          # argparse's --help and errors
                code = stop.code
    finally:
        sys.argv = saved_argv
    code = code if isinstance(code, int) else (0 if code is None else 1)
    return code, last_json_object(tee.kept.getvalue())


def current_commit() -> str:
    """The repository's commit, with "-dirty" when the working tree has changes."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False).stdout.strip()
    head = git("rev-parse", "HEAD") or "unknown"
    return head + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def record(case_name: str, argv: list[str], result: dict, *, commit: str, started: float, wall_s: float, load_before,
           out_dir: pathlib.Path = MEASURED) -> pathlib.Path:
    """Writes `result` with what it was measured on to out_dir/NAME-<date>.json (-2, -3, ... when taken)."""
    when = datetime.datetime.fromtimestamp(started, datetime.timezone.utc)
    stem = f"{case_name.replace(':', '-')}-{when.date().isoformat()}"
    out_dir.mkdir(parents=True, exist_ok=True)
    path, n = out_dir / f"{stem}.json", 1
    while path.exists():
        n += 1
        path = out_dir / f"{stem}-{n}.json"
    command = " ".join(["python -m benchmarks run", case_name, *(["--", *argv] if argv else [])])
    body = {"case": case_name, "command": command,
            "commit": commit, "cores": os.cpu_count(), "load_average_before": list(load_before),
            "load_average_after": list(os.getloadavg()), "started_utc": when.isoformat(timespec="seconds"),
            "wall_s": round(wall_s, 2), "result": result}
    path.write_text(json.dumps(body, indent=1) + "\n")
    return path


def run_case(case: Case, part: str | None, argv: list[str], out_dir: pathlib.Path = MEASURED) -> int:
    """Runs one case (or one of its parts) and records its result; its exit code."""
    name = case.name if part is None else f"{case.name}:{part}"
    load_before, started, t0 = os.getloadavg(), time.time(), time.perf_counter()
    code, result = run_module(case.module, (["--part", part] if part else []) + argv)
    if code == 0 and result is not None:
        path = record(name, argv, result, commit=current_commit(), started=started, wall_s=time.perf_counter() - t0,
                      load_before=load_before, out_dir=out_dir)
        print(f"recorded in {path.relative_to(REPO) if path.is_relative_to(REPO) else path}", file=sys.stderr)
    elif code == 0:
        print(f"{name} printed no JSON result: nothing recorded", file=sys.stderr)
        code = 1
    return code
