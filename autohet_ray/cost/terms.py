"""Cost terms shared by the plan evaluator and the planner: per-group compute, memory and link prices.

The training dtype's bytes per parameter, per activation and per gradient element come from the profile's
dtype (profile/precision.py); the module constants below are the bf16 figures, for callers that predate dtypes.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from autohet_ray.cluster.spec import Cluster
from autohet_ray.profile.precision import PRECISIONS, Precision, profile_precision
from autohet_ray.model.costs import layer_params, recompute_activation_bytes_per_token, weight_grad_share
from autohet_ray.model.spec import ModelSpec
from autohet_ray.plan.schema import Plan
from autohet_ray.profile.db import LayerProfile, LinkProfile, ProfileDB

_BF16 = PRECISIONS["bfloat16"]
STATE_BYTES_PER_PARAM = _BF16.state_bytes_per_param
GRAD_SYNC_BYTES = _BF16.grad_sync_bytes
OPTIMIZER_BYTES_PER_PARAM = _BF16.optimizer_bytes_per_param
ACT_ELEMENT_BYTES = _BF16.activation_bytes
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
    state_bytes_per_param: int = STATE_BYTES_PER_PARAM
    optimizer_bytes_per_param: int = OPTIMIZER_BYTES_PER_PARAM
    layer_held_bytes: int = 0     # what a split backward keeps per layer and micro-batch from its B to its W
    head_held_bytes: int = 0
    recompute: bool = False       # layers recompute their forward in the backward (layer_s includes it)
    recompute_bytes: int = 0      # with `recompute`: one layer's full activations, live while it is rebuilt
    optimizer_s_per_param: float | None = None    # measured (the profile's); None: priced as memory traffic
    shard_ways: float = 1         # holders the optimizer state is sharded across, per parameter on average (1: none)
    optimizer_state_bytes: int = 12   # of state_bytes_per_param, what sharding divides (profile/precision.py)
    sharded_state_bytes: int = 12     # a sharded slice's master and moments per parameter
    layer_tp_comm_s: float = 0.0      # of layer_s (embed_s, head_s): its TP collectives, forward and backward
    embed_tp_comm_s: float = 0.0
    head_tp_comm_s: float = 0.0

    @property
    def resident_bytes_per_param(self) -> float:
        """Weight, gradient and optimizer state per parameter: (master + moments) / holders when sharded."""
        if self.shard_ways <= 1:
            return self.state_bytes_per_param
        return self.state_bytes_per_param - self.optimizer_state_bytes + self.sharded_state_bytes / self.shard_ways

    def stage_time(self, num_layers: int, first: bool, last: bool) -> float:
        return num_layers * self.layer_s + (self.embed_s if first else 0.0) + (self.head_s if last else 0.0)

    def stage_tp_comm_s(self, num_layers: int, first: bool, last: bool) -> float:
        """Of `stage_time`: the TP collectives of one micro-batch (recomputed forwards' excluded)."""
        return num_layers * self.layer_tp_comm_s + (self.embed_tp_comm_s if first else 0.0) + \
            (self.head_tp_comm_s if last else 0.0)

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

    def stage_activation_bytes(self, num_layers: int, first: bool, last: bool) -> int:
        """What one micro-batch keeps for its backward on this stage."""
        return num_layers * self.layer_act_bytes + (self.embed_act_bytes if first else 0) + \
            (self.head_act_bytes if last else 0)

    def stage_held_bytes(self, num_layers: int, last: bool) -> int:
        """What one micro-batch keeps between its B and its W (split-backward schedules)."""
        return num_layers * self.layer_held_bytes + (self.head_held_bytes if last else 0)

    def stage_memory(self, num_layers: int, first: bool, last: bool, in_flight: int, held: int = 0) -> int:
        """Weights, gradients and optimizer state, `in_flight` micro-batches' activations and `held`
        micro-batches' deferred weight-gradient inputs."""
        return int(self.stage_params(num_layers, first, last) * self.resident_bytes_per_param
                   + in_flight * self.stage_activation_bytes(num_layers, first, last)
                   + held * self.stage_held_bytes(num_layers, last)
                   + (self.recompute_bytes if num_layers and in_flight else 0))

    def max_layers_in_memory(self, first: bool, last: bool, in_flight: int, held: int = 0) -> int:
        fixed = self.stage_memory(0, first, last, in_flight, held) + (self.recompute_bytes if in_flight else 0)
        per_layer = self.layer_params * self.resident_bytes_per_param + in_flight * self.layer_act_bytes + \
            held * self.layer_held_bytes
        return max(-1, int((self.capacity_bytes - fixed) // per_layer)) if fixed <= self.capacity_bytes else -1

    def optimizer_s(self, num_layers: int, first: bool, last: bool) -> float:
        """One update (norm, clip, AdamW) of the stage's parameters: at the measured rate, else as memory
        traffic; sharded, of its slice only."""
        params = self.stage_params(num_layers, first, last) / max(1, self.shard_ways)
        if self.optimizer_s_per_param is not None:
            return params * self.optimizer_s_per_param
        return params * self.optimizer_bytes_per_param / self.hbm_Bps


def allreduce_time(num_bytes: float, members: int, link: LinkProfile) -> float:
    """Ring all-reduce among `members` over `link`."""
    if members <= 1 or num_bytes <= 0:
        return 0.0
    steps = 2 * (members - 1)
    bandwidth = link.allreduce_bandwidth_Bps or link.bandwidth_Bps
    return steps / members * num_bytes / bandwidth + steps * link.latency_s + link.collective_overhead_s


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
    latency, reduce_bw, overhead = 25e-6, None, 0.0
    if base is not None:
        if base.allreduce_bandwidth_Bps:
            reduce_bw = min(bw, base.allreduce_bandwidth_Bps) / max(1, share)
        bw, latency, overhead = min(bw, base.bandwidth_Bps), base.latency_s, base.collective_overhead_s
    return LinkProfile(bandwidth_Bps=bw / max(1, share), latency_s=latency, collective_overhead_s=overhead,
                       allreduce_bandwidth_Bps=reduce_bw)


def activation_message_bytes(model: ModelSpec, micro_batch: int, seq_len: int,
                             element_bytes: int = ACT_ELEMENT_BYTES) -> float:
    """One micro-batch's hidden states between stages (default: bf16 elements)."""
    return micro_batch * seq_len * model.hidden * element_bytes


def allgather_time(num_bytes: float, members: int, link: LinkProfile) -> float:
    """Ring all-gather of a `num_bytes` tensor (each member holds 1/members of it)."""
    if members <= 1:
        return 0.0
    return (members - 1) / members * num_bytes / link.bandwidth_Bps + (members - 1) * link.latency_s


def broadcast_time(num_bytes: float, members: int, link: LinkProfile) -> float:
    """Pipelined (chain) broadcast of `num_bytes` from one member to the others."""
    if members <= 1:
        return 0.0
    return num_bytes / link.bandwidth_Bps + (members - 1) * link.latency_s


def boundary_seconds(num_bytes: float, tp_send: int, tp_recv: int, wire: LinkProfile, shared_wire: bool,
                     recv_link: LinkProfile) -> float:
    """One message across a stage boundary as runtime/bridge.py moves it. Equal TP degrees t: every sender
    rank sends 1/t to its peer (`shared_wire`: the t transfers share one wire, the NIC between nodes; else
    each pair has its own NVLink/PCIe link), then the receiving stage all-gathers over `recv_link`.
    Different degrees: the sender's leader sends all of it to the receiver's leader, which broadcasts it."""
    if tp_send == tp_recv:
        t = tp_send
        on_wire = num_bytes if shared_wire else num_bytes / t
        return p2p_time(on_wire, wire) + allgather_time(num_bytes, t, recv_link)
    return p2p_time(num_bytes, wire) + broadcast_time(num_bytes, tp_recv, recv_link)


class GroupCostTable:
    """GroupCost per (device type, TP degree), cached, for one model / micro-batch / sequence length."""

    def __init__(self, *, model: ModelSpec, cluster: Cluster, profile: ProfileDB, micro_batch: int, seq_len: int,
                 recompute: bool = False, shard_ways: int = 1):
        self.model, self.cluster, self.profile = model, cluster, profile
        self.recompute = recompute     # what `get` prices when not told (the planner's recompute=full)
        self.shard_ways = shard_ways   # likewise: optimizer state sharded across this many holders
        self.micro_batch, self.seq_len = micro_batch, seq_len
        self.precision: Precision = profile_precision(profile)
        self.message_bytes = activation_message_bytes(model, micro_batch, seq_len, self.precision.activation_bytes)
        self._cache: dict[tuple[str, int, bool, int], GroupCost] = {}

    def get(self, device_type: str, tp: int, recompute: bool | None = None,
            shard_ways: int | None = None) -> GroupCost:
        key = (device_type, tp, self.recompute if recompute is None else recompute,
               self.shard_ways if shard_ways is None else shard_ways)
        if key not in self._cache:
            gc = self._build(*key[:3])
            self._cache[key] = gc if key[3] == 1 else replace(gc, shard_ways=key[3])
        return self._cache[key]

    def _build(self, device_type: str, tp: int, recompute: bool = False) -> GroupCost:
        plain = self._build_plain(device_type, tp)
        if not recompute:
            return plain
        forward_s = plain.layer_s * plain.layer_fwd_fraction       # incl. its TP all-reduces, run again
        layer_s = plain.layer_s + forward_s
        tokens, elem = self.micro_batch * self.seq_len, self.precision.activation_bytes
        return replace(plain, layer_s=layer_s, layer_fwd_fraction=forward_s / layer_s, recompute=True,
                       layer_act_bytes=int(tokens * recompute_activation_bytes_per_token(self.model, elem)),
                       recompute_bytes=plain.layer_act_bytes)

    def _build_plain(self, device_type: str, tp: int) -> GroupCost:
        prof = lambda kind: self.profile.layer(device_type, tp, self.micro_batch, kind)  # noqa: E731
        layer, embed, head = prof("layer"), prof("embedding"), prof("head")
        link = intra_link(self.profile, self.cluster, device_type)
        ar = allreduce_time(self.message_bytes, tp, link)
        device = self.cluster.device(device_type)
        tokens, elem = self.micro_batch * self.seq_len, self.precision.activation_bytes
        # the vocabulary-parallel cross-entropy's two (fp32) all-reduces per micro-batch: the logits' max, then
        # the target logit and the sum of exponentials (runtime/vocab_ce.py)
        cross_entropy = allreduce_time(tokens * 4, tp, link) + allreduce_time(2 * tokens * 4, tp, link)
        # (forward, backward) collectives per kind: a block's 2 + 2 all-reduces (row-parallel outputs, then the
        # column-parallel inputs' gradients), the embedding's one, the head's input gradient and cross-entropy
        layer_comm = tp_comm(layer, 2 * ar, 2 * ar)
        embed_comm, head_comm = tp_comm(embed, ar, 0.0), tp_comm(head, cross_entropy, ar)
        layer_fwd_s = layer.fwd_s + layer_comm[0]
        layer_s = layer_fwd_s + layer.bwd_s + layer_comm[1]
        return GroupCost(
            device_type=device_type, tp=tp,
            layer_s=layer_s, embed_s=embed.fwd_s + embed.bwd_s + sum(embed_comm),
            head_s=head.fwd_s + head.bwd_s + sum(head_comm),
            layer_fwd_fraction=layer_fwd_s / layer_s,
            # measured profiles time the backward whole: split it by the FLOP shares
            layer_wgrad_s=layer.bwd_s * weight_grad_share(self.model, "layer", self.seq_len),
            head_wgrad_s=head.bwd_s * weight_grad_share(self.model, "head", self.seq_len),
            layer_params=layer_params(self.model, "layer") / tp,
            embed_params=layer_params(self.model, "embedding") / tp,
            head_params=layer_params(self.model, "head") / tp,
            layer_act_bytes=layer.activation_bytes, embed_act_bytes=embed.activation_bytes,
            head_act_bytes=head.activation_bytes,
            capacity_bytes=device.memory_bytes - MEMORY_RESERVE_BYTES, hbm_Bps=device.hbm_gbps * 1e9,
            state_bytes_per_param=self.precision.state_bytes_per_param,
            optimizer_bytes_per_param=self.precision.optimizer_bytes_per_param,
            optimizer_state_bytes=self.precision.optimizer_state_bytes,
            sharded_state_bytes=self.precision.sharded_state_bytes,
            optimizer_s_per_param=self.profile.optimizer_s_per_param.get(device_type),
            layer_held_bytes=int(tokens * wgrad_held_elements_per_token(self.model, "layer", tp) * elem),
            head_held_bytes=int(tokens * wgrad_held_elements_per_token(self.model, "head", tp) * elem),
            layer_tp_comm_s=sum(layer_comm), embed_tp_comm_s=sum(embed_comm), head_tp_comm_s=sum(head_comm))


def tp_comm(layer: LayerProfile, priced_fwd_s: float, priced_bwd_s: float) -> tuple[float, float]:
    """The TP collectives' (forward, backward) seconds of a layer kind: measured in a TP group where the
    profile has them (runtime/in_situ_cost.py), else priced from the link."""
    if layer.tp_comm_fwd_s is None:
        return priced_fwd_s, priced_bwd_s
    return layer.tp_comm_fwd_s, layer.tp_comm_bwd_s


def wgrad_held_elements_per_token(model: ModelSpec, kind: str, tp: int) -> float:
    """Elements per token that a split backward keeps from B to W on one TP rank (runtime/wgrad.py): each
    TP linear's input and output gradient. Column-parallel linears (qkv, fc1 / gate_up, the head's output)
    take the whole hidden state and produce a 1/tp shard; row-parallel ones (proj, fc2 / down) the reverse."""
    h, f = model.hidden, model.ffn_hidden
    if kind == "head":
        return h + model.vocab_size / tp
    assert kind == "layer", kind
    mlp_out = (2 if model.family == "llama" else 1) * f
    qkv = (h + 2 * model.kv_hidden) / tp
    return (h + qkv) + (h / tp + h) + (h + mlp_out / tp) + (f / tp + h)


def plan_tables(plan: Plan, cluster: Cluster, model: ModelSpec, profile: ProfileDB,
                table: GroupCostTable | None = None) -> list[GroupCostTable]:
    """The cost table of each pipeline's micro-batch size (`table`: one already built, reused if it fits)."""
    tables = {table.micro_batch: table} if table is not None and table.seq_len == plan.seq_len else {}
    for k in range(len(plan.pipelines)):
        mb = plan.micro_batch_of(k)
        if mb not in tables:
            tables[mb] = GroupCostTable(model=model, cluster=cluster, profile=profile, micro_batch=mb,
                                        seq_len=plan.seq_len)
    return [tables[plan.micro_batch_of(k)] for k in range(len(plan.pipelines))]
