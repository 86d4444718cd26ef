"""Every `autohet` command, given a malformed input file or flag, prints one line on stderr and exits 2, without
a traceback (the cases: bad_inputs.py, sweep_setup.py). The commands run in this process (their main()); the
crashes the issue names run once more through the real entry point, in a subprocess (marked `cli`)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import ray

from autohet_ray import cli
from bad_inputs import DIRECTORY
from sweep_setup import file_cases, flag_cases, make_valid_inputs

CASES = file_cases() + flag_cases()
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def write_files(folder: str, files: dict) -> None:
    for path, content in files.items():
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if content is DIRECTORY:
            os.makedirs(path, exist_ok=True)
        else:
            with open(path, "wb" if isinstance(content, bytes) else "w") as f:
                f.write(content)


def run_case(folder: str, ok: str, argv: list[str], files: dict, capsys) -> tuple[int | str, str]:
    """(exit code, or the exception that escaped main(); stderr) of `autohet argv` run in this process."""
    write_files(folder, {k.format(d=folder, ok=ok): v for k, v in files.items()})
    capsys.readouterr()
    try:
        code = cli.main([a.format(d=folder, ok=ok) for a in argv])
    except SystemExit as exc:                   # argparse: a flag of the wrong type
        code = exc.code
    except BaseException as exc:                # noqa: BLE001 - a crash is the finding
        code = f"{type(exc).__name__}: {exc}"
    return code, capsys.readouterr().err


def one_line_exit_2(code, err: str) -> bool:
    lines = err.strip().splitlines()
    return code == 2 and len(lines) == 1 and lines[0].startswith("autohet") and "Traceback" not in err


@pytest.fixture(scope="module")
def valid_inputs(tmp_path_factory):
    return make_valid_inputs(str(tmp_path_factory.mktemp("ok")))


def _refuse_ray(*_args, **_kwargs):
    raise AssertionError("a bad input reached ray.init: it must be refused before any cluster starts")


def test_the_sweep_covers_every_command():
    assert {argv[0] for _name, argv, _files in CASES} == \
        {"plan", "evaluate", "show", "train", "resume", "export", "data", "profile"}
    assert len(CASES) > 1000, len(CASES)


def test_every_bad_input_gets_one_line_and_exit_2(tmp_path, valid_inputs, capsys, monkeypatch):
    monkeypatch.setattr(ray, "init", _refuse_ray)
    failures = []
    for k, (name, argv, files) in enumerate(CASES):
        code, err = run_case(str(tmp_path / str(k)), valid_inputs, argv, files, capsys)
        if not one_line_exit_2(code, err):
            failures.append(f"{name}: exit {code!r}, stderr {err.strip()[-300:]!r}")
    with capsys.disabled():
        print(f"\nbad-input sweep: {len(CASES)} cases, {len(CASES) - len(failures)} one line + exit 2")
    assert not failures, f"{len(failures)} of {len(CASES)} cases:\n" + "\n".join(failures[:60])


def test_a_good_input_still_passes(tmp_path, valid_inputs, capsys):
    """The checks refuse only bad inputs: the valid plan prices, the valid dataset checks."""
    ok = valid_inputs
    assert cli.main(["evaluate", "--plan", f"{ok}/plan.json", "--cluster", f"{ok}/cluster.yaml", "--json"]) == 0
    assert cli.main(["data", "check", f"{ok}/data"]) == 0
    assert capsys.readouterr().err == ""


NAMED_CRASHES = [
    ("network: [200]", ["plan", "--cluster", "{d}/c.yaml", "--model", "tiny-gpt", "--global-batch", "4"],
     {"c.yaml": "nodes: [{name: a, device: H800, count: 1}]\nnetwork: [200]\n"}),
    ("nic_gbps: .nan", ["plan", "--cluster", "{d}/c.yaml", "--model", "tiny-gpt", "--global-batch", "4"],
     {"c.yaml": "nodes: [{name: a, device: H800, count: 1, nic_gbps: .nan}]\n"}),
    ("inter_node_gbps: .inf", ["plan", "--cluster", "{d}/c.yaml", "--model", "tiny-gpt", "--global-batch", "4"],
     {"c.yaml": "nodes: [{name: a, device: H800, count: 1}]\nnetwork: {inter_node_gbps: .inf}\n"}),
    ("evaluate --plan DIR", ["evaluate", "--plan", "{d}", "--cluster", f"{REPO}/jobs/local-3.yaml"], {}),
    ("job.json {}", ["export", "--storage", "{d}", "--out", "{d}/out"], {"job.json": "{}"}),
    ("job.json not JSON", ["export", "--storage", "{d}", "--out", "{d}/out"], {"job.json": "job: x"}),
    ("--plan-time-limit-s -1", ["plan", "--cluster", f"{REPO}/jobs/local-3.yaml", "--model", "tiny-gpt",
                         "--global-batch", "4", "--plan-time-limit-s", "-1"], {}),
]


@pytest.mark.cli
@pytest.mark.parametrize("argv,files", [c[1:] for c in NAMED_CRASHES], ids=[c[0] for c in NAMED_CRASHES])
def test_the_named_crashes_through_the_entry_point(tmp_path, argv, files):
    write_files(str(tmp_path), {os.path.join(tmp_path, k): v for k, v in files.items()})
    run = subprocess.run([sys.executable, "-m", "autohet_ray.cli", *[a.format(d=tmp_path) for a in argv]],
                         capture_output=True, text=True, timeout=300, cwd=REPO)
    assert one_line_exit_2(run.returncode, run.stderr), (run.returncode, run.stderr)
