"""Hugging Face models on asymmetric plans (gloo/CPU) against transformers itself: tiny random LlamaForCausalLM
(GQA, rope_theta 500000, untied) and GPT2LMHeadModel (tied) made here, never downloaded. Each rank loads only
its slices of the safetensors files (--init-from); the first-step loss equals transformers' loss on the same
batch, and three AdamW steps follow transformers trained by torch's AdamW. A tied model keeps its embedding
(first stages) and head (last stages) equal.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from _harness import make_batch, make_plan, pipeline
from _hf_worker import CLIP, LR, STEPS, seeded_tied_run, train_cases
from autohet_ray.model.hf_config import spec_from_hf_dir
from autohet_ray.model.spec import PRESETS
from autohet_ray.nn.hf import local_to_hf
from autohet_ray.runtime import run_world

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

FIRST_LOSS_TOL = 1e-5           # absolute, fp32
LOSS_TOL, PARAM_TOL = 1e-5, 1e-4    # relative: later losses; parameters after the steps (norm of the difference)
# two pipelines, TP2 in one stage, different stage boundaries (5 ranks)
ASYMMETRIC = (pipeline(2, (0, 1, 1), (1, 4, 2)), pipeline(2, (0, 3, 1), (3, 4, 1)))
# a single-stage pipeline (holding embedding and head) beside a TP2 -> TP2 one (5 ranks)
ONE_STAGE_BESIDE_TP2 = (pipeline(1, (0, 4, 1)), pipeline(2, (0, 2, 2), (2, 4, 2)))
WORLD = 5
# name -> (pipelines, schedule); zb-h1 defers weight gradients (the tied head's among them) to W actions
CASES = {"llama": (ASYMMETRIC, "1f1b"), "gpt2": (ASYMMETRIC, "1f1b"), "gpt2-one-stage": (ONE_STAGE_BESIDE_TP2, "1f1b"),
         "gpt2-zb": (ASYMMETRIC, "zb-h1")}
KINDS = list(CASES)
TIED_KINDS = [k for k in KINDS if k.startswith("gpt2")]


def _hf_model(kind: str):
    torch.manual_seed(0)
    if kind == "llama":
        config = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                          rope_theta=500000.0, rms_norm_eps=1e-6, tie_word_embeddings=False)
        model = transformers.LlamaForCausalLM(config)
    else:
        config = transformers.GPT2Config(vocab_size=128, n_embd=32, n_layer=4, n_head=4, n_positions=32,
                                         bos_token_id=0, eos_token_id=0)
        model = transformers.GPT2LMHeadModel(config)
    with torch.no_grad():       # away from the zero biases / unit norms of a fresh init
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model.float().eval()     # eval: no dropout; gradients still flow


def _transformers_run(model, spec, plan) -> dict:
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    losses = []
    for step in range(STEPS):
        batch = make_batch(spec, plan, step)
        opt.zero_grad(set_to_none=True)
        logits = model(batch["input_ids"]).logits
        loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        losses.append(float(loss.detach()))
    return {"losses": losses, "state": {n: t.detach().clone() for n, t in model.state_dict().items()}}


def _assemble(per_rank: list[dict], pipeline_index: int) -> dict[str, torch.Tensor]:
    """One pipeline's whole-model parameters from its ranks' chunks."""
    out = {}
    for got in per_rank:
        if got["pipeline"] != pipeline_index:
            continue
        for name, (tensor, shape, chunk) in got["params"].items():
            out.setdefault(name, torch.full(shape, float("nan")))[chunk.slices()] = tensor
    assert not any(t.isnan().any() for t in out.values())
    return out


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """kind -> (spec, per-rank results, transformers' run, initial HF state); one spawned world runs all."""
    cases, refs = [], {}
    for kind, (pipes, schedule) in CASES.items():
        assert sum(len(s.devices) for p in pipes for s in p.stages) == WORLD
        path = tmp_path_factory.mktemp(kind)
        model = _hf_model(kind.split("-")[0])
        model.save_pretrained(path)
        spec = spec_from_hf_dir(str(path))
        initial = {n: t.detach().clone() for n, t in model.state_dict().items()}
        refs[kind] = (spec, _transformers_run(model, spec, make_plan(spec, *pipes)), initial)
        cases.append((kind, str(path), pipes, schedule))
    per_rank = run_world(train_cases, WORLD, cases)
    return {kind: (spec, [got[kind] for got in per_rank], ref, initial) for kind, (spec, ref, initial) in refs.items()}


@pytest.mark.parametrize("kind", KINDS)
def test_losses_follow_transformers(runs, kind):
    spec, per_rank, ref, _ = runs[kind]
    for rank, got in enumerate(per_rank):
        assert abs(got["losses"][0] - ref["losses"][0]) <= FIRST_LOSS_TOL, (rank, got["losses"][0], ref["losses"][0])
        for step in range(1, STEPS):
            assert abs(got["losses"][step] - ref["losses"][step]) <= LOSS_TOL * ref["losses"][step], (rank, step)


@pytest.mark.parametrize("kind", KINDS)
def test_parameters_after_steps_equal_transformers(runs, kind):
    spec, per_rank, ref, initial = runs[kind]
    for k in sorted({got["pipeline"] for got in per_rank}):
        ours = local_to_hf(_assemble(per_rank, k), spec)      # asserts a tied head equals the embedding
        expected = {n: t for n, t in ref["state"].items() if n in ours}
        assert set(expected) == set(ours)
        moved = min(_rel(ours[n], initial[n]) for n in ours if not n.endswith("inv_freq"))
        assert moved > 10 * PARAM_TOL, (k, moved)         # the steps changed every tensor, by more than the tolerance
        for name in [n for n in ours if n.endswith("c_attn.bias")]:
            keys = slice(spec.hidden, 2 * spec.hidden)
            # the key bias has no gradient (it shifts all of a query's logits alike), only rounding noise that
            # AdamW scales up to +-lr per step: compared to that bound, the rest (q, v) to PARAM_TOL
            assert (ours[name][keys] - expected[name][keys]).abs().max() <= 2 * LR * STEPS
            ours[name], expected[name] = (torch.cat([t[: spec.hidden], t[2 * spec.hidden:]])
                                          for t in (ours[name], expected[name]))
        errors = {n: _rel(ours[n], expected[n]) for n in ours}
        worst = max(errors, key=errors.get)
        assert errors[worst] <= PARAM_TOL, (k, worst, errors[worst])


@pytest.mark.parametrize("kind", TIED_KINDS)
def test_tied_embedding_and_head_stay_equal(runs, kind):
    """Every first stage's embedding chunk equals the same rows of every last stage's head, bit for bit."""
    spec, per_rank, _, _ = runs[kind]
    assert spec.tie_embeddings
    embedding = [(t, c) for got in per_rank for n, (t, _, c) in got["params"].items() if n == "embedding.tok.weight"]
    head = [(t, c) for got in per_rank for n, (t, _, c) in got["params"].items() if n == "head.out.weight"]
    assert embedding and head
    whole = torch.full((spec.vocab_size, spec.hidden), float("nan"))
    for t, c in embedding:
        whole[c.slices()] = t
    for t, c in embedding + head:
        assert torch.equal(t, whole[c.slices()]), c


def test_each_rank_read_only_its_share(runs):
    spec, per_rank, _, _ = runs["llama"]
    for rank, got in enumerate(per_rank):
        held = sum(t.numel() * 4 for t, _, _ in got["params"].values())
        assert got["bytes_read"] == held, rank


def test_seeded_tied_model_on_one_rank_keeps_head_and_embedding_equal():
    """No checkpoint: the seeded init gives the tied head the embedding's values, and a rank holding both sums
    their gradients locally (no other holder)."""
    spec = dataclasses.replace(PRESETS["tiny-gpt"], tie_embeddings=True)
    (got,) = run_world(seeded_tied_run, 1, spec, (pipeline(2, (0, 4, 1)),))
    for key in ("initial", "params"):
        emb, head = got[key]["embedding.tok.weight"][0], got[key]["head.out.weight"][0]
        assert torch.equal(emb, head), key
    assert not torch.equal(got["initial"]["embedding.tok.weight"][0], got["params"]["embedding.tok.weight"][0])
