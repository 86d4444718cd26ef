"""Analytic profiles derived from the device catalog (labeled kind="analytic" everywhere they show up).

Per layer and rank: time = max(compute, memory traffic) + kernel launch overhead, where compute is the shard's
FLOPs at the device's dense peak for the training dtype (bf16 tensor cores, or non-tensor FP32: see
profile/precision.py) times an efficiency that falls for small matrices (small micro-batch tokens or a narrow TP
shard), and memory traffic is the shard's weights (read once forward, twice backward) plus its activations,
at HBM bandwidth, in the dtype's element size. The DB records the dtype it prices in meta["dtype"].
"""
from __future__ import annotations

from autohet_ray.cluster.spec import Cluster
from autohet_ray.profile.precision import DEFAULT_DTYPE, Precision, precision
from autohet_ray.model.costs import LAYER_KINDS, activation_bytes_per_token, layer_flops_per_token, layer_params
from autohet_ray.model.spec import ModelSpec
from autohet_ray.profile.db import LayerProfile, LinkProfile, ProfileDB

PEAK_EFFICIENCY = 0.65       # best achievable fraction of dense peak for large GEMMs (MFU-like)
TOKENS_HALF_EFF = 256        # tokens per rank at which the efficiency is half of its peak
WIDTH_HALF_EFF = 128         # shard width (hidden/tp) at which the efficiency is half of its peak
KERNELS_PER_LAYER = 24       # forward kernels of one transformer layer; backward launches twice as many
LAUNCH_S = 4e-6
INTRA_LATENCY_S = 10e-6
INTER_LATENCY_S = 25e-6
TP_DEGREES = (1, 2, 4, 8)
MICRO_BATCHES = (1, 2, 4, 8)


def with_micro_batches(*sizes: int | None) -> tuple[int, ...]:
    """MICRO_BATCHES plus the sizes a user fixed or a plan uses (an analytic entry costs nothing to add)."""
    return tuple(sorted(set(MICRO_BATCHES) | {m for m in sizes if m is not None and m >= 1}))


def _efficiency(tokens: int, width: float) -> float:
    return PEAK_EFFICIENCY * tokens / (tokens + TOKENS_HALF_EFF) * width / (width + WIDTH_HALF_EFF)


def analytic_layer(model: ModelSpec, device, tp: int, micro_batch: int, seq_len: int, kind: str,
                   prec: Precision | None = None) -> LayerProfile:
    prec = prec or precision(DEFAULT_DTYPE)
    elem = prec.activation_bytes            # compute dtype: weights as the kernels read them, activations
    tokens = micro_batch * seq_len
    params = layer_params(model, kind) / tp
    act_bytes = activation_bytes_per_token(model, kind, tp, elem) * tokens
    flops = layer_flops_per_token(model, kind, seq_len) * tokens / tp
    hbm = device.hbm_gbps * 1e9
    if kind == "embedding":            # a gather: memory bound
        fwd = bwd = tokens * model.hidden * elem * 2 / hbm + 2 * LAUNCH_S
    else:
        peak = prec.peak_tflops(device) * 1e12 * _efficiency(tokens, model.hidden / tp)
        kernels = KERNELS_PER_LAYER if kind == "layer" else 4
        fwd = max(flops / peak, (params * elem + act_bytes) / hbm) + kernels * LAUNCH_S
        bwd = max(2 * flops / peak, (2 * params * elem + 2 * act_bytes) / hbm) + 2 * kernels * LAUNCH_S
    return LayerProfile(fwd_s=fwd, bwd_s=bwd, param_bytes=int(params * elem), activation_bytes=int(act_bytes))


def analytic_links(cluster: Cluster) -> dict[str, LinkProfile]:
    links = {}
    for name in cluster.device_types():
        dev = cluster.device(name)
        links[f"intra:{name}"] = LinkProfile(bandwidth_Bps=dev.link_gbps * 1e9 / 2, latency_s=INTRA_LATENCY_S)
    links["inter"] = LinkProfile(bandwidth_Bps=cluster.inter_node_gbps * 1e9 / 8, latency_s=INTER_LATENCY_S)
    return links


def analytic_profile(model: ModelSpec, cluster: Cluster, seq_len: int,
                     micro_batches: tuple[int, ...] = MICRO_BATCHES, dtype: str = DEFAULT_DTYPE) -> ProfileDB:
    """Every (device type in the cluster, valid TP degree that fits on a node, micro-batch) entry, priced for
    training in `dtype` ("bfloat16" or "float32"; bf16 / fp32 accepted); ConfigError for any other dtype."""
    prec = precision(dtype)
    figure = "dense BF16 tensor" if prec.dtype == "bfloat16" else "non-tensor FP32"
    db = ProfileDB(kind="analytic", model=model.name, seq_len=seq_len, links=analytic_links(cluster),
                   meta={"source": f"device catalog (published {figure} figures)", "dtype": prec.dtype})
    for name in cluster.device_types():
        device = cluster.device(name)
        max_tp = max(n.count for n in cluster.nodes if n.device == name)
        for tp in (t for t in TP_DEGREES if t <= max_tp and model.valid_tp(t)):
            for mb in micro_batches:
                db.entries[(name, tp, mb)] = {k: analytic_layer(model, device, tp, mb, seq_len, k, prec)
                                              for k in LAYER_KINDS}
    return db
