"""`autohet plan` with prices, end to end (the bound runs in a child process: the cli tier)."""
import json

import pytest

from autohet_ray.cli import main

pytestmark = pytest.mark.cli


def _plan(capsys, *extra):
    code = main(["plan", "--cluster", "jobs/clusters/could-rent.yaml", "--model", "gpt3-1.3b", "--global-batch", "64",
                 "--prices", "jobs/clusters/prices.yaml", "--json", *extra])
    return code, capsys.readouterr()


def test_fleet_answer_rents_part_of_what_could_be_rented(capsys):
    code, out = _plan(capsys, "--objective", "cost")
    assert code == 0
    report = json.loads(out.out.strip().splitlines()[-1])
    money = report["money"]
    rented = sum(r["gpus"] for r in money["rent"])
    assert 0 < rented < 80 and money["left_out"]
    assert money["plan"]["usd_per_hour"] < money["all_gpus_usd_per_hour"]
    assert money["lower_bound_usd_per_million_tokens"] <= money["plan"]["usd_per_million_tokens"]
    for name, baseline in money["baselines"].items():      # no baseline is cheaper per token than the plan
        assert baseline["usd_per_million_tokens"] >= money["plan"]["usd_per_million_tokens"] * (1 - 1e-9), name


def test_an_unmeetable_floor_is_one_line_and_exit_2(capsys):
    code, out = _plan(capsys, "--min-samples-per-s", "1e9")
    assert code == 2
    assert out.err.count("\n") == 1 and "no plan reaches 1e+09 samples/s" in out.err
