"""Pipeline templates: for each GPU usage of one pipeline (group kinds and counts), its best stage order and
exact layer split, priced by the deadline model (planner/candidates/space.py) for the grouping program to combine.

Past the depth where every usage is tried, larger clusters also try deep pipelines: each takes a 1/k share of
the groups of each type it uses (one TP degree per type; k copies fill those types), k the fewest that keeps
it within each depth of DEEP_DEPTHS. Few pipelines of thin stages move less TP traffic than shallow ones of
wide TP, and fit where those do not; trying every usage that deep would take minutes."""
from __future__ import annotations

import itertools

from autohet_ray.cluster.spec import Cluster
from autohet_ray.cost.terms import GroupCostTable
from autohet_ray.plan.schedule import PLAN_SCHEDULES
from autohet_ray.planner.candidates.best import _Deadline
from autohet_ray.planner.candidates.grouping import kinds_available
from autohet_ray.planner.candidates.space import (Kind, LinkCache, TemplateEval, evaluate_template, group_kinds,
                                                  multisets, orderings, slow_first)

SMALL_CLUSTER_GPUS = 8        # up to here: every stage order, mixed TP per type, exact times per m (at 12-16 GPUs
#                               of 3 types that took 60-99 s; the larger-cluster search takes ~2.5 s CPU there)
ALL_ORDERS_UP_TO = 2          # small clusters: pipelines of up to this many stages keep every stage order
EXACT_TIMES_UP_TO = 256       # small clusters: exact per-template times for up to this many micro-batches
DEEP_STAGES_UP_TO = 24        # larger clusters: deep pipelines (a share of each type's groups) up to this deep
DEEP_DEPTHS = (8, 12, 16, 24)  # ... for each, the largest share of each type's groups that is no deeper


def enumerate_templates(table: GroupCostTable, cluster: Cluster, total_microbatches: int,
                        clock: _Deadline, zero_bubble: bool = True,
                        schedules: tuple[str, ...] = PLAN_SCHEDULES, deep: bool = True) -> list[TemplateEval]:
    """Best stage order per GPU usage, for pipelines of up to `max_stages` stages (raised until one fits),
    plus (larger clusters, `deep`) the deep usages of `deep_usages`.

    Small clusters: every order of same-kind blocks (which kind holds the embedding and which the head), and
    every distinct stage order when memory binds; mixed TP degrees of one type; up to 3 types per pipeline.
    Larger ones: the slow-first order, and every order of same-kind blocks when memory binds (only then can
    the order change the split); one TP degree per type and up to 3 types per pipeline."""
    model = table.model
    kinds = group_kinds(cluster, model)
    available = kinds_available(cluster, kinds)
    small = cluster.num_gpus <= SMALL_CLUSTER_GPUS
    max_stages = min(model.num_layers, 8 if small else 6)
    price = _Pricer(table, cluster, total_microbatches, zero_bubble, schedules, small)
    while True:
        found: dict[tuple, TemplateEval] = {}
        _price_all(multisets(kinds, available, max_stages, 3, mixed_tp=small), price, found, clock)
        if found or max_stages >= model.num_layers:
            break
        max_stages = min(model.num_layers, max_stages * 2)
    if deep and not small:       # past the depth where shallow pipelines first fit
        _price_all(deep_usages(kinds, available, max_stages, min(model.num_layers, DEEP_STAGES_UP_TO)), price,
                   found, clock)
    if small and found:
        found = {k: t.with_exact_times(table, min(total_microbatches, EXACT_TIMES_UP_TO), zero_bubble, schedules)
                 for k, t in found.items()}
    return list(found.values())


def _price_all(usages, price: "_Pricer", found: dict, clock: _Deadline) -> None:
    """Each usage's best orders into `found` (past the time limit: once `found` holds one)."""
    for usage in usages:
        if clock.over() and found:
            break
        if _fits_cluster(usage, price.cluster):
            found.update(price.best_orders(usage))


def deep_usages(kinds: list[Kind], available: dict[Kind, int], shallow: int, deepest: int):
    """Usages of more than `shallow` and at most `deepest` stages that take 1/k of the groups of each type
    they use (one TP degree per type; up to 3 types): for each depth of DEEP_DEPTHS, the smallest k whose
    pipeline is no deeper, so any cluster size gets a handful per choice of types and degrees."""
    types = list(dict.fromkeys(k[0] for k in kinds))
    degrees = {t: [k for k in kinds if k[0] == t] for t in types}
    seen = set()
    for r in range(1, 4):
        for chosen in itertools.combinations(types, r):
            for picks in itertools.product(*(degrees[t] for t in chosen)):
                for depth in (d for d in DEEP_DEPTHS if shallow < d <= deepest):
                    copies = _copies_within(picks, available, depth)
                    usage = {k: available[k] // copies for k in picks}
                    key = tuple(sorted(usage.items()))
                    if all(usage.values()) and sum(usage.values()) > shallow and key not in seen:
                        seen.add(key)
                        yield usage


def _copies_within(picks, available: dict[Kind, int], depth: int) -> int:
    """The fewest copies k whose pipeline (1/k of each picked kind's groups) has at most `depth` stages."""
    copies = max(1, sum(available[k] for k in picks) // depth)
    while sum(available[k] // copies for k in picks) > depth:
        copies += 1
    return copies


class _Pricer:
    """Each usage's best stage orders, priced by the deadline model."""

    def __init__(self, table, cluster, total_microbatches, zero_bubble, schedules, small):
        self.table, self.cluster, self.total = table, cluster, total_microbatches
        self.zero_bubble, self.schedules, self.small = zero_bubble, schedules, small
        self.links = LinkCache(cluster, table)
        self.speed = {d: cluster.device(d).bf16_tflops for d in cluster.device_types()}
        share = lambda t: max(1, self.total * sum(k[1] for k in t.kinds) // cluster.num_gpus)  # noqa: E731
        self.score = lambda t: t.estimate_s(share(t), replicated=False)  # noqa: E731

    def evaluate(self, order):
        return evaluate_template(order, self.cluster, self.table, self.total, self.links, self.zero_bubble,
                                 self.schedules)

    def best_orders(self, usage: dict) -> dict[tuple, TemplateEval]:
        """Small clusters: every order of a usage; larger ones: slow-first, and every order of same-kind
        blocks when memory binds (deep pipelines too).
        Pipelines of up to ALL_ORDERS_UP_TO stages keep every order they price."""
        first = slow_first(usage, self.speed)
        evals = [self.evaluate(o) for o in orderings(usage, False)] if self.small else [self.evaluate(first)]
        if any(e is None or e.split.memory_bound for e in evals):
            # the order can only change the split through memory: then try the other orders too
            tried = {e.kinds for e in evals if e is not None} | {first}
            evals += [self.evaluate(o) for o in orderings(usage, exhaustive=self.small) if o not in tried]
        evals = [e for e in evals if e is not None]
        if evals and self.small and len(first) <= ALL_ORDERS_UP_TO:
            # each order: which is faster depends on the micro-batches the pipeline gets
            return {e.kinds: e for e in evals}
        return {tuple(sorted(usage.items())): min(evals, key=self.score)} if evals else {}


def _gpus_needed(usage: dict) -> dict[str, int]:
    """GPUs of each type one pipeline of this usage takes (TP degrees of one type add up)."""
    need: dict[str, int] = {}
    for (device, tp), count in usage.items():
        need[device] = need.get(device, 0) + count * tp
    return need


def _fits_cluster(usage: dict, cluster: Cluster) -> bool:
    return all(cluster.gpus_of(d) >= n for d, n in _gpus_needed(usage).items())
