"""The benchmark cases and their runner (benchmarks/cases.py, benchmarks/harness.py): every benchmark module is a case
or a declared helper, every case docs/benchmarks.md cites exists, each case's result fields are keys its module
writes, and the runner records a result with what it was measured on."""
import ast
import json
import os
import pathlib
import re

import pytest

from benchmarks.cases import BY_NAME, CASES, HELPERS, find
from benchmarks.harness import REPO, last_json_object, record

BENCHMARKS = REPO / "benchmarks"
RUN = re.compile(r"python -m benchmarks run ([a-z0-9:-]+)")


def _module_names() -> set[str]:
    """Every module under benchmarks/ as `run_module` names it (optimality.money, ...), packages by their name."""
    names = set()
    for path in BENCHMARKS.rglob("*.py"):
        if "measured" in path.parts or path.name == "__main__.py" or path.parent == BENCHMARKS and \
                path.name == "__init__.py":
            continue
        rel = path.relative_to(BENCHMARKS).with_suffix("")
        names.add(".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts))
    return names


def test_every_benchmark_module_is_a_case_a_part_or_a_helper():
    parts = {f"{c.module}.{p}" for c in CASES for p in c.parts}
    declared = {c.module for c in CASES} | parts | set(HELPERS)
    assert _module_names() == declared
    assert len(BY_NAME) == len(CASES), "two cases share a name"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_a_case_runs_main_of_argv_and_its_result_fields_are_keys_its_module_writes(case):
    tree = ast.parse(case.file.read_text())
    mains = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
    assert mains and [a.arg for a in mains[0].args.args] == ["argv"], f"{case.file}: main(argv=None)"
    helpers = [BENCHMARKS / f"{a.name}.py" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
               and n.module == "benchmarks" for a in n.names]          # e.g. recovery_curve's curve report
    literals = {n.value for t in [tree, *(ast.parse(h.read_text()) for h in helpers)] for n in ast.walk(t)
                if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    missing = [f for f in case.result_fields if f not in literals]
    assert not missing, f"{case.name}: no key {missing} in {case.file.name}"
    assert case.measures and "\n" not in case.measures and case.inputs


def test_every_case_docs_cite_exists_and_every_figure_section_cites_the_runner():
    text = (REPO / "docs" / "benchmarks.md").read_text()
    cited = set(RUN.findall(text))
    for name in cited:
        find(name)                   # KeyError naming the valid cases
    assert len(cited) >= 15
    sections = text.split("\n## ")[1:]
    assert sections and all(RUN.search(section) for section in sections), "a section of figures with no command"


def test_an_unknown_case_or_part_names_the_valid_ones():
    with pytest.raises(KeyError, match="valid: planner, optimality"):
        find("optimality:speed")
    assert find("optimality:money") == (BY_NAME["optimality"], "money")


def test_no_benchmark_or_test_edits_the_import_path_or_loads_a_file_by_path():
    offenders = []
    for root in (BENCHMARKS, REPO / "tests"):
        for path in root.rglob("*.py"):
            text = path.read_text()
            if "sys" + ".path" in text or "spec_from_file" + "_location" in text:
                offenders.append(str(path.relative_to(REPO)))
    assert not offenders


def test_fast_health_checks_are_defined_once():
    pattern = re.compile(r"^FAST_HEALTH_CHECKS\s*=", re.M)
    defined = [str(p.relative_to(REPO)) for root in ("autohet_ray", "benchmarks", "tests")
               for p in (REPO / root).rglob("*.py") if pattern.search(p.read_text())]
    assert defined == ["autohet_ray/emulate/cluster.py"]


def test_the_last_json_object_is_the_result():
    text = 'progress\n{"a": 1}\n[1, 2]\n{"b": 2}\nnot json {\n'
    assert last_json_object(text) == {"b": 2} and last_json_object("none here") is None


def test_a_record_holds_the_result_with_commit_cores_load_and_time_and_never_overwrites(tmp_path):
    first = record("optimality:money", ["--only", "0"], {"max_gap": 0.0}, commit="f" * 40, started=1.8e9,
                   wall_s=1.234, load_before=(1.0, 2.0, 3.0), out_dir=tmp_path)
    second = record("optimality:money", [], {"max_gap": 0.1}, commit="f" * 40, started=1.8e9, wall_s=2.0,
                    load_before=(1.0, 2.0, 3.0), out_dir=tmp_path)
    assert first.name == "optimality-money-2027-01-15.json" and second.name == "optimality-money-2027-01-15-2.json"
    body = json.loads(first.read_text())
    assert body["result"] == {"max_gap": 0.0} and body["cores"] == os.cpu_count()
    assert body["command"] == "python -m benchmarks run optimality:money -- --only 0"
    assert body["commit"] == "f" * 40 and len(body["load_average_after"]) == 3
    assert body["started_utc"] == "2027-01-15T08:00:00+00:00" and body["wall_s"] == 1.23


@pytest.mark.cli          # asks git for the commit
def test_the_runner_runs_a_real_case_passes_its_options_and_records_its_last_line(tmp_path, capsys):
    """`python -m benchmarks run` on the optimality case's money part, one tiny instance (the planner and the
    exhaustive search)."""
    from benchmarks.__main__ import main
    assert main(["run", "optimality:money", "--out", str(tmp_path), "--", "--only", "0", "--goal", "throughput"]) == 0
    printed = last_json_object(capsys.readouterr().out)
    (path,) = tmp_path.iterdir()
    body = json.loads(path.read_text())
    assert body["result"] == printed and printed["instances"] == 1 and printed["goal"] == "throughput"
    assert printed["max_gap"] <= 0.01
    assert body["case"] == "optimality:money" and path.name.startswith("optimality-money-")
    assert body["command"] == "python -m benchmarks run optimality:money -- --only 0 --goal throughput"
    assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", body["commit"])
