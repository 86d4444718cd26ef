"""runtime/adamw.AdamW against torch.optim.AdamW: the same parameters, gradients and groups give bit-equal
weights and state; and it runs without importing torch._dynamo (why it exists)."""
import subprocess
import sys

import pytest
import torch

from autohet_ray.runtime.adamw import AdamW


def _params(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=g, dtype=dtype)) for shape in ((5, 3), (3,), (7,))]


def _run(optimizer_class, dtype, steps=4, lr=3e-3):
    params = _params(dtype)
    groups = [{"params": params[:1], "weight_decay": 0.1}, {"params": params[1:], "weight_decay": 0.0}]
    opt = optimizer_class(groups, lr=lr, betas=(0.9, 0.95))
    g = torch.Generator().manual_seed(1)
    for step in range(steps):
        for i, p in enumerate(params):
            p.grad = None if (step == 1 and i == 2) else torch.randn(p.shape, generator=g, dtype=dtype)
        for group in opt.param_groups:
            group["lr"] = lr * (step + 1)
        opt.step()
    return params, opt


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_weights_and_state_equal_torchs_adamw_bit_for_bit(dtype):
    ours, ours_opt = _run(AdamW, dtype)
    theirs, their_opt = _run(torch.optim.AdamW, dtype)
    for a, b in zip(ours, theirs):
        assert torch.equal(a, b)
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(ours_opt.state[a][key], their_opt.state[b][key])
        assert float(ours_opt.state[a]["step"]) == float(their_opt.state[b]["step"])
    assert float(ours_opt.state[ours[2]]["step"]) == 3.0          # skipped the step it had no gradient


def test_a_differing_option_changes_the_result():
    ours, _ = _run(AdamW, torch.float64, lr=3e-3)
    theirs, _ = _run(torch.optim.AdamW, torch.float64, lr=2e-3)
    assert not torch.equal(ours[0], theirs[0])


@pytest.mark.cli
def test_building_and_stepping_imports_no_dynamo():
    code = ("import sys, torch\n"
            "from autohet_ray.runtime.optim import build_adamw\n"
            "from autohet_ray.runtime.lr_schedule import OptimizerConfig\n"
            "p = torch.nn.Parameter(torch.ones(3, 2))\n"
            "opt = build_adamw({'layers.0.w': p}, OptimizerConfig(), tied_embeddings=False)\n"
            "p.grad = torch.ones(3, 2)\n"
            "opt.step()\n"
            "print('torch._dynamo' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"
