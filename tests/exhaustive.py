"""Exhaustive search over the planner's plan space, for tiny clusters (tests and benchmarks only).

Plan space: every way to cut each node's GPUs into power-of-two TP groups (GPUs may stay idle), every
partition of those groups into pipelines, every stage order of each pipeline, every micro-batch size;
per pipeline the exact layer split and across pipelines the exact micro-batch allocation (the planner's
sub-solvers, each checked against brute force on its own in tests/unit/test_planner_parts.py); every
candidate priced by the full cost model.
"""
from __future__ import annotations

import itertools

from autohet_ray.cost.evaluate import best_schedule, stage_link_time
from autohet_ray.cost.terms import GroupCostTable
from autohet_ray.plan.schema import Pipeline, Plan, Stage
from autohet_ray.planner.batch import allocate_microbatches
from autohet_ray.planner.split import best_split


def _cuts(count: int, max_tp: int):
    """Multisets of power-of-two group sizes with total <= count."""
    sizes = [t for t in (8, 4, 2, 1) if t <= min(count, max_tp)]

    def rec(left, i):
        if i == len(sizes):
            yield ()
            return
        for k in range(left // sizes[i], -1, -1):
            for rest in rec(left - k * sizes[i], i + 1):
                yield (sizes[i],) * k + rest
    yield from rec(count, 0)


def _groupings(cluster, model):
    per_node = []
    for node in cluster.nodes:
        options = []
        for cut in _cuts(node.count, node.count):
            if not all(model.valid_tp(t) for t in cut):
                continue
            groups, start = [], 0
            for t in cut:
                groups.append((node.name, node.device, tuple(range(start, start + t))))
                start += t
            options.append(groups)
        per_node.append(options)
    for combo in itertools.product(*per_node):
        groups = [g for node_groups in combo for g in node_groups]
        if groups:
            yield groups


def _set_partitions(items):
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in _set_partitions(rest):
        for i in range(len(part)):
            yield part[:i] + [[first] + part[i]] + part[i + 1:]
        yield [[first]] + part


def _stages(order, counts):
    out, start = [], 0
    for (node, device, gpus), n in zip(order, counts):
        out.append(Stage(layers=(start, start + n), tp=len(gpus), device_type=device, node=node, devices=gpus))
        start += n
    return out


def _pipeline_options(block, table, cluster, model, profile, plan_stub):
    """Every distinct stage order of one pipeline's groups with its link times."""
    for order in set(itertools.permutations(block)):
        probe = _stages(order, [1] * len(order))
        links = [stage_link_time(plan_stub, cluster, profile, model, a, b) for a, b in zip(probe, probe[1:])]
        yield order, [table.get(d, len(g)) for _, d, g in order], links


def exhaustive_best(cluster, model, profile, global_batch, seq_len, micro_batches):
    best = None
    for mb in micro_batches:
        total = global_batch // mb
        table = GroupCostTable(model=model, cluster=cluster, profile=profile, micro_batch=mb, seq_len=seq_len)
        stub = Plan(model=model.name, global_batch=global_batch, micro_batch=mb, seq_len=seq_len, pipelines=())
        for groups in _groupings(cluster, model):
            for partition in _set_partitions(groups):
                if len(partition) > total:
                    continue
                options = [list(_pipeline_options(b, table, cluster, model, profile, stub)) for b in partition]
                for choice in itertools.product(*options):
                    bound = best[1].iteration_time_s if best else float("inf")
                    plan = _realize(choice, total, model, global_batch, mb, seq_len, bound)
                    if plan is None:
                        continue
                    plan, ev = best_schedule(plan, cluster, model, profile, table)
                    if ev.feasible and (best is None or ev.iteration_time_s < best[1].iteration_time_s):
                        best = (plan, ev)
    return best


def _realize(choice, total, model, global_batch, mb, seq_len, bound):
    memo = {}

    def split(k, m):
        if (k, m) not in memo:
            memo[(k, m)] = best_split(choice[k][1], model.num_layers, m, choice[k][2])
        return memo[(k, m)]

    fns = [lambda m, k=k: s.time_s if (s := split(k, m)) else float("inf") for k in range(len(choice))]
    counts = allocate_microbatches(fns, total)
    if counts is None or any(split(k, m) is None for k, m in enumerate(counts)):
        return None
    # a pipeline's bottleneck stage runs every one of its micro-batches: a lower bound on the iteration
    if max(m * split(k, m).bottleneck_s for k, m in enumerate(counts)) >= bound:
        return None
    pipelines = tuple(Pipeline(num_microbatches=m, stages=tuple(_stages(choice[k][0], split(k, m).counts)))
                      for k, m in enumerate(counts))
    return Plan(model=model.name, model_spec=model.to_dict(), global_batch=global_batch, micro_batch=mb,
                seq_len=seq_len, pipelines=pipelines)
