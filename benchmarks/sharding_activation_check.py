"""Checks the cost model's activation memory (model/costs.activation_bytes_per_token) against what the runtime's
own modules keep: autograd's saved tensors of one Block (and of the Head with an fp32 cross-entropy), counted by
storage in bf16 on CPU, as the difference between batch 4 and batch 2 at 256 tokens (weights and rope tables do not
grow with the batch). Widths cut 16x so it runs in seconds; the per-token counts scale with the width.
CPU runs torch's CPU flash-attention kernel (it saves q, k, v, the output and the log-sum-exp, as the CUDA flash
kernel does); other CUDA-only paths are not checked. Prints one line per model, then one JSON line.

    python -m benchmarks run sharding-activation-check
"""
from __future__ import annotations

import argparse
import json
from dataclasses import replace

import torch

from autohet_ray.model import PRESETS
from autohet_ray.model.costs import activation_bytes_per_token
from autohet_ray.nn.layers import Block
from autohet_ray.nn.model import Head
from autohet_ray.nn.saved_bytes import saved_bytes

MODELS = ("llama-7b", "gpt3-2.7b", "llama2-70b")
SEQ = 256
WIDTH_CUT = 16


def narrow_spec(name: str):
    """The preset cut WIDTH_CUT times in width, one layer, keeping whether it uses grouped-query attention."""
    base = PRESETS[name]
    grouped = base.num_kv_heads != base.num_heads
    return replace(base, hidden=base.hidden // WIDTH_CUT, ffn_hidden=base.ffn_hidden // WIDTH_CUT,
                   num_heads=8 if grouped else 2, num_kv_heads=1 if grouped else 2,
                   vocab_size=base.vocab_size // WIDTH_CUT, num_layers=1)


def per_token(fn, hidden: int) -> float:
    """Saved bytes per token: batch 4 minus batch 2 (weights and rope tables do not grow with the batch)."""
    sizes = [saved_bytes(fn, torch.randn(batch, SEQ, hidden, dtype=torch.bfloat16, requires_grad=True))
             for batch in (2, 4)]
    return (sizes[1] - sizes[0]) / (2 * SEQ)


def check(name: str) -> dict:
    """Measured and modeled saved bytes per token of one block and of the head with its fp32 loss."""
    spec = narrow_spec(name)
    torch.manual_seed(0)
    block, head = Block(spec).to(torch.bfloat16), Head(spec).to(torch.bfloat16)

    def head_loss(hidden_states):
        logits = head(hidden_states)
        targets = torch.zeros(hidden_states.shape[0] * SEQ, dtype=torch.long)
        return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), targets)

    row = {"model": name, "width_cut": WIDTH_CUT, "hidden": spec.hidden, "ffn_hidden": spec.ffn_hidden,
           "heads": spec.num_heads, "kv_heads": spec.num_kv_heads}
    for kind, fn in (("layer", block), ("head", head_loss)):
        measured = per_token(fn, spec.hidden)
        modeled = activation_bytes_per_token(spec, kind, 1, 2)
        row[kind] = {"measured_bytes_per_token": measured, "modeled_bytes_per_token": modeled,
                     "ratio": round(measured / modeled, 3)}
    return row


def describe(row: dict) -> str:
    parts = []
    for kind in ("layer", "head"):
        part = row[kind]
        parts.append(f"{kind} {part['measured_bytes_per_token']:.0f} B/token measured vs "
                     f"{part['modeled_bytes_per_token']:.0f} modeled ({part['ratio']:.3f}x)")
    return (f"{row['model']} at 1/{row['width_cut']} width (h={row['hidden']}, f={row['ffn_hidden']}, "
            f"heads {row['heads']}/{row['kv_heads']}): " + "; ".join(parts))


def main(argv=None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    rows = [check(model_name) for model_name in MODELS]
    for row in rows:
        print(describe(row))
    print(json.dumps({"bench": "sharding_activation_check", "torch": torch.__version__, "seq_len": SEQ, "rows": rows}))


if __name__ == "__main__":
    main()
