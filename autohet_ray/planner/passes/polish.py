"""Polish: re-order the stages of each pipeline shape with the exact (simulated) cost model.

Templates are ranked by the closed-form 1F1B estimate, which can misjudge the best stage order by a few
percent (the round trip through the pipeline, where the embedding and head sit). For the chosen plan, every
stage order of each pipeline shape is re-split and priced with the full evaluator; improvements are kept.
`polished` also returns the runners-up, for refine.py to move their layers: an order whose closed-form split
prices slightly slower can be the fastest once its split is refined.
"""
from __future__ import annotations

from dataclasses import replace

from autohet_ray.cluster.spec import Cluster
from autohet_ray.cost.evaluate import Evaluation, best_schedule
from autohet_ray.cost.terms import GroupCostTable
from autohet_ray.plan.schedule import PLAN_SCHEDULES
from autohet_ray.plan.schema import Plan
from autohet_ray.planner.candidates.assign import PipelineChoice, PlacementError, build_plan
from autohet_ray.planner.candidates.floor import iteration_floor_s
from autohet_ray.planner.candidates.space import orderings, template_links
from autohet_ray.planner.candidates.split import best_split


def polish(plan: Plan, evaluation: Evaluation, table: GroupCostTable, cluster: Cluster, exhaustive: bool,
           max_evaluations: int = 400, schedules: tuple[str, ...] = PLAN_SCHEDULES) -> tuple[Plan, Evaluation]:
    """The fastest plan found (the given one if no order beats it)."""
    return polished(plan, evaluation, table, cluster, exhaustive, max_evaluations, schedules)[0]


def polished(plan: Plan, evaluation: Evaluation, table: GroupCostTable, cluster: Cluster, exhaustive: bool,
             max_evaluations: int = 400, schedules: tuple[str, ...] = PLAN_SCHEDULES,
             keep: int = 1) -> list[tuple[Plan, Evaluation]]:
    """The `keep` fastest plans found (the given one included), fastest first: each pipeline shape is
    re-ordered in turn, from the fastest plan so far."""
    choices = [PipelineChoice(tuple((s.device_type, s.tp) for s in p.stages), tuple(s.num_layers for s in p.stages),
                              p.num_microbatches) for p in plan.pipelines]
    budget = max_evaluations
    top = [(plan, evaluation)]
    for shape in dict.fromkeys(c.kinds for c in choices):
        usage: dict = {}
        for kind in shape:
            usage[kind] = usage.get(kind, 0) + 1
        for order in orderings(usage, exhaustive):
            if order == shape or budget <= 0:
                continue
            budget -= 1
            candidate = _reordered(choices, shape, order, table, cluster, schedules)
            if candidate is None:
                continue
            try:
                cplan = build_plan(candidate, cluster, table.model, global_batch=plan.global_batch,
                                   recompute=table.recompute, shard_optimizer=table.shard_ways > 1,
                                   micro_batch=plan.micro_batch, seq_len=plan.seq_len)
            except PlacementError:
                continue
            cplan = _same_micro_batches(cplan, plan)
            bar = top[-1][1].iteration_time_s if len(top) >= keep else float("inf")
            if iteration_floor_s(cplan, cluster, table.model, table.profile, table, schedules) >= bar * (1 - 1e-9):
                continue                   # cannot beat the plans in hand
            cplan, ev = best_schedule(cplan, cluster, table.model, table.profile, table, schedules)
            if not ev.feasible or ev.iteration_time_s >= bar * (1 - 1e-9):
                continue
            top = sorted(top + [(cplan, ev)], key=lambda entry: entry[1].iteration_time_s)[:keep]
            if top[0][0] is cplan:
                plan, evaluation, choices, shape = cplan, ev, candidate, order
    return top


def _same_micro_batches(cplan: Plan, plan: Plan) -> Plan:
    """`cplan` with each pipeline's own micro-batch size as in `plan` (an incumbent may mix sizes), pipeline by
    pipeline (a reordered plan keeps its pipelines in order)."""
    if all(p.micro_batch is None for p in plan.pipelines):
        return cplan
    return replace(cplan, pipelines=tuple(replace(c, micro_batch=p.micro_batch)
                                          for c, p in zip(cplan.pipelines, plan.pipelines)))


def _reordered(choices, shape, order, table, cluster, schedules) -> list[PipelineChoice] | None:
    groups = [table.get(*k) for k in order]
    links = template_links(order, cluster, table)
    out = []
    for c in choices:
        if c.kinds != shape:
            out.append(c)
            continue
        split = best_split(groups, table.model.num_layers, c.num_microbatches, links, schedules)
        if split is None:
            return None
        out.append(PipelineChoice(order, split.counts, c.num_microbatches))
    return out
