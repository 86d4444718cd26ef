"""A Hugging Face model through the whole path: `autohet train --model hf:DIR --init-from DIR` (plain, not
elastic) on an emulated 3-node cluster, then `autohet export`: transformers loads the export and its logits
equal ours for the committed step; the run started from the HF weights (3 small AdamW steps away from them)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LR, STEPS = 1e-3, 3


def autohet(*args: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}      # start an emulated cluster
    done = subprocess.run([sys.executable, "-m", "autohet_ray.cli", *args, "--json"], cwd=REPO, text=True,
                          capture_output=True, timeout=280, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _hf_llama(path):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
                                      rope_theta=500000.0, rms_norm_eps=1e-6, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(path)
    return {n: t.detach().clone() for n, t in model.state_dict().items()}


def _our_logits(storage: str, step: int, ids: torch.Tensor) -> torch.Tensor:
    """Our whole model with the committed step's parameters (assembled from the saved chunks)."""
    from autohet_ray.checkpoint import LocalDirTier, find_manifest, restore
    from autohet_ray.layout import Chunk
    from autohet_ray.model.spec import model_from_dict
    from autohet_ray.nn import build_model
    job = json.loads(open(os.path.join(storage, "job.json")).read())["job"]
    spec = model_from_dict(job["model"])
    tier = LocalDirTier(storage, name="storage")
    manifest = find_manifest([tier], step)
    model = build_model(spec).float().eval()
    needs = {n: (tuple(p.shape), Chunk.whole(tuple(p.shape))) for n, p in model.named_parameters()}
    state, _ = restore(manifest, needs, [tier])
    model.load_state_dict({n: t for n, (t, _, _) in state.items()})
    with torch.no_grad():
        return model(ids)


def test_train_from_hf_then_export_loads_in_transformers(tmp_path):
    hf_dir, storage, out = tmp_path / "hf", tmp_path / "storage", tmp_path / "export"
    initial = _hf_llama(hf_dir)
    run = autohet("train", "--cluster", "jobs/local-3.yaml", "--model", f"hf:{hf_dir}", "--init-from", str(hf_dir),
                  "--global-batch", "4", "--steps", str(STEPS), "--storage", str(storage), "--checkpoint-every", "0",
                  "--lr", str(LR), "--plan-time-limit-s", "2", "--setup-timeout-s", "180", "--emulate",
                  "--time-scale", "1")
    # plain `autohet train` commits its final step
    assert run["secured"]["step"] == STEPS and run["storage_committed"] == [STEPS]
    assert run["launch"]["init_from_bytes"] > 0
    exported = autohet("export", "--storage", str(storage), "--out", str(out), "--max-shard-size", "40KB")
    assert exported["step"] == STEPS and len(exported["files"]) > 1
    assert (out / "model.safetensors.index.json").exists()

    reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(out)).float().eval()
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        theirs = reloaded(ids).logits
    ours = _our_logits(str(storage), STEPS, ids)
    assert theirs.abs().max() > 0.5
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)
    # the run started from the HF weights: AdamW moves each weight by at most ~lr per step
    trained = reloaded.state_dict()
    moved = max(float((trained[n] - t).abs().max()) for n, t in initial.items())
    assert 0 < moved <= STEPS * LR * 1.01, moved
