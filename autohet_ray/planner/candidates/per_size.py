"""The search at one micro-batch size, the core of the planner's search pass (search.py): enumerate pipeline
templates, take the best copies of one shape and the groupings SCIP finds at the smallest deadlines that finish
the batch (every grouping on small clusters; the cheapest ones under a money goal), then allocate micro-batches
and split layers exactly, place on nodes, and offer each plan to the search's best by the full cost model."""
from __future__ import annotations

from autohet_ray.cluster.spec import Cluster
from autohet_ray.cost.evaluate import best_schedule
from autohet_ray.cost.money import THROUGHPUT, Goal
from autohet_ray.cost.terms import GroupCostTable
from autohet_ray.plan.schedule import PLAN_SCHEDULES, SPLIT_BACKWARD
from autohet_ray.plan.schema import Plan
from autohet_ray.planner.candidates.assign import PipelineChoice, PlacementError, build_plan
from autohet_ray.planner.candidates.best import _Best, _Deadline
from autohet_ray.planner.candidates.batch import allocate_microbatches
from autohet_ray.planner.candidates.enumerate_groupings import all_groupings
from autohet_ray.planner.candidates.grouping import Grouping, solve_grouping
from autohet_ray.planner.candidates.money import (cheapest_groupings, estimate_key, grouping_gpus, grouping_money,
                                                  on_cheapest_nodes)
from autohet_ray.planner.candidates.space import TemplateEval, saving_of_parts, zero_bubble_parts
from autohet_ray.planner.candidates.split import SplitsByCount
from autohet_ray.planner.candidates.templates import SMALL_CLUSTER_GPUS, _gpus_needed, enumerate_templates

BISECTION_STEPS = 40
CANDIDATES_PER_BATCH = 6
DEADLINE_SLACKS = (0.01, 0.02, 0.04)   # small clusters: also solve this much above the smallest deadline
SMALL_CANDIDATES = 40         # small clusters: full-model evaluations are cheap, the deadline model is rough
SHORTLIST = 300


def plan_for_micro_batch(table: GroupCostTable, cluster: Cluster, global_batch: int, clock: _Deadline,
                         best: _Best, schedules: tuple[str, ...]) -> None:
    """Offers `best` every plan the search builds at the micro-batch size of `table`."""
    total = global_batch // table.micro_batch
    zero_bubble = any(s in SPLIT_BACKWARD for s in schedules)
    templates = enumerate_templates(table, cluster, total, clock, zero_bubble, schedules)
    best.templates += len(templates)
    if not templates:
        return
    goal, money = best.goal, grouping_money(best.goal, cluster)
    replicated = _replicated(templates, cluster, total, goal, money, global_batch)
    shortlist = _shortlist(templates)
    warm = _warm_start(replicated[0], templates, shortlist) if replicated else None
    small = cluster.num_gpus <= SMALL_CLUSTER_GPUS
    solved = _groupings(shortlist, cluster, total, clock, warm,
                        candidates=SMALL_CANDIDATES if small else CANDIDATES_PER_BATCH,
                        slacks=DEADLINE_SLACKS if small else (), money=money)
    if small:
        solved = solved + all_groupings(shortlist, cluster, total, SMALL_CANDIDATES)
    if goal.minimizes_cost:
        floor_s = global_batch / goal.min_samples_per_s if goal.min_samples_per_s else None
        fastest = min((g.deadline_s for g in solved), default=min(t.fixed_s for t in shortlist))
        solved = cheapest_groupings(shortlist, cluster, total, money, fastest, clock.left, floor_s,
                                    keep=SMALL_CANDIDATES if small else 2 * CANDIDATES_PER_BATCH) + solved
    # replicated groupings index `templates`, the program's index the shortlist
    memo: dict = {}
    for grouping, pool in [(g, templates) for g in replicated] + [(g, shortlist) for g in solved]:
        plan = _realize(grouping, pool, table, cluster, global_batch, zero_bubble, memo, schedules)
        plan = plan if plan is None or money is None else on_cheapest_nodes(plan, cluster, goal)
        if plan is not None and not best.beats(plan, cluster, table, schedules):
            best.offer(*best_schedule(plan, cluster, table.model, table.profile, table, schedules))


def _replicated(templates: list[TemplateEval], cluster: Cluster, total: int, goal: Goal = THROUGHPUT,
                money=None, global_batch: int = 1) -> list[Grouping]:
    """Data-parallel copies of one pipeline shape: the same stage of every copy shares a node, so gradient
    sync stays on NVLink. The best few for the goal by estimate; the full cost model decides."""
    options = []
    for i, t in enumerate(templates):
        most = min(total, _max_copies(t, cluster))
        for copies in range(1, most + 1):
            est = t.estimate_s(-(-total // copies), replicated=True)
            key = estimate_key(goal, money, grouping_gpus({i: copies}, templates), est, global_batch)
            if key < float("inf"):
                options.append((key, est, i, copies))
    options.sort()
    return [Grouping({i: c}, total, est) for _, est, i, c in options[:CANDIDATES_PER_BATCH]]


def _max_copies(t: TemplateEval, cluster: Cluster) -> int:
    return min(cluster.gpus_of(d) // n for d, n in _gpus_needed(t.usage()).items())


def _shortlist(templates: list[TemplateEval]) -> list[TemplateEval]:
    """Templates for the grouping program: the best throughput per GPU, plus every single-type one."""
    ranked = sorted(templates, key=lambda t: t.bottleneck_s * t.num_gpus)
    single = [t for t in ranked[SHORTLIST:] if len({k[0] for k in t.kinds}) == 1]
    return ranked[:SHORTLIST] + single


def _warm_start(grouping: Grouping, templates: list[TemplateEval], shortlist: list[TemplateEval]) -> dict | None:
    """The best copies-of-one-shape grouping, as a starting solution for SCIP (when its shape is shortlisted)."""
    (i, copies), = grouping.counts.items()
    index = {id(t): n for n, t in enumerate(shortlist)}
    return {index[id(templates[i])]: copies} if id(templates[i]) in index else None


def _groupings(templates, cluster, total, clock, warm_start=None, candidates=CANDIDATES_PER_BATCH, slacks=(),
               money=None):
    """Groupings at the smallest deadlines that finish the batch (within the budget of `money`, if any), best
    first, each followed by the other solutions SCIP found at that deadline (the deadline model is an estimate:
    the full cost model decides)."""
    single = [t.sync_nic_s + (t.exact_s[total - 1] if len(t.exact_s) >= total else
                              t.fixed_s + (total - 1) * t.bottleneck_s) for t in templates]
    hi = max(single) if money is not None and money.budget is not None else min(single)
    lo = min(t.fixed_s for t in templates)
    feasible, solved = [], []
    for _ in range(BISECTION_STEPS):
        if clock.over() or hi - lo <= 2e-3 * hi:
            break
        mid = (lo + hi) / 2
        g = solve_grouping(templates, cluster, total, mid, min(10.0, max(0.1, clock.left() / 4)), warm_start, money)
        solved.append(g)
        if g.capacity >= total:
            hi = mid
            feasible.append(g)
        else:
            lo = mid
    if not feasible or feasible[-1].deadline_s > hi:
        g = solve_grouping(templates, cluster, total, hi, min(10.0, max(0.1, clock.left())), warm_start, money)
        solved.append(g)
        if g.capacity >= total:
            feasible.append(g)
    for slack in slacks:               # near-ties under the estimate, for the full cost model to rank
        if clock.over() or not feasible:
            break
        g = solve_grouping(templates, cluster, total, feasible[-1].deadline_s * (1 + slack),
                           min(10.0, max(0.1, clock.left() / 4)), warm_start, money)
        solved.append(g)
        feasible.insert(0, g)
    clock.hit = clock.hit or any(g.timed_out for g in solved)
    seen, out = set(), []
    for g in [g for best in reversed(feasible) for g in (best, *best.others)]:
        key = tuple(sorted(g.counts.items()))
        if key not in seen:
            seen.add(key)
            out.append(g)
    return out[:candidates]


def _realize(grouping, templates: list[TemplateEval], table: GroupCostTable, cluster: Cluster,
             global_batch: int, zero_bubble: bool, memo: dict | None = None,
             schedules: tuple[str, ...] = PLAN_SCHEDULES) -> Plan | None:
    """Exact micro-batch allocation and per-pipeline split for a grouping, placed on nodes."""
    model, total = table.model, global_batch // table.micro_batch
    pipelines = [templates[i] for i, c in sorted(grouping.counts.items()) for _ in range(c)]
    if not pipelines or len(pipelines) > total:
        return None
    memo = {} if memo is None else memo      # (stage kinds, micro-batches) -> (split, time): shared by groupings

    def priced(t: TemplateEval, m: int):
        key = (t.kinds, m)
        if key not in memo:
            if ("splits", t.kinds) not in memo:
                memo[("splits", t.kinds)] = SplitsByCount([table.get(*k) for k in t.kinds], model.num_layers,
                                                          list(t.link_s), schedules)
            splits = memo[("splits", t.kinds)]
            split = splits.best(m)
            saving = saving_of_parts(_zero_bubble_parts(splits.groups, split.counts, t.kinds, memo),
                                     len(t.kinds), m) if split and zero_bubble else 0.0
            memo[key] = (split, split.time_s - saving if split else float("inf"))
        return memo[key]

    split_for = lambda t, m: priced(t, m)[0]  # noqa: E731
    fns = [lambda m, t=t: priced(t, m)[1] for t in pipelines]
    counts = allocate_microbatches(fns, total)
    if counts is None or any(split_for(t, m) is None for t, m in zip(pipelines, counts)):
        return None
    choices = [PipelineChoice(t.kinds, split_for(t, m).counts, m) for t, m in zip(pipelines, counts)]
    try:
        return build_plan(choices, cluster, model, global_batch=global_batch, micro_batch=table.micro_batch,
                          recompute=table.recompute, seq_len=table.seq_len, shard_optimizer=table.shard_ways > 1)
    except PlacementError:
        return None


def _zero_bubble_parts(groups, counts: tuple[int, ...], kinds, memo: dict):
    """`zero_bubble_parts` of a split, once per stage kinds and layer counts."""
    key = ("zero-bubble", kinds, counts)
    if key not in memo:
        memo[key] = zero_bubble_parts(groups, counts)
    return memo[key]
