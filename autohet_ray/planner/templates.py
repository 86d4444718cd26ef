"""Pipeline templates: for each GPU usage of one pipeline (group kinds and counts), its best stage order and
exact layer split, priced by the deadline model (planner/space.py) for the grouping program to combine."""
from __future__ import annotations

from autohet_ray.cluster.spec import Cluster
from autohet_ray.cost.terms import GroupCostTable
from autohet_ray.plan.schedule import PLAN_SCHEDULES
from autohet_ray.planner.best import _Deadline
from autohet_ray.planner.grouping import kinds_available
from autohet_ray.planner.space import (LinkCache, TemplateEval, evaluate_template, group_kinds, multisets, orderings,
                                      slow_first)

SMALL_CLUSTER_GPUS = 8        # up to here: every stage order, mixed TP per type, exact times per m (at 12-16 GPUs
#                               of 3 types that took 60-99 s; the larger-cluster search takes ~2.5 s CPU there)
ALL_ORDERS_UP_TO = 2          # small clusters: pipelines of up to this many stages keep every stage order
EXACT_TIMES_UP_TO = 256       # small clusters: exact per-template times for up to this many micro-batches


def enumerate_templates(table: GroupCostTable, cluster: Cluster, total_microbatches: int,
                        clock: _Deadline, zero_bubble: bool = True,
                        schedules: tuple[str, ...] = PLAN_SCHEDULES) -> list[TemplateEval]:
    """Best stage order per GPU usage, for pipelines of up to `max_stages` stages (raised until one fits).

    Small clusters: every order of same-kind blocks (which kind holds the embedding and which the head), and
    every distinct stage order when memory binds; mixed TP degrees of one type; up to 3 types per pipeline.
    Larger ones: the slow-first order, and every order of same-kind blocks when memory binds (only then can
    the order change the split); one TP degree per type and up to 3 types per pipeline."""
    model = table.model
    kinds = group_kinds(cluster, model)
    available = kinds_available(cluster, kinds)
    small = cluster.num_gpus <= SMALL_CLUSTER_GPUS
    speed = {d: cluster.device(d).bf16_tflops for d in cluster.device_types()}
    max_stages = min(model.num_layers, 8 if small else 6)
    share = lambda t: max(1, total_microbatches * sum(k[1] for k in t.kinds) // cluster.num_gpus)  # noqa: E731
    score = lambda t: t.estimate_s(share(t), replicated=False)  # noqa: E731
    links = LinkCache(cluster, table)
    while True:
        found: dict[tuple, TemplateEval] = {}
        for usage in multisets(kinds, available, max_stages, 3, mixed_tp=small):
            if clock.over() and found:
                break
            if not _fits_cluster(usage, cluster):
                continue
            first = slow_first(usage, speed)
            evals = [evaluate_template(o, cluster, table, total_microbatches, links, zero_bubble, schedules)
                     for o in orderings(usage, False)] if small else \
                [evaluate_template(first, cluster, table, total_microbatches, links, zero_bubble, schedules)]
            if any(e is None or e.split.memory_bound for e in evals):
                # the order can only change the split through memory: then try the other orders too
                tried = {e.kinds for e in evals if e is not None} | {first}
                evals += [evaluate_template(o, cluster, table, total_microbatches, links, zero_bubble, schedules)
                          for o in orderings(usage, exhaustive=small) if o not in tried]
            evals = [e for e in evals if e is not None]
            if evals and small and len(first) <= ALL_ORDERS_UP_TO:
                # each order: which is faster depends on the micro-batches the pipeline gets
                found.update({e.kinds: e for e in evals})
            elif evals:
                found[tuple(sorted(usage.items()))] = min(evals, key=score)
        if small and found:
            found = {k: t.with_exact_times(table, min(total_microbatches, EXACT_TIMES_UP_TO), zero_bubble, schedules)
                     for k, t in found.items()}
        if found or max_stages >= model.num_layers:
            return list(found.values())
        max_stages = min(model.num_layers, max_stages * 2)


def _gpus_needed(usage: dict) -> dict[str, int]:
    """GPUs of each type one pipeline of this usage takes (TP degrees of one type add up)."""
    need: dict[str, int] = {}
    for (device, tp), count in usage.items():
        need[device] = need.get(device, 0) + count * tp
    return need


def _fits_cluster(usage: dict, cluster: Cluster) -> bool:
    return all(cluster.gpus_of(d) >= n for d, n in _gpus_needed(usage).items())
