"""Test tiers.

Every test belongs to exactly one tier, by its folder unless it is marked otherwise:
- `unit`  (tests/unit): one process, pure code; no Ray, no subprocess. The whole tier runs in under 2 minutes.
- `cli`   a whole command, or another program, run end to end on one machine: the `autohet` command (whose
          `plan` solves its lower bound in a child process), a subprocess killed mid-upload, a fresh interpreter.
- `dist`  (tests/dist): several torch processes (gloo on CPU), each result compared with one process.
- `ray`   (tests/ray): a local Ray cluster.
- `testbed` (tests/testbed): a heterogeneous testbed on this machine (root: network namespaces, cgroups; CI runs
          it as root, elsewhere it is skipped with the reason).
A `unit` test that starts a process fails at once, naming the tier it belongs to.
"""
import _posixsubprocess
import os
import pathlib
import subprocess

import pytest

TIERS = ("unit", "cli", "dist", "ray", "testbed")
TIER_OF_FOLDER = {"unit": "unit", "cli": "cli", "dist": "dist", "ray": "ray", "testbed": "testbed"}


def pytest_configure(config):
    config.addinivalue_line("markers", "unit: one process, pure code; no Ray, no subprocess (under 2 minutes in all)")
    config.addinivalue_line("markers", "cli: a whole command or another program run end to end on one machine")
    config.addinivalue_line("markers", "dist: several torch processes (gloo on CPU)")
    config.addinivalue_line("markers", "ray: a local Ray cluster")
    config.addinivalue_line("markers", "testbed: a heterogeneous testbed of CPU shares and shaped links (root)")


def tier_of(item) -> str:
    """The tier a test is marked with, else its folder's; exactly one."""
    marked = [t for t in TIERS if item.get_closest_marker(t) is not None]
    assert len(marked) <= 1, f"{item.nodeid} is marked with several tiers: {marked}"
    if marked:
        return marked[0]
    folder = pathlib.Path(str(item.fspath)).parent.name
    assert folder in TIER_OF_FOLDER, f"{item.nodeid}: no tier marker and no tier folder (one of {TIERS})"
    return TIER_OF_FOLDER[folder]


def pytest_collection_modifyitems(config, items):
    for item in items:
        tier = tier_of(item)
        if item.get_closest_marker(tier) is None:
            item.add_marker(tier)


def _refuse_processes(monkeypatch, nodeid: str) -> None:
    def refuse(*_args, **_kwargs):
        raise AssertionError(f"{nodeid} is a `unit` test but starts a process: mark it `cli`, `dist` or `ray`")
    monkeypatch.setattr(subprocess, "_fork_exec", refuse)            # subprocess.Popen
    monkeypatch.setattr(_posixsubprocess, "fork_exec", refuse)       # multiprocessing's spawn and forkserver
    monkeypatch.setattr(os, "fork", refuse)                          # multiprocessing's fork
    if hasattr(os, "posix_spawn"):
        monkeypatch.setattr(os, "posix_spawn", refuse)               # subprocess's posix_spawn fast path


@pytest.fixture(autouse=True)
def _unit_tests_start_no_process(request, monkeypatch):
    if request.node.get_closest_marker("unit") is not None:
        _refuse_processes(monkeypatch, request.node.nodeid)
    yield
