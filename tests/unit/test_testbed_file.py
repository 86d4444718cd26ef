"""The testbed file (autohet_ray/testbed/spec.py): a good file becomes the product's cluster file; a bad one
(unknown class, a share over one core, shares over the budget, a zero rate) is one line and exit 2 from
`autohet testbed up`, before anything starts."""
from __future__ import annotations

import glob
import os

import pytest
import yaml

from autohet_ray import ConfigError
from autohet_ray.cli.main import main
from autohet_ray.cluster.spec import cluster_from_dict
from autohet_ray.testbed.spec import load_testbed, parse_testbed

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOOD = {"name": "t", "classes": {"H800": {"share": 0.6}, "H20": {"share": 0.3}},
        "nodes": [{"name": "a", "class": "H800", "count": 1, "nic_mbit": 400},
                  {"name": "b", "class": "H20", "count": 2, "nic_mbit": 100}],
        "storage": {"mbit": 200}}


def test_a_testbed_is_a_cluster_of_its_classes_with_its_nic_rates():
    bed = parse_testbed(GOOD, cores=2)
    assert bed.total_share == pytest.approx(1.2)
    cluster = cluster_from_dict(bed.cluster_dict())
    assert [(n.name, n.device, n.count, n.nic_gbps) for n in cluster.nodes] == [("a", "H800", 1, 0.4),
                                                                                  ("b", "H20", 2, 0.1)]
    assert parse_testbed(bed.to_dict(), cores=2) == bed


def test_every_shipped_testbed_file_fits_two_cores():
    files = sorted(glob.glob(os.path.join(REPO, "jobs", "testbeds", "*.yaml")))
    assert files
    for path in files:
        assert load_testbed(path, cores=2).total_share <= 2


BAD = [
    ({"classes": {"H999": {"share": 0.5}}}, "unknown class 'H999'"),
    ({"nodes": [{"name": "a", "class": "A100-80GB", "nic_mbit": 1}]}, "unknown class"),
    ({"classes": {"H800": {"share": 1.5}, "H20": {"share": 0.3}}}, "over one core"),
    ({"classes": {"H800": {"share": 0.05}, "H20": {"share": 0.3}}}, "under 0.1"),
    ({"classes": {"H800": {"share": 0.9}, "H20": {"share": 0.9}}}, "over the budget"),
    ({"storage": {"mbit": 0}}, "storage.mbit=0 must be > 0"),
    ({"nodes": [{"name": "a", "class": "H800", "nic_mbit": 0}]}, "nic_mbit=0 must be > 0"),
    ({"nodes": [{"name": "a/b", "class": "H800", "nic_mbit": 1}]}, "letters, digits"),
    ({"cpu_weight": 1}, "cpu_weight=1"),
    ({"colour": "red"}, "unknown keys ['colour']"),
]


@pytest.mark.parametrize("change,message", BAD, ids=[m for _, m in BAD])
def test_a_bad_testbed_file_is_one_line_and_exit_2(tmp_path, capsys, change, message):
    path = tmp_path / "bed.yaml"
    path.write_text(yaml.safe_dump(GOOD | change))
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_testbed(str(path), cores=2)
    if "budget" in message and (os.cpu_count() or 1) > 2:
        return                               # the CLI judges the budget by this host's cores
    assert main(["testbed", "up", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message.split("=")[0] in err, err


def test_a_worker_joins_the_cgroup_of_the_device_ray_gave_it(tmp_path, monkeypatch):
    from autohet_ray.runtime.device import join_device_cgroup
    monkeypatch.delenv("AUTOHET_DEVICE_CGROUPS", raising=False)
    def never_asked():
        raise AssertionError("the devices were asked for off a testbed (outside Ray that starts a Ray cluster)")
    assert join_device_cgroup(never_asked) is None                    # off a testbed: nothing to join
    (tmp_path / "dev1").mkdir()
    monkeypatch.setenv("AUTOHET_DEVICE_CGROUPS", str(tmp_path))
    assert join_device_cgroup(lambda: []) is None                     # a worker that takes no device
    assert join_device_cgroup(lambda: ["1"]) == str(tmp_path / "dev1" / "cgroup.procs")
    assert (tmp_path / "dev1" / "cgroup.procs").read_text() == str(os.getpid())
    with pytest.raises(RuntimeError, match="exactly one device"):
        join_device_cgroup(lambda: ["0", "1"])


def test_under_a_quota_a_timed_rep_spans_twenty_periods():
    from autohet_ray.profile.measure import reps_per_block
    assert reps_per_block(0.002, None) == 1                           # no quota: one rep, the fastest kept
    assert reps_per_block(0.002, 0.010) == 100                        # 20 periods of 10 ms in 2 ms reps
    assert reps_per_block(0.5, 0.010) == 1
