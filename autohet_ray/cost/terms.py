"""Cost terms shared by the plan evaluator and the planner: per-group compute, memory and link prices.

Training precision assumed by the memory model: bf16 weights and activations, fp32 master weights and
AdamW moments, bf16 gradients reduced across pipelines (Megatron's mixed precision without a distributed
optimizer): 2 (bf16 weight) + 4 (fp32 grad accumulator) + 4 (master) + 8 (moments) = 18 bytes per parameter.
"""
from __future__ import annotations

from dataclasses import dataclass

from autohet_ray.cluster.spec import Cluster
from autohet_ray.model.costs import layer_params, weight_grad_share
from autohet_ray.model.spec import ModelSpec
from autohet_ray.profile.db import LinkProfile, ProfileDB

STATE_BYTES_PER_PARAM = 18
GRAD_SYNC_BYTES = 2              # bf16 gradient all-reduce
OPTIMIZER_BYTES_PER_PARAM = 30   # AdamW traffic per parameter (read/write master, moments, grad, weight)
ACT_ELEMENT_BYTES = 2
MEMORY_RESERVE_BYTES = 2 * 10**9  # CUDA context, workspaces, fragmentation
# A backward split into B and deferred W (zero-bubble) re-reads each linear's input and output gradient later:
# measured 1.03x (hidden 1024) to 1.04-1.09x (hidden 512) the plain backward on CPU
# (benchmarks/wgrad_split_cost.py); not yet measured on a GPU.
SPLIT_BACKWARD_OVERHEAD = 1.03


@dataclass(frozen=True, kw_only=True)
class GroupCost:
    """What one TP group (device type, TP degree) costs per micro-batch and per layer kind."""
    device_type: str
    tp: int
    layer_s: float                # fwd + bwd of one transformer layer, incl. its TP all-reduces
    embed_s: float
    head_s: float
    layer_fwd_fraction: float     # forward share of layer_s (for timelines)
    layer_wgrad_s: float          # weight-gradient part of one layer's backward (split-backward schedules)
    head_wgrad_s: float
    layer_params: float           # parameters of one layer on one rank
    embed_params: float
    head_params: float
    layer_act_bytes: int          # activations one micro-batch keeps per layer, one rank
    embed_act_bytes: int
    head_act_bytes: int
    capacity_bytes: int           # device memory usable for training
    hbm_Bps: float

    def stage_time(self, num_layers: int, first: bool, last: bool) -> float:
        return num_layers * self.layer_s + (self.embed_s if first else 0.0) + (self.head_s if last else 0.0)

    def stage_split(self, num_layers: int, first: bool, last: bool,
                    split: bool = False) -> tuple[float, float, float]:
        """(forward, input-gradient backward, weight-gradient) seconds of one micro-batch on a stage; with
        `split` (the backward runs as B and W apart) B and W include SPLIT_BACKWARD_OVERHEAD."""
        total = self.stage_time(num_layers, first, last)
        fwd = total * self.layer_fwd_fraction
        wgrad = num_layers * self.layer_wgrad_s + (self.head_wgrad_s if last else 0.0)
        scale = SPLIT_BACKWARD_OVERHEAD if split else 1.0
        return fwd, (total - fwd - wgrad) * scale, wgrad * scale

    def stage_params(self, num_layers: int, first: bool, last: bool) -> float:
        return num_layers * self.layer_params + (self.embed_params if first else 0) + (self.head_params if last else 0)

    def stage_memory(self, num_layers: int, first: bool, last: bool, in_flight: int) -> int:
        act = num_layers * self.layer_act_bytes + (self.embed_act_bytes if first else 0) + \
            (self.head_act_bytes if last else 0)
        return int(self.stage_params(num_layers, first, last) * STATE_BYTES_PER_PARAM + in_flight * act)

    def max_layers_in_memory(self, first: bool, last: bool, in_flight: int) -> int:
        fixed = self.stage_memory(0, first, last, in_flight)
        per_layer = self.layer_params * STATE_BYTES_PER_PARAM + in_flight * self.layer_act_bytes
        return max(-1, int((self.capacity_bytes - fixed) // per_layer)) if fixed <= self.capacity_bytes else -1


def allreduce_time(num_bytes: float, members: int, link: LinkProfile) -> float:
    """Ring all-reduce among `members` over `link`."""
    if members <= 1 or num_bytes <= 0:
        return 0.0
    steps = 2 * (members - 1)
    return steps / members * num_bytes / link.bandwidth_Bps + steps * link.latency_s


def p2p_time(num_bytes: float, link: LinkProfile) -> float:
    return num_bytes / link.bandwidth_Bps + link.latency_s


def intra_link(profile: ProfileDB, cluster: Cluster, device_type: str) -> LinkProfile:
    link = profile.link(f"intra:{device_type}")
    if link is None:
        dev = cluster.device(device_type)
        link = LinkProfile(bandwidth_Bps=dev.link_gbps * 1e9 / 2, latency_s=10e-6)
    return link


def inter_link(profile: ProfileDB, cluster: Cluster, node_a: str, node_b: str, share: int = 1) -> LinkProfile:
    """Between two nodes: the slower NIC (and measured fabric), divided among `share` concurrent flows."""
    base = profile.link("inter")
    bw = min(cluster.nic_bytes_per_s(node_a), cluster.nic_bytes_per_s(node_b))
    latency = 25e-6
    if base is not None:
        bw, latency = min(bw, base.bandwidth_Bps), base.latency_s
    return LinkProfile(bandwidth_Bps=bw / max(1, share), latency_s=latency)


def activation_message_bytes(model: ModelSpec, micro_batch: int, seq_len: int) -> float:
    """One micro-batch's hidden states between stages (bf16)."""
    return micro_batch * seq_len * model.hidden * ACT_ELEMENT_BYTES


class GroupCostTable:
    """GroupCost per (device type, TP degree), cached, for one model / micro-batch / sequence length."""

    def __init__(self, *, model: ModelSpec, cluster: Cluster, profile: ProfileDB, micro_batch: int, seq_len: int):
        self.model, self.cluster, self.profile = model, cluster, profile
        self.micro_batch, self.seq_len = micro_batch, seq_len
        self._cache: dict[tuple[str, int], GroupCost] = {}

    def get(self, device_type: str, tp: int) -> GroupCost:
        key = (device_type, tp)
        if key not in self._cache:
            self._cache[key] = self._build(device_type, tp)
        return self._cache[key]

    def _build(self, device_type: str, tp: int) -> GroupCost:
        prof = lambda kind: self.profile.layer(device_type, tp, self.micro_batch, kind)  # noqa: E731
        layer, embed, head = prof("layer"), prof("embedding"), prof("head")
        msg = activation_message_bytes(self.model, self.micro_batch, self.seq_len)
        ar = allreduce_time(msg, tp, intra_link(self.profile, self.cluster, device_type))
        device = self.cluster.device(device_type)
        return GroupCost(
            device_type=device_type, tp=tp,
            layer_s=layer.fwd_s + layer.bwd_s + 4 * ar, embed_s=embed.fwd_s + embed.bwd_s + ar,
            head_s=head.fwd_s + head.bwd_s + ar,
            layer_fwd_fraction=(layer.fwd_s + 2 * ar) / (layer.fwd_s + layer.bwd_s + 4 * ar),
            # measured profiles time the backward whole: split it by the FLOP shares
            layer_wgrad_s=layer.bwd_s * weight_grad_share(self.model, "layer", self.seq_len),
            head_wgrad_s=head.bwd_s * weight_grad_share(self.model, "head", self.seq_len),
            layer_params=layer_params(self.model, "layer") / tp,
            embed_params=layer_params(self.model, "embedding") / tp,
            head_params=layer_params(self.model, "head") / tp,
            layer_act_bytes=layer.activation_bytes, embed_act_bytes=embed.activation_bytes,
            head_act_bytes=head.activation_bytes,
            capacity_bytes=device.memory_bytes - MEMORY_RESERVE_BYTES, hbm_Bps=device.hbm_gbps * 1e9)


