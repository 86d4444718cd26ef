"""Every file under tests/ that defines a test is collected by the README's test command (`python -m pytest -q`):
pytest silently skips some folder names (`dist`, `build`, ...), and a test it never collects proves nothing."""
from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _files_defining_tests() -> set[str]:
    return {str(path.relative_to(ROOT)) for path in (ROOT / "tests").rglob("*.py")
            if re.search(r"^\s*(async\s+)?def test_", path.read_text(), re.M)}


def _collected_files() -> set[str]:
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return {line.split("::")[0] for line in done.stdout.splitlines() if "::" in line}


@pytest.mark.cli
def test_every_file_that_defines_a_test_is_collected():
    missing = _files_defining_tests() - _collected_files()
    assert not missing, f"never collected by `python -m pytest -q`: {sorted(missing)}"
