"""The planner's search space: group kinds (device type, TP degree) and pipeline templates.

A template is the ordered list of group kinds of one pipeline (stage 0 first). Every template is priced
with the exact layer split (`split.best_split`); templates that use the same GPUs differently ordered or
split keep only the best ordering, which is how "slow GPUs on early stages" is found, not imposed.
"""
from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass, replace

from autohet_ray.cluster.spec import Cluster
from autohet_ray.cost.terms import (GRAD_SYNC_BYTES, GroupCostTable, activation_message_bytes, inter_link,
                                    intra_link, p2p_time)
from autohet_ray.cost.pipeline import steady_period, zero_bubble_bubble_saving
from autohet_ray.cost.memory import stage_peak_memory
from autohet_ray.plan.schedule import PLAN_SCHEDULES, SPLIT_BACKWARD
from autohet_ray.planner.candidates.split import Split, best_split, best_splits

Kind = tuple[str, int]           # (device type, TP degree)


@dataclass(frozen=True)
class TemplateEval:
    kinds: tuple[Kind, ...]      # stage order
    split: Split                 # exact split for many micro-batches (memory with p - j in flight)
    link_s: tuple[float, ...]
    sync_s: float                # exposed gradient sync if copies co-locate each stage (NVLink)
    sync_nic_s: float            # the same if its gradients cross the node NIC (mixed with other pipelines)
    exact_s: tuple[float, ...] = ()   # optional: time with m micro-batches at index m - 1, each m with
    #                                   its own best split (small clusters; else the affine estimate is used)
    zb_saving_s: float = 0.0     # how much sooner zero-bubble H1 ends than 1F1B (0 if it does not fit)

    @property
    def bottleneck_s(self) -> float:
        return steady_period(list(self.split.stage_s), list(self.link_s))

    @property
    def fixed_s(self) -> float:
        """time(m) ~= (m - 1) * bottleneck + fixed, under the faster schedule."""
        return sum(self.split.stage_s) + 2 * sum(self.link_s) - self.zb_saving_s

    def usage(self) -> dict[Kind, int]:
        out: dict[Kind, int] = {}
        for kind in self.kinds:
            out[kind] = out.get(kind, 0) + 1
        return out

    @property
    def num_gpus(self) -> int:
        return sum(k[1] for k in self.kinds)

    def estimate_s(self, num_microbatches: int, replicated: bool) -> float:
        sync = self.sync_s if replicated else self.sync_nic_s
        return (num_microbatches - 1) * self.bottleneck_s + self.fixed_s + sync

    def max_microbatches(self, deadline_s: float) -> int:
        budget = deadline_s - self.sync_nic_s
        if self.exact_s:
            return bisect.bisect_right(self.exact_s, budget + 1e-12)
        budget -= self.fixed_s
        return 0 if budget < 0 else int(budget / self.bottleneck_s + 1e-9) + 1

    def with_exact_times(self, table: GroupCostTable, max_microbatches: int,
                         zero_bubble: bool = True, schedules: tuple[str, ...] = PLAN_SCHEDULES) -> "TemplateEval":
        """The same template with its exact time for every micro-batch count up to `max_microbatches`
        (a split that is best for many micro-batches can be poor for few)."""
        groups = [table.get(*k) for k in self.kinds]
        times, parts = [], {}
        for m, split in enumerate(best_splits(groups, table.model.num_layers, max_microbatches, list(self.link_s),
                                              schedules), start=1):
            if split is None:
                times.append(float("inf"))
                continue
            if split.counts not in parts:
                parts[split.counts] = zero_bubble_parts(groups, split.counts) if zero_bubble else None
            zb = parts[split.counts]
            saving = max(0.0, zb[0] - m * zb[1]) if zb is not None and m >= len(groups) else 0.0
            times.append(split.time_s - saving)
        return replace(self, exact_s=tuple(itertools.accumulate(times, max)))


def zero_bubble_saving(groups: list, split: Split, num_microbatches: int) -> float:
    """How much sooner zero-bubble H1 ends than 1F1B: its bubble saving (`zero_bubble_bubble_saving`), less
    what the split backward costs on the bottleneck stage over every micro-batch (0 if that is more).
    0 when ZB-H1's extra activations (p micro-batches on every stage) do not fit, or with fewer micro-batches
    than stages."""
    if num_microbatches < len(groups):
        return 0.0
    return saving_of_parts(zero_bubble_parts(groups, split.counts), len(groups), num_microbatches)


def saving_of_parts(parts: tuple[float, float] | None, num_stages: int, num_microbatches: int) -> float:
    """`zero_bubble_saving` from the split's `zero_bubble_parts` (computed once for many micro-batch counts)."""
    if num_microbatches < num_stages or parts is None:
        return 0.0
    return max(0.0, parts[0] - num_microbatches * parts[1])


def zero_bubble_parts(groups: list, counts: tuple[int, ...]) -> tuple[float, float] | None:
    """(bubble saving, extra seconds per micro-batch on the bottleneck) of zero-bubble H1 on a split, or None
    when its activations do not fit (neither depends on the number of micro-batches)."""
    p = len(groups)
    for j, (g, n) in enumerate(zip(groups, counts)):     # the peak is the same for every count from p on
        if stage_peak_memory(g, SPLIT_BACKWARD[0], p, j, p, n) > g.capacity_bytes:
            return None
    plain = [g.stage_split(n, j == 0, j == p - 1) for j, (g, n) in enumerate(zip(groups, counts))]
    parts = [g.stage_split(n, j == 0, j == p - 1, True) for j, (g, n) in enumerate(zip(groups, counts))]
    slower = max(sum(x) for x in parts) - max(sum(x) for x in plain)     # the split's cost on the bottleneck
    return zero_bubble_bubble_saving([w for _, _, w in parts]), slower


def group_kinds(cluster: Cluster, model) -> list[Kind]:
    kinds = []
    for device in cluster.device_types():
        largest = max(n.count for n in cluster.nodes if n.device == device)
        kinds += [(device, t) for t in (1, 2, 4, 8, 16) if t <= largest and model.valid_tp(t)]
    return kinds


class LinkCache:
    """Per-table link prices the template search asks for thousands of times."""

    def __init__(self, cluster: Cluster, table: GroupCostTable):
        self.cluster, self.table = cluster, table
        self.msg = activation_message_bytes(table.model, table.micro_batch, table.seq_len)
        self._p2p: dict[tuple, float] = {}
        self._sync_bw: dict[tuple[str, bool], float] = {}

    def p2p(self, a: Kind, b: Kind) -> float:
        """Estimated transfer between consecutive stages: same type with room on one node -> intra, else NIC."""
        key = (a, b)
        if key not in self._p2p:
            (da, ta), (db, tb) = a, b
            node_a = _widest_node(self.cluster, da)
            if da == db and ta + tb <= node_a.count:
                link = intra_link(self.table.profile, self.cluster, da)
            else:
                link = inter_link(self.table.profile, self.cluster, node_a.name, _widest_node(self.cluster, db).name)
            self._p2p[key] = p2p_time(self.msg, link)
        return self._p2p[key]

    def sync_bandwidth(self, device: str, over_nic: bool) -> float:
        """Per-GPU NVLink/PCIe bandwidth, or the whole NIC of a node of this type (bytes/s)."""
        key = (device, over_nic)
        if key not in self._sync_bw:
            if over_nic and len(self.cluster.nodes) > 1:
                node = _widest_node(self.cluster, device)
                link = inter_link(self.table.profile, self.cluster, node.name, node.name)
            else:
                link = intra_link(self.table.profile, self.cluster, device)
            self._sync_bw[key] = link.bandwidth_Bps
        return self._sync_bw[key]


def template_links(kinds: tuple[Kind, ...], cluster: Cluster, table: GroupCostTable,
                   links: LinkCache | None = None) -> list[float]:
    links = links or LinkCache(cluster, table)
    return [links.p2p(a, b) for a, b in zip(kinds, kinds[1:])]


def _widest_node(cluster: Cluster, device: str):
    return max((n for n in cluster.nodes if n.device == device), key=lambda n: (n.count, -n.nic_gbps))


def sync_estimate(kinds: tuple[Kind, ...], split: Split, link_s: list[float], table: GroupCostTable,
                  links: LinkCache, over_nic: bool) -> float:
    """Exposed gradient sync: how far the busiest stage's all-reduces run past the pipeline's end. They run
    over NVLink/PCIe when copies of this pipeline keep each stage on one node (the placer co-locates the same
    stage of identical pipelines), or through the node's NIC when mixed with pipelines of other shapes: one
    copy of each stage's gradients per node crosses the NIC (hierarchical all-reduce), and the stages of one
    type share their node's NIC. They start during the stage's last backward (gradient hooks) and overlap
    the cool-down of the stages before it."""
    worst, p = 0.0, len(kinds)
    per_type = {d: sum(1 for k in kinds if k[0] == d) for d, _ in kinds}
    window = 0.0                          # from the start of stage j's last backward to the pipeline's end
    for j, ((device, tp), n) in enumerate(zip(kinds, split.counts)):
        gc = table.get(device, tp)
        window += split.stage_s[j] * (1 - gc.layer_fwd_fraction) + (link_s[j - 1] if j else 0.0)
        shard = gc.stage_params(n, j == 0, j == p - 1) * GRAD_SYNC_BYTES
        if over_nic:
            nodes = len(links.cluster.nodes)            # a ring over at most every node
            seconds = 2 * (nodes - 1) / nodes * shard * tp * per_type[device] / links.sync_bandwidth(device, True)
        else:
            seconds = 2 * shard / links.sync_bandwidth(device, False)
        worst = max(worst, seconds - window)
    return max(0.0, worst)


def evaluate_template(kinds: tuple[Kind, ...], cluster: Cluster, table: GroupCostTable,
                      reference_microbatches: int, links: LinkCache | None = None,
                      zero_bubble: bool = True, schedules: tuple[str, ...] = PLAN_SCHEDULES) -> TemplateEval | None:
    links = links or LinkCache(cluster, table)
    groups = [table.get(d, t) for d, t in kinds]
    link_s = template_links(kinds, cluster, table, links)
    split = best_split(groups, table.model.num_layers, reference_microbatches, link_s, schedules)
    if split is None:
        return None
    return TemplateEval(kinds, split, tuple(link_s), sync_estimate(kinds, split, link_s, table, links, False),
                        sync_estimate(kinds, split, link_s, table, links, True),
                        zb_saving_s=zero_bubble_saving(groups, split, reference_microbatches) if zero_bubble else 0.0)


def multisets(kinds: list[Kind], available: dict[Kind, int], max_stages: int, max_types: int,
              mixed_tp: bool):
    """Group-kind count vectors of one pipeline, fewest device types first: at most `max_types` types, at
    most `max_stages` stages, within the groups available. One TP degree per device type unless `mixed_tp`
    (then any set of kinds)."""
    types = list(dict.fromkeys(k[0] for k in kinds))
    degrees = {t: [k for k in kinds if k[0] == t] for t in types}
    for r in range(1, max_types + 1):
        for chosen_types in itertools.combinations(types, r):
            if mixed_tp:
                pools = [[c for n in range(1, len(degrees[t]) + 1) for c in itertools.combinations(degrees[t], n)]
                         for t in chosen_types]
            else:
                pools = [[(k,) for k in degrees[t]] for t in chosen_types]
            for picks in itertools.product(*pools):
                chosen = [k for pick in picks for k in pick]
                caps = [min(available[k], max_stages) for k in chosen]
                for counts in itertools.product(*(range(1, c + 1) for c in caps)):
                    if sum(counts) <= max_stages:
                        yield dict(zip(chosen, counts))


def orderings(usage: dict[Kind, int], exhaustive: bool) -> list[tuple[Kind, ...]]:
    """Stage orders to try: every distinct permutation (exhaustive) or every order of same-kind blocks."""
    if exhaustive and _distinct_permutations(usage) <= MAX_EXHAUSTIVE_ORDERS:
        flat = [k for k, c in usage.items() for _ in range(c)]
        return sorted(set(itertools.permutations(flat)))
    blocks = list(usage.items())
    return [tuple(k for k, c in perm for _ in range(c)) for perm in itertools.permutations(blocks)]


MAX_EXHAUSTIVE_ORDERS = 120


def _distinct_permutations(usage: dict[Kind, int]) -> int:
    total = math.factorial(sum(usage.values()))
    for c in usage.values():
        total //= math.factorial(c)
    return total


def slow_first(usage: dict[Kind, int], speed: dict[str, float]) -> tuple[Kind, ...]:
    """The paper's rule (lower-performance GPUs on earlier stages): the warm-start order."""
    blocks = sorted(usage.items(), key=lambda kc: (speed[kc[0][0]], kc[0][1]))
    return tuple(k for k, c in blocks for _ in range(c))
