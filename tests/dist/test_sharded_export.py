"""`autohet export` of a checkpoint a sharded plan wrote as slices: the Hugging Face weights equal those of the
same plan's unsharded run, and transformers' logits from them equal the one-process reference's after the
same steps (fp64, tiny-llama, the layer-wise asymmetric plan: every unit's state split between two pipelines).

One spawned world trains the plan unsharded and sharded; each run's snapshot (a sharded rank: its own slices)
goes with the real snapshotter into a job storage directory (with the job.json an export reads); the CLI
exports each (a subprocess)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from _harness import FAMILY_SPECS, make_batch, pipeline, reference_run
from _sharded_worker import ShardCase
from _slice_worker import train_both, write_checkpoint
from autohet_ray.checkpoint import LocalDirTier
from autohet_ray.nn import build_model
from autohet_ray.runtime import run_world

transformers = pytest.importorskip("transformers")
safetensors = pytest.importorskip("safetensors.torch")

SPEC = FAMILY_SPECS["llama"]
CASE = ShardCase(name="layerwise", spec=SPEC, pipelines=(pipeline(2, (0, 1, 1), (1, 4, 1)),
                                                       pipeline(3, (0, 3, 1), (3, 4, 1))), steps=3)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _export(ranks: list[dict], storage, out) -> dict[str, torch.Tensor]:
    """Commit the ranks' snapshots as step CASE.steps of a job in `storage`, `autohet export` it to `out`."""
    os.makedirs(storage)
    write_checkpoint(ranks, LocalDirTier(storage, name="cloud"), CASE.steps)
    with open(os.path.join(storage, "job.json"), "w") as f:
        json.dump({"job_id": "sharded-export", "job": {"model": vars(SPEC)}}, f)
    done = subprocess.run([sys.executable, "-m", "autohet_ray.cli", "export", "--storage", str(storage),
                           "--out", str(out), "--json"], cwd=REPO, text=True, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["step"] == CASE.steps
    weights = {}
    for name in os.listdir(out):
        if name.endswith(".safetensors"):
            weights.update(safetensors.load_file(os.path.join(out, name)))
    return weights


def test_export_of_a_slice_stored_checkpoint_equals_the_unsharded_runs(tmp_path):
    ranks = run_world(train_both, 4, CASE, CASE.steps)
    sharded = [r["sharded"] for r in ranks]
    assert all(any(not isinstance(k, str) for k in r["state"]) for r in sharded)     # stored as slices
    theirs = _export(sharded, tmp_path / "sharded", tmp_path / "hf-sharded")
    plain = _export([r["none"] for r in ranks], tmp_path / "none", tmp_path / "hf-none")
    assert set(theirs) == set(plain) and len(plain) > 10
    for name, tensor in plain.items():
        assert torch.allclose(theirs[name], tensor, rtol=1e-10, atol=0), name

    model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf-sharded"),
                                                              dtype=torch.float64).eval()
    ref = reference_run(CASE)
    ours = build_model(SPEC).double().eval()
    ours.load_state_dict({n: t for n, t in ref["state"].items() if not n.startswith("optim.")})
    ids = make_batch(SPEC, CASE.plan, 0)["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ours(ids), rtol=1e-6, atol=1e-6)
