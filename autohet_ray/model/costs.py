"""Per-layer parameters, FLOPs and activation memory of a ModelSpec.

Layer kinds: "embedding" (first stage), "layer" (one transformer layer), "head" (last stage: final norm,
output projection, loss). FLOPs count a multiply-add as 2; backward = 2 x forward. Activation bytes are
what one token keeps for backward in bf16: exactly what autograd saves for the runtime's own modules
(nn/layers.py: flash/SDPA attention without an s^2 score matrix, fused-style RMSNorm and SwiGLU), without
sequence parallelism: norm outputs and the residual are replicated across TP ranks, the rest is sharded.
tests/unit/test_activation_memory.py counts the saved tensors of one block against this.
"""
from __future__ import annotations

from autohet_ray.model.spec import ModelSpec

LAYER_KINDS = ("embedding", "layer", "head")
ACT_BYTES = 2          # bf16 activations


def layer_params(spec: ModelSpec, kind: str) -> int:
    h, f, v = spec.hidden, spec.ffn_hidden, spec.vocab_size
    if kind == "embedding":
        positions = 0 if spec.family == "llama" else spec.max_seq_len * h
        token_types = 2 * h + 2 * h if spec.family == "bert" else 0     # type table + embedding LayerNorm
        return v * h + positions + token_types
    if kind == "head":
        if spec.family == "bert":                                        # transform + LN + decoder (+ bias)
            return h * h + h + 2 * h + v * h + v
        return v * h + (h if spec.family == "llama" else 2 * h)
    assert kind == "layer", kind
    if spec.family == "llama":
        return 2 * h * h + 2 * h * spec.kv_hidden + 3 * h * f + 2 * h
    return 4 * h * h + 4 * h + 2 * h * f + f + h + 4 * h


def layer_flops_per_token(spec: ModelSpec, kind: str, seq_len: int) -> float:
    """Forward FLOPs per token."""
    h = spec.hidden
    if kind == "embedding":
        return 0.0
    if kind == "head":
        return 2.0 * h * spec.vocab_size + (2.0 * h * h if spec.family == "bert" else 0.0)
    matmul = layer_params(spec, "layer")
    attention = 4.0 * seq_len * h        # QK^T and AV: 2*s*h each
    return 2.0 * matmul + attention


def weight_grad_share(spec: ModelSpec, kind: str, seq_len: int) -> float:
    """Share of a layer kind's backward FLOPs that compute weight gradients (one GEMM per weight: the forward's
    matmul FLOPs); the rest computes input gradients. Split-backward schedules run the two parts apart."""
    forward = layer_flops_per_token(spec, kind, seq_len)
    if kind == "embedding" or forward == 0:
        return 0.0
    matmul = forward if kind == "head" else 2.0 * layer_params(spec, "layer")
    return matmul / (2 * forward)


def activation_bytes_per_token(spec: ModelSpec, kind: str, tp: int, element_bytes: int = ACT_BYTES) -> float:
    """Bytes one token keeps for backward on one rank of a TP group of `tp` (`element_bytes`: the training
    dtype's activation element; default bf16). Each kind counts what it saves besides its own input: that
    input is the previous kind's output, counted there (the embedding's output, each layer's residual out)."""
    h, f = spec.hidden, spec.ffn_hidden
    if kind == "embedding":
        return element_bytes * h                                   # its output, the first layer's input
    if kind == "head":
        return element_bytes * h + 4.0 * spec.vocab_size / tp      # final norm's output; fp32 logits for the loss
    assert kind == "layer", kind
    # Elements per token. Replicated on every TP rank: the attention norm's output (the qkv input), the
    # residual after attention (the MLP norm's input) and the MLP norm's output (its first linear's input);
    # bert's post-norm block: the first norm's input and output and the second norm's input.
    replicated = 3 * h
    # Sharded: q, k and v (only the kv heads: SDPA's enable_gqa, no repeat; for gpt/bert the fused qkv output
    # they are views of) and the attention output (the output projection's input).
    attention = 2 * h + 2 * spec.kv_hidden
    # Sharded: llama the gate_up output (2f, silu is recomputed) and the down projection's input (f);
    # gpt/bert the fc1 output (GELU's input) and GELU's output (fc2's input).
    mlp = 3 * f if spec.family == "llama" else 2 * f
    # Per-token norm statistics, in the activation dtype: RMSNorm's 1/rms, LayerNorm's mean and 1/std.
    norm_stats = 2 * (1 if spec.family == "llama" else 2)
    log_sum_exp = 4.0 * spec.num_heads / tp                        # bytes: flash attention's fp32 row statistics
    return element_bytes * (replicated + norm_stats + (attention + mlp) / tp) + log_sum_exp


def recompute_activation_bytes_per_token(spec: ModelSpec, element_bytes: int = ACT_BYTES) -> float:
    """Bytes one token keeps for backward per transformer layer under activation recomputation: only the
    layer's input (the hidden state, replicated on every TP rank); the rest is rebuilt in the backward."""
    return element_bytes * spec.hidden
