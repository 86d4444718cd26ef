"""The LR schedule against hand-computed values, the optimizer config's checks, weight-decay groups by name,
and the config's way through TrainJob and the `autohet train` flags."""
import json
import math
import os

import pytest
import torch

from autohet_ray import ConfigError
from autohet_ray.job.config import compute_dtype, job_from_dict
from autohet_ray.runtime.lr_schedule import OptimizerConfig
from autohet_ray.runtime.optim import build_adamw, decays

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

JOB = {"model": {}, "cluster": {}, "global_batch": 4}


def test_warmup_then_cosine_by_hand():
    c = OptimizerConfig(lr=1.0, min_lr=0.1, warmup_steps=4, decay="cosine", decay_steps=12)
    assert [c.lr_at(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert c.lr_at(4) == 1.0                                          # decay starts at progress 0
    assert c.lr_at(6) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.sqrt(0.5)))     # progress 1/4: 0.868198
    assert c.lr_at(6) == pytest.approx(0.8681980515)
    assert c.lr_at(8) == pytest.approx(0.55)                          # half way: the mean of lr and min_lr
    assert c.lr_at(12) == pytest.approx(0.1) and c.lr_at(40) == pytest.approx(0.1)


def test_linear_and_constant_by_hand():
    lin = OptimizerConfig(lr=2e-3, decay="linear", decay_steps=10)
    assert [lin.lr_at(s) for s in (0, 2, 5, 10, 11)] == pytest.approx([2e-3, 1.6e-3, 1e-3, 0.0, 0.0])
    const = OptimizerConfig(lr=0.3, warmup_steps=2)
    assert [const.lr_at(s) for s in (0, 1, 2, 1000)] == [0.15, 0.3, 0.3, 0.3]
    assert OptimizerConfig().lr_at(0) == 1e-3 == OptimizerConfig().lr_at(10**6)   # the old constant rate


@pytest.mark.parametrize("fields, named", [
    ({"lr": -1e-3}, "lr=-0.001"), ({"lr": 0.0}, "lr=0.0"), ({"lr": 1e-3, "min_lr": 1e-2}, "min_lr=0.01"),
    ({"decay": "exp", "decay_steps": 5}, "decay='exp'"), ({"decay": "cosine"}, "needs decay_steps"),
    ({"warmup_steps": -2}, "warmup_steps=-2"),
    ({"decay": "linear", "decay_steps": 3, "warmup_steps": 5}, "decay_steps=3"),
    ({"weight_decay": -0.1}, "weight_decay=-0.1"), ({"clip_grad": -1.0}, "clip_grad=-1.0"),
    ({"betas": (0.9, 1.0)}, "betas="), ({"betas": (0.9,)}, "betas=")])
def test_bad_values_are_named(fields, named):
    with pytest.raises(ConfigError, match=named.replace("(", r"\(")):
        OptimizerConfig(**fields)


def test_weight_decay_groups_by_name():
    names = ["embedding.tok.weight", "embedding.pos.weight", "layers.0.attn_norm.weight", "layers.0.attn.qkv.weight",
             "layers.0.attn.qkv.bias", "layers.0.mlp.down.weight", "head.norm.weight", "head.out.weight"]
    assert [n for n in names if decays(n, tied_embeddings=False)] == [
        "layers.0.attn.qkv.weight", "layers.0.mlp.down.weight", "head.out.weight"]
    assert not decays("head.out.weight", tied_embeddings=True)        # the tied head is the embedding
    params = {n: torch.nn.Parameter(torch.ones(3)) for n in names}
    opt = build_adamw(params, OptimizerConfig(lr=0.1, weight_decay=0.5), tied_embeddings=False)
    for p in params.values():
        p.grad = torch.zeros(3)
    opt.step()                          # zero gradients: only decoupled weight decay moves a parameter
    for n, p in params.items():
        expected = 1 - 0.1 * 0.5 if decays(n, tied_embeddings=False) else 1.0
        assert torch.equal(p.detach(), torch.full((3,), expected)), n


def test_train_job_carries_the_config_and_reads_old_records():
    job = job_from_dict(JOB | {"optimizer": {"lr": 3e-4, "decay": "cosine", "decay_steps": 100, "betas": [0.9, 0.95]},
                               "dtype": "bf16"})
    assert job.optimizer.betas == (0.9, 0.95) and job.dtype == "bfloat16"
    assert job_from_dict(json.loads(json.dumps(job.to_dict()))) == job          # job.json round trip
    old = job_from_dict(JOB | {"lr": 0.02, "dtype": "float32"})                 # a record from before
    assert old.optimizer == OptimizerConfig(lr=0.02)
    with pytest.raises(ConfigError, match="min_lr=0.5"):
        job_from_dict(JOB | {"optimizer": {"lr": 0.1, "min_lr": 0.5}})
    with pytest.raises(ConfigError, match="optimizer config has unknown fields \\['momentum'\\]"):
        job_from_dict(JOB | {"optimizer": {"momentum": 0.9}})
    assert job_from_dict(JOB).dtype == "auto"
    assert compute_dtype("auto", cuda=True) == "bfloat16" and compute_dtype("auto", cuda=False) == "float32"
    assert compute_dtype("fp32", cuda=True) == "float32"


def test_train_flags_fill_the_config():
    from autohet_ray.cli.main import _parser
    from autohet_ray.cli.train import train_job
    base = ["train", "--cluster", os.path.join(REPO_ROOT, "jobs", "local-3.yaml"), "--model", "tiny-gpt", "--global-batch", "4", "--steps", "30",
            "--print-config"]
    args = _parser().parse_args(base + ["--lr", "3e-4", "--min-lr", "3e-5", "--warmup-steps", "5", "--decay", "cosine",
                                        "--weight-decay", "0.1", "--clip-grad", "0.5", "--betas", "0.9", "0.95"])
    assert train_job(args)[0].optimizer == OptimizerConfig(lr=3e-4, min_lr=3e-5, warmup_steps=5, decay="cosine",
                                                           decay_steps=30, weight_decay=0.1, clip_grad=0.5,
                                                           betas=(0.9, 0.95))
    assert train_job(_parser().parse_args(base))[0].optimizer == OptimizerConfig()   # no flag: the config's defaults
    with pytest.raises(SystemExit):                  # argparse refuses a choice --help does not list
        _parser().parse_args(base + ["--decay", "step"])


def test_a_resume_under_another_schedule_is_refused_by_field():
    from autohet_ray.runtime.lr_schedule import check_resumed_config
    saved = OptimizerConfig(lr=3e-4, decay="cosine", decay_steps=100)
    check_resumed_config(json.loads(json.dumps(saved.to_dict())), saved, "checkpoint x")     # same: fine
    check_resumed_config(None, saved, "checkpoint x")                                        # older: unchecked
    other = OptimizerConfig(lr=3e-4, decay="cosine", decay_steps=200, betas=(0.9, 0.95))
    with pytest.raises(ConfigError, match=r"checkpoint x .*decay_steps: checkpoint 100, this run 200; "
                                          r"betas: checkpoint \(0.9, 0.999\), this run \(0.9, 0.95\)"):
        check_resumed_config(saved.to_dict(), other, "checkpoint x")
