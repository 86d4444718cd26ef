"""The `testbed` tier (needs root, network namespaces, tbf and cgroup v1 cpu/freezer; skipped with the reason
otherwise): the smallest testbed (jobs/testbeds/smallest.yaml) comes up; `autohet train` profiles its device
classes for real, plans and trains 2 steps unpaced in float64, matching a single-process run; then a node
vanishes (frozen, link down) under an elastic job on the testbed's S3 and is recovered with no committed step lost
and nothing read from S3. After `down` nothing of the testbed is left."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from autohet_ray.testbed import bed
from autohet_ray.testbed.host import HostUnfit, check_host
from autohet_ray.testbed.spec import load_testbed

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALLEST = os.path.join(REPO, "jobs", "testbeds", "smallest.yaml")
MODEL = {"name": "tb-tiny", "family": "gpt", "num_layers": 4, "hidden": 64, "num_heads": 4, "num_kv_heads": 4,
         "ffn_hidden": 256, "vocab_size": 256, "max_seq_len": 16}
# both nodes train (data-parallel), so the vanished one takes a rank with it
PLAN = {"schema_version": 1, "model": "tb-tiny", "global_batch": 4, "micro_batch": 1, "seq_len": 16,
        "pipelines": [{"num_microbatches": n, "stages": [{"layers": [0, 4], "tp": 1, "device_type": device,
                                                          "node": node, "devices": [0]}]}
                      for n, device, node in ((3, "H800", "fast"), (1, "H20", "slow"))]}
pytestmark = [pytest.mark.testbed, pytest.mark.timeout(420)]


@pytest.fixture(scope="module")
def smallest(tmp_path_factory):
    try:
        check_host()
    except HostUnfit as exc:
        pytest.skip(str(exc))
    work = tmp_path_factory.mktemp("testbed")
    os.chmod(work, 0o755)
    (work / "model.json").write_text(json.dumps(MODEL))
    (work / "plan.json").write_text(json.dumps(PLAN))
    bed.up(load_testbed(SMALLEST))
    try:
        yield work
    finally:
        bed.down()
    left = bed.leftovers()
    assert left == {"namespaces": [], "links": [], "cgroups": [], "processes": []}, left
    assert "ahtb" not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def test_the_product_profiles_plans_and_trains_unpaced_matching_one_process(smallest):
    import torch

    from autohet_ray.data.synthetic import synthetic_batch
    from autohet_ray.model.spec import model_from_dict
    from autohet_ray.runtime.reference import Reference
    out = bed.drive([sys.executable, "-m", "autohet_ray.cli", "train", "--cluster", bed.CLUSTER_PATH, "--model",
                     str(smallest / "model.json"), "--profile", "measured", "--micro-batch", "1",
                     "--global-batch", "4", "--steps", "2", "--dtype", "float64", "--no-baselines",
                     "--storage", str(smallest / "run"), "--plan-time-limit-s", "10", "--json"], timeout_s=300)
    assert out.returncode == 0
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert not result["emulated"] and result["predicted_iteration_s"] > 0
    profile = json.loads((smallest / "run" / "profile.json").read_text())
    assert profile["kind"] == "measured" and set(profile["meta"]["types"]) == {"H800", "H20"}
    fast, slow = ({e["device_type"]: e["layers"]["layer"] for e in profile["entries"]}[d] for d in ("H800", "H20"))
    assert slow["fwd_s"] + slow["bwd_s"] > 1.3 * (fast["fwd_s"] + fast["bwd_s"])   # shares 0.6 vs 0.3
    ref = Reference(model_spec=model_from_dict(MODEL), dtype=torch.float64)
    expected = [ref.train_step(synthetic_batch(vocab_size=256, global_batch=4, seq_len=16, seed=0, step=i))["loss"]
                for i in range(2)]
    assert [s["loss"] for s in result["steps"]] == pytest.approx(expected, rel=1e-9)


def test_a_vanished_node_is_recovered_with_no_committed_step_lost(smallest):
    out = bed.drive([sys.executable, os.path.join(REPO, "benchmarks", "testbed_bench.py"), "--inner-recover",
                     "local_first", "--plan", str(smallest / "plan.json"), "--vanish", "slow", "--storage-mbit", "200", "--model",
                     str(smallest / "model.json"), "--global-batch", "4", "--seq-len", "16"], timeout_s=300)
    assert out.returncode == 0
    rec = json.loads(out.stdout.strip().splitlines()[-1])
    assert rec["lost_nodes"] == ["slow"] and rec["lost_steps"] == 0, rec
    assert rec["storage_bytes"] == 0, rec                      # local-first: the peer copies on node fast
    assert rec["detect_s"] <= rec["loss_grace_s"] + 3, rec
