"""Checks the cost model's activation memory (model/costs.activation_bytes_per_token) against what the runtime's
own modules keep: autograd's saved tensors of one Block (and of the Head with an fp32 cross-entropy), counted by
storage in bf16 on CPU, as the difference between batch 4 and batch 2 at 256 tokens (weights and rope tables do not
grow with the batch). Widths cut 16x so it runs in seconds; the per-token counts scale with the width.
CPU runs torch's CPU flash-attention kernel (it saves q, k, v, the output and the log-sum-exp, as the CUDA flash
kernel does); other CUDA-only paths are not checked. Prints one line per model.

    python benchmarks/sharding_activation_check.py
"""
from __future__ import annotations

import torch
from dataclasses import replace
from autohet_ray.model import PRESETS
from autohet_ray.model.costs import activation_bytes_per_token
from autohet_ray.nn.layers import Block
from autohet_ray.nn.model import Head
def saved(fn, x):
    seen = {}
    def pack(t):
        st = t.untyped_storage(); seen[st.data_ptr()] = st.nbytes(); return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(x)
    seen.pop(x.untyped_storage().data_ptr(), None)
    return sum(seen.values())
for name in ("llama-7b", "gpt3-2.7b", "llama2-70b"):
    base = PRESETS[name]; gqa = base.num_kv_heads != base.num_heads
    spec = replace(base, hidden=base.hidden // 16, ffn_hidden=base.ffn_hidden // 16, num_heads=8 if gqa else 2,
                   num_kv_heads=1 if gqa else 2, vocab_size=base.vocab_size // 16, num_layers=1)
    torch.manual_seed(0); s = 256
    blk, head = Block(spec).to(torch.bfloat16), Head(spec).to(torch.bfloat16)
    def loss(h):
        logits = head(h); return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), torch.zeros(h.shape[0] * s, dtype=torch.long))
    per = {}
    for kind, fn in (("layer", blk), ("head", loss)):
        a = [saved(fn, torch.randn(b, s, spec.hidden, dtype=torch.bfloat16, requires_grad=True)) for b in (2, 4)]
        per[kind] = (a[1] - a[0]) / (2 * s)
    m = {k: activation_bytes_per_token(spec, k, 1, 2) for k in per}
    print(f"{name} at 1/16 width (h={spec.hidden}, f={spec.ffn_hidden}, heads {spec.num_heads}/{spec.num_kv_heads}): "
          + "; ".join(f"{k} {per[k]:.0f} B/token measured vs {m[k]:.0f} modeled ({per[k]/m[k]:.3f}x)" for k in per))
