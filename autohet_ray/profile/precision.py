"""What the training dtype costs: bytes per parameter (resident and moved by the optimizer), bytes per activation
element and per gradient element on the wire, and which catalog peak the math runs at.

Accounting per parameter (AdamW, no distributed optimizer):
- "bfloat16": bf16 compute with fp32 master weights and fp32 AdamW moments, gradients accumulated and reduced
  across pipelines in fp32 (what Megatron-LM does for bf16: accumulate_allreduce_grads_in_fp32; a bf16
  all-reduce of many pipelines' partial sums loses low bits of small gradients):
  2 (bf16 weight) + 4 (fp32 master) + 4 + 4 (exp_avg, exp_avg_sq) + 4 (fp32 gradient) = 18 bytes resident;
  the gradient all-reduce moves 4 bytes per element; the AdamW step reads gradient, master and both moments
  (16 B) and writes master, moments and the bf16 copy (14 B) = 30 bytes of memory traffic.
- "float32": 4 (weight) + 4 (gradient) + 4 + 4 (moments) = 16 bytes resident; 4 bytes per gradient element on
  the wire; AdamW reads 16 B and writes weight and moments (12 B) = 28 bytes of traffic.
Activations and the inter-stage messages take the dtype's element size (the loss's logits are fp32 in both).
Peak FLOPs: bf16 tensor-core dense figure for "bfloat16"; for "float32" the non-tensor FP32 figure, since
PyTorch runs fp32 matmuls without TF32 unless asked (torch.backends.cuda.matmul.allow_tf32 defaults to False).
"""
from __future__ import annotations

from dataclasses import dataclass

from autohet_ray import ConfigError

DEFAULT_DTYPE = "bfloat16"


@dataclass(frozen=True, kw_only=True)
class Precision:
    dtype: str                           # "bfloat16" or "float32"
    state_bytes_per_param: int           # weights + gradient + master + AdamW moments, resident
    optimizer_bytes_per_param: int       # memory traffic of one AdamW step
    grad_sync_bytes: int                 # one gradient element in the cross-pipeline all-reduce
    activation_bytes: int                # one activation element (kept for backward, sent between stages)
    optimizer_state_bytes: int = 12      # of state_bytes_per_param: the separate master (if any) and moments
    sharded_state_bytes: int = 12        # sharded (runtime/sharded_optim.py): a master slice and its moments

    def peak_tflops(self, device) -> float:
        """The device's dense peak for this dtype's matmuls (catalog figures)."""
        return device.bf16_tflops if self.dtype == "bfloat16" else device.fp32_tflops


PRECISIONS = {
    "bfloat16": Precision(dtype="bfloat16", state_bytes_per_param=18, optimizer_bytes_per_param=30,
                          grad_sync_bytes=4, activation_bytes=2),
    # fp32 compute: the weight is its own master (8 bytes of moments), but a sharded slice keeps a master copy
    "float32": Precision(dtype="float32", state_bytes_per_param=16, optimizer_bytes_per_param=28,
                         grad_sync_bytes=4, activation_bytes=4, optimizer_state_bytes=8),
}
_ALIASES = {"bf16": "bfloat16", "torch.bfloat16": "bfloat16", "fp32": "float32", "torch.float32": "float32",
            "float": "float32"}


def normalize_dtype(name: str) -> str:
    """"bfloat16" or "float32" for any of their usual spellings (bf16, fp32, torch.float32, ...)."""
    key = _ALIASES.get(str(name), str(name))
    if key not in PRECISIONS:
        raise ConfigError(f"dtype={name!r} cannot be priced; valid: {', '.join(PRECISIONS)} (or bf16, fp32)")
    return key


def precision(dtype: str = DEFAULT_DTYPE) -> Precision:
    return PRECISIONS[normalize_dtype(dtype)]


def profile_dtype(profile) -> str:
    """The dtype a profile DB prices: its meta["dtype"]; profiles written before dtypes were recorded priced
    bf16 (analytic). A measured profile in a dtype the cost model does not price (float64) is refused."""
    return normalize_dtype(profile.meta.get("dtype", DEFAULT_DTYPE))


def profile_precision(profile) -> Precision:
    return PRECISIONS[profile_dtype(profile)]
