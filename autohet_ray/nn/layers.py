"""Transformer building blocks: norms, rotary embeddings, attention and MLPs.

Fused weights are laid out so that any contiguous split of their rows into TP shards gives each shard whole
heads (or whole FFN columns); that keeps TP shards plain rectangular chunks of the global tensor:
- `attn.qkv.weight` rows: for each kv head, its `group` query heads, then its key, then its value head
  (Megatron's GQA layout); with num_kv_heads == num_heads this is q, k, v interleaved per head.
- `mlp.gate_up.weight` rows: gate and up interleaved per FFN column (row 2i = gate i, row 2i+1 = up i).
The modules infer their local head / column counts from the weights, so TP shards reuse this code.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from autohet_ray.model.spec import ModelSpec


class _RMSNormFunction(torch.autograd.Function):
    """x * rsqrt(mean(x^2) + eps) * weight, keeping only x and the per-token rsqrt for backward (as fused GPU
    RMSNorm kernels do); autograd's own graph would also keep the normalized x, one more hidden-sized tensor."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        inv_rms = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, inv_rms, weight)
        return x * inv_rms * weight

    @staticmethod
    def backward(ctx, grad):
        x, inv_rms, weight = ctx.saved_tensors
        normalized = x * inv_rms
        grad_weight = (grad * normalized).sum_to_size(weight.shape) if ctx.needs_input_grad[1] else None
        grad_normalized = grad * weight
        grad_inv_rms = (grad_normalized * x).sum(-1, keepdim=True)
        grad_mean_square = -0.5 * grad_inv_rms * inv_rms.pow(3)
        grad_x = grad_normalized * inv_rms + grad_mean_square.expand_as(x) / x.shape[-1] * (2 * x)
        return grad_x, grad_weight, None


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _RMSNormFunction.apply(x, self.weight, self.eps)


def make_norm(spec: ModelSpec, dim: int) -> nn.Module:
    return RMSNorm(dim, spec.norm_eps) if spec.family == "llama" else nn.LayerNorm(dim, eps=spec.norm_eps)


def apply_rotary(x: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """Rotary position embedding (rotate-half form) on x of shape [batch, heads, seq, head_dim]."""
    seq, dim = x.shape[-2], x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, device=x.device, dtype=torch.float64) / dim)
    angles = torch.outer(torch.arange(seq, device=x.device, dtype=torch.float64), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    half = dim // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        bias = spec.family != "llama"
        self.rope_theta = spec.rope_theta
        self.group = spec.num_heads // spec.num_kv_heads       # query heads per kv head
        self.head_dim = spec.head_dim
        self.causal = spec.family != "bert"
        self.rotary = spec.family == "llama"
        self.qkv = nn.Linear(spec.hidden, spec.num_kv_heads * (self.group + 2) * self.head_dim,
                             bias=bias or spec.qkv_bias)
        self.proj = nn.Linear(spec.num_heads * self.head_dim, spec.hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        g, d = self.group, self.head_dim
        qkv = self.qkv(x).view(b, s, -1, g + 2, d)          # [b, s, kv heads (local), g + 2, d]
        q = qkv[..., :g, :].reshape(b, s, -1, d).transpose(1, 2)
        k = qkv[..., g, :].transpose(1, 2)
        v = qkv[..., g + 1, :].transpose(1, 2)
        if self.rotary:
            q, k = apply_rotary(q, self.rope_theta), apply_rotary(k, self.rope_theta)
            v = v.contiguous()      # else attention keeps v as a view of (so the whole of) the fused qkv output
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal, enable_gqa=g > 1)
        return self.proj(y.transpose(1, 2).reshape(b, s, -1))


class GeluMLP(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.fc1 = nn.Linear(spec.hidden, spec.ffn_hidden)
        self.fc2 = nn.Linear(spec.ffn_hidden, spec.hidden)
        self.approximate = "tanh" if spec.activation == "gelu_tanh" else "none"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate=self.approximate))


class _SwiGLUFunction(torch.autograd.Function):
    """silu(gate) * up from the interleaved gate_up output [..., f, 2], keeping only that output for backward
    (silu is recomputed there, as fused GPU SwiGLU kernels do); autograd's graph would also keep silu(gate)."""

    @staticmethod
    def forward(ctx, gate_up):
        ctx.save_for_backward(gate_up)
        return F.silu(gate_up[..., 0]) * gate_up[..., 1]

    @staticmethod
    def backward(ctx, grad):
        (gate_up,) = ctx.saved_tensors
        gate, up = gate_up[..., 0], gate_up[..., 1]
        grad_gate = torch.ops.aten.silu_backward(grad * up, gate)
        return torch.stack([grad_gate, grad * F.silu(gate)], dim=-1)


class SwiGLU(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.gate_up = nn.Linear(spec.hidden, 2 * spec.ffn_hidden, bias=False)
        self.down = nn.Linear(spec.ffn_hidden, spec.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(_SwiGLUFunction.apply(self.gate_up(x).unflatten(-1, (-1, 2))))


class Block(nn.Module):
    """One transformer layer: pre-norm (gpt, llama) or post-norm (bert)."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.post_norm = spec.family == "bert"
        self.attn_norm = make_norm(spec, spec.hidden)
        self.attn = Attention(spec)
        self.mlp_norm = make_norm(spec, spec.hidden)
        self.mlp = SwiGLU(spec) if spec.family == "llama" else GeluMLP(spec)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.post_norm:
            x = self.attn_norm(x + self.attn(x))
            return self.mlp_norm(x + self.mlp(x))
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))
