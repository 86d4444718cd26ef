"""The spawned ranks of test_hf_numerics.py (kept apart so that they never import transformers): each loads its
slices of a Hugging Face directory into its Engine and trains a few steps."""
from __future__ import annotations

import torch

from _harness import make_batch, make_plan
from autohet_ray.checkpoint.hf_weights import load_rank_state
from autohet_ray.model.hf_config import spec_from_hf_dir
from autohet_ray.runtime import Engine

LR, CLIP, STEPS = 1e-3, 1.0, 3


def train_rank(rank: int, world_size: int, path: str, pipelines, schedule: str) -> dict:
    spec = spec_from_hf_dir(path)
    plan = make_plan(spec, *pipelines)
    engine = Engine(plan=plan, model_spec=spec, rank=rank, seed=3, lr=LR, weight_decay=0.0, max_grad_norm=CLIP,
                    dtype=torch.float32, schedule=schedule)
    state, nbytes = load_rank_state(path, spec, engine.layout)
    engine.load_state_dict(state)
    losses = [engine.train_step(make_batch(spec, plan, step))["loss"] for step in range(STEPS)]
    params = {n: v for n, v in engine.state_dict().items() if not n.startswith("optim.")}
    return {"losses": losses, "params": params, "pipeline": engine.info.pipeline, "bytes_read": nbytes}


def train_cases(rank: int, world_size: int, cases) -> dict:
    """cases: (name, HF directory, pipelines, schedule) each -> {name: this rank's result}."""
    return {name: train_rank(rank, world_size, path, pipes, schedule) for name, path, pipes, schedule in cases}


def seeded_tied_run(rank: int, world_size: int, spec, pipelines) -> dict:
    """A tied model from the seeded init (no checkpoint): its params after two steps."""
    plan = make_plan(spec, *pipelines)
    engine = Engine(plan=plan, model_spec=spec, rank=rank, seed=3, lr=1e-2, max_grad_norm=CLIP, dtype=torch.float32)
    initial = {n: v for n, v in engine.state_dict().items() if not n.startswith("optim.")}
    for step in range(2):
        engine.train_step(make_batch(spec, plan, step))
    return {"initial": initial, "params": {n: v for n, v in engine.state_dict().items() if not n.startswith("optim.")}}
