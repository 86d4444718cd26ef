"""`autohet plan` with prices, end to end (the bound runs in a child process: the cli tier)."""
import json

import pytest

from autohet_ray.cli import main

pytestmark = pytest.mark.cli


def _plan(capsys, *extra, prices="jobs/clusters/prices.yaml"):
    code = main(["plan", "--cluster", "jobs/clusters/could-rent.yaml", "--model", "gpt3-1.3b", "--global-batch", "64",
                 "--prices", prices, "--json", *extra])
    return code, capsys.readouterr()


def test_fleet_answer_rents_whole_instances_of_what_could_be_rented(capsys):
    code, out = _plan(capsys, "--objective", "cost")
    assert code == 0
    report = json.loads(out.out.strip().splitlines()[-1])
    money = report["money"]
    rent = money["rent"]
    assert 0 < len(rent) < 10 and money["left_out"]
    for r in rent:                 # each node used is one whole instance of the prices file, paid in full
        assert r["instance"] in ("h800x8", "h20x8", "p3.16xlarge") and r["gpus"] == 8 and 0 < r["gpus_used"] <= 8
    used = {s["node"] for p in report["plan"]["pipelines"] for s in p["stages"]}
    assert used == {r["node"] for r in rent}
    assert money["plan"]["usd_per_hour"] == pytest.approx(sum(r["usd_per_hour"] for r in rent))
    assert money["plan"]["usd_per_hour"] < money["all_nodes_usd_per_hour"]
    assert money["lower_bound_usd_per_million_tokens"] <= money["plan"]["usd_per_million_tokens"]
    for name, baseline in money["baselines"].items():      # no baseline is cheaper per token than the plan
        assert baseline["usd_per_million_tokens"] >= money["plan"]["usd_per_million_tokens"] * (1 - 1e-9), name


def test_an_unmeetable_floor_is_one_line_and_exit_2(capsys):
    code, out = _plan(capsys, "--min-samples-per-s", "1e9")
    assert code == 2
    assert out.err.count("\n") == 1 and "no plan reaches 1e+09 samples/s" in out.err


def test_a_prices_file_without_gpus_per_instance_is_one_line_and_exit_2(capsys, tmp_path):
    bad = tmp_path / "prices.yaml"
    bad.write_text("instances:\n  p5.48xlarge: {device: H800, on_demand: 98.32, spot: 39.33}\n")
    code, out = _plan(capsys, "--objective", "cost", prices=str(bad))
    assert code == 2
    assert out.err.count("\n") == 1 and "instances.p5.48xlarge needs gpus (GPUs per instance)" in out.err
