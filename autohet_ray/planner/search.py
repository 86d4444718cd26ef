"""The planner: enumerate pipeline templates, group devices with SCIP, allocate micro-batches exactly,
place on nodes, and keep the best plan by the full cost model (which also prices gradient sync exactly).
Small clusters then refine their best few plans in the full cost model (refine.py). Layer splits are
bounded by the memory of the schedules allowed (only zb-h1: its activations and held weight-gradient inputs)."""
from __future__ import annotations

import time
from dataclasses import dataclass

from autohet_ray import ConfigError
from autohet_ray.cluster.spec import Cluster
from autohet_ray.cost.evaluate import Evaluation, best_schedule
from autohet_ray.cost.money import THROUGHPUT, Goal
from autohet_ray.cost.terms import GroupCostTable
from autohet_ray.model.spec import ModelSpec
from autohet_ray.plan.schedule import PLAN_SCHEDULES, SPLIT_BACKWARD
from autohet_ray.plan.schema import Plan
from autohet_ray.plan.validate import check_micro_batch
from autohet_ray.planner.assign import PipelineChoice, PlacementError, build_plan
from autohet_ray.planner.best import _Best, _Deadline
from autohet_ray.planner.batch import allocate_microbatches
from autohet_ray.planner.enumerate_groupings import all_groupings
from autohet_ray.planner.grouping import Grouping, solve_grouping
from autohet_ray.planner.money import (check_goal_cluster, cheapest_groupings, estimate_key, grouping_gpus,
                                       grouping_money, on_cheapest_nodes, unmet_goal_message)
from autohet_ray.planner.no_fit import no_fit_message as _no_fit_message
from autohet_ray.planner.polish import polish
from autohet_ray.planner.rebalance import rebalance_micro_batches
from autohet_ray.planner.result import PlanResult
from autohet_ray.planner.recompute import check_recompute, drop_unneeded_recompute, plan_auto_recompute
from autohet_ray.planner.sharding import check_sharding, plan_sharded
from autohet_ray.planner.refine import REFINED_CANDIDATES, improve_best, refine
from autohet_ray.planner.space import TemplateEval, saving_of_parts, zero_bubble_parts
from autohet_ray.planner.split import SplitsByCount
from autohet_ray.planner.templates import SMALL_CLUSTER_GPUS, _gpus_needed, enumerate_templates
from autohet_ray.planner.workers import run_split
from autohet_ray.profile.db import ProfileDB

BISECTION_STEPS = 40
CANDIDATES_PER_BATCH = 6
DEADLINE_SLACKS = (0.01, 0.02, 0.04)   # small clusters: also solve this much above the smallest deadline
SMALL_CANDIDATES = 40         # small clusters: full-model evaluations are cheap, the deadline model is rough
SHORTLIST = 300
MAX_MICROBATCH_TOKENS = 8192


def micro_batch_candidates(global_batch: int, profile: ProfileDB, micro_batch: int | None) -> list[int]:
    """The given micro-batch, or every profiled one that divides the batch and keeps at most
    MAX_MICROBATCH_TOKENS tokens (past that GEMMs are saturated while bubbles and activations only grow)."""
    if micro_batch is not None:
        check_micro_batch(global_batch, micro_batch)
        return [micro_batch]
    have = sorted({key[2] for key in profile.entries if global_batch % key[2] == 0})
    if not have:
        raise ConfigError(f"no profiled micro-batch size divides global batch {global_batch}; profiled sizes: "
                          f"{sorted({key[2] for key in profile.entries})}")
    return [m for m in have if m * profile.seq_len <= MAX_MICROBATCH_TOKENS] or have[:1]


def token_cap_sizes(seq_len: int) -> list[int]:
    """Powers of two up to MAX_MICROBATCH_TOKENS tokens per micro-batch (at least 1): the sizes auto mode
    tries when the profile has them (the analytic profile is built with them)."""
    sizes, mb = [1], 2
    while mb * seq_len <= MAX_MICROBATCH_TOKENS:
        sizes.append(mb)
        mb *= 2
    return sizes


def check_request(model: ModelSpec, profile: ProfileDB, global_batch: int, seq_len: int,
                  schedules: tuple[str, ...]) -> None:
    """ConfigError naming the first bad value of a planning request."""
    if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < 1:
        raise ConfigError(f"global batch {global_batch} must be a positive integer")
    if not 1 <= seq_len <= model.max_seq_len:
        raise ConfigError(f"seq_len {seq_len} must lie in [1, {model.max_seq_len}] ({model.name}'s max_seq_len)")
    if profile.seq_len != seq_len:
        raise ConfigError(f"the {profile.kind} profile was made for seq_len {profile.seq_len}, not {seq_len}; "
                          f"profile again with --seq-len {seq_len}")
    if profile.model and profile.model != model.name:
        raise ConfigError(f"the {profile.kind} profile was made for model {profile.model!r}, not {model.name!r}")
    check_schedules(schedules)


def check_schedules(schedules: tuple[str, ...]) -> None:
    bad = [s for s in schedules if s not in PLAN_SCHEDULES]
    if not schedules or bad:
        raise ConfigError(f"schedule {', '.join(map(repr, bad)) or '(none)'}; valid: {', '.join(PLAN_SCHEDULES)}")


def plan_training(*, cluster: Cluster, model: ModelSpec, profile: ProfileDB, global_batch: int, seq_len: int,
                  micro_batch: int | None = None, time_limit_s: float = 60.0,
                  incumbents: tuple[Plan, ...] = (), schedules: tuple[str, ...] = PLAN_SCHEDULES,
                  recompute: str = "none", optimizer_sharding: str = "none", goal: Goal = THROUGHPUT,
                  shard_ways: int | None = None) -> PlanResult:
    """The best plan found within the time limit for `goal` (cost/money.py: the fastest, the cheapest per
    token, the fastest within a budget, the cheapest above a throughput floor; all but the first may leave GPUs
    out), each candidate under the fastest of `schedules` that fits. `incumbents` (e.g. the baselines' plans)
    are evaluated as candidates too, so the result is never worse than them. `recompute`
    (planner/recompute.py): "none", "full" (every stage) or "auto" (per stage, where it makes the plan fit or
    faster); `optimizer_sharding` (planner/sharding.py) likewise, "dp" and "auto" searching at several
    numbers of holders (`shard_ways`: one of them only)."""
    check_request(model, profile, global_batch, seq_len, schedules)
    check_recompute(recompute)
    check_sharding(optimizer_sharding)
    check_goal_cluster(goal, cluster)
    key = lambda r: goal.key(r.plan, cluster, r.evaluation.iteration_time_s)  # noqa: E731
    if optimizer_sharding != "none" and shard_ways is None:      # sharded searches at 2, 4, ... holders
        return plan_sharded(lambda ways, limit, seeds: plan_training(
            cluster=cluster, model=model, profile=profile, global_batch=global_batch, seq_len=seq_len,
            micro_batch=micro_batch, time_limit_s=limit, incumbents=incumbents + seeds, schedules=schedules,
            recompute=recompute, optimizer_sharding="dp" if ways > 1 else "none", goal=goal, shard_ways=ways),
            optimizer_sharding, time_limit_s, cluster, global_batch, model, profile, schedules, key)
    request = dict(cluster=cluster, model=model, profile=profile, global_batch=global_batch, seq_len=seq_len,
                   micro_batch=micro_batch, incumbents=incumbents, schedules=schedules,
                   shard=shard_ways if optimizer_sharding == "dp" else 1, goal=goal)
    if recompute != "auto":
        return _plan_training(**request, time_limit_s=time_limit_s, recompute=recompute == "full")
    small = cluster.num_gpus <= SMALL_CLUSTER_GPUS

    def plan_once(flag: bool, limit_s: float) -> PlanResult:
        return _plan_training(**request, time_limit_s=limit_s, recompute=flag, mixed_recompute=small)

    def improve(plan: Plan, ev: Evaluation) -> tuple[Plan, Evaluation]:
        """Small clusters: once recomputation is off where it is not needed, the best split can move."""
        table = GroupCostTable(model=model, cluster=cluster, profile=profile, micro_batch=plan.micro_batch,
                               seq_len=seq_len)
        return refine(plan, ev, table, cluster, schedules) if small else (plan, ev)
    return plan_auto_recompute(plan_once, time_limit_s, cluster, model, profile, schedules, improve, key)


@dataclass(frozen=True, kw_only=True)
class _Pass:
    """One planning pass's request (plain data: a size's search may run in the helper process)."""
    cluster: Cluster
    model: ModelSpec
    profile: ProfileDB
    global_batch: int
    seq_len: int
    micro_batch: int | None
    schedules: tuple[str, ...]
    recompute: bool
    mixed_recompute: bool
    shard: int                   # holders of sharded optimizer state while searching (1: unsharded)
    goal: Goal

    @property
    def small(self) -> bool:
        return self.cluster.num_gpus <= SMALL_CLUSTER_GPUS

    def table(self, micro_batch: int) -> GroupCostTable:
        return GroupCostTable(model=self.model, cluster=self.cluster, profile=self.profile, micro_batch=micro_batch,
                              seq_len=self.seq_len, recompute=self.recompute, shard_ways=self.shard)


def _plan_training(*, cluster: Cluster, model: ModelSpec, profile: ProfileDB, global_batch: int, seq_len: int,
                   micro_batch: int | None, time_limit_s: float, incumbents: tuple[Plan, ...],
                   schedules: tuple[str, ...], recompute: bool, mixed_recompute: bool = False,
                   shard: int = 1, goal: Goal = THROUGHPUT) -> PlanResult:
    """One planning pass with recomputation on every stage or none. `mixed_recompute` (small clusters under
    recompute="auto"): each size's best few plans first drop recomputation where it is not needed, so a plan
    that recomputes on one pipeline only is ranked as such. `shard`: the holders its sharded optimizer state
    is priced across while searching (1: unsharded)."""
    clock = _Deadline(time.perf_counter(), time_limit_s)
    request = _Pass(cluster=cluster, model=model, profile=profile, global_batch=global_batch, seq_len=seq_len,
                    micro_batch=micro_batch, schedules=schedules, recompute=recompute,
                    mixed_recompute=mixed_recompute, shard=shard, goal=goal)
    best = _Best(goal=goal, cluster=cluster)
    for plan in incumbents:
        plan = plan.with_recompute(recompute).with_optimizer_sharding(shard > 1)
        best.offer(*best_schedule(plan, cluster, model, profile, schedules=schedules))
    sizes = micro_batch_candidates(global_batch, profile, micro_batch)
    per_size = _search_sizes(request, sizes, clock, best)
    if best.plan is None:
        raise ConfigError(_nothing_found(request, best, clock))
    if all(best.plan is not plan for plan, _ in per_size):       # an incumbent
        best.plan, best.evaluation = polish(best.plan, best.evaluation, request.table(best.plan.micro_batch),
                                            cluster, exhaustive=request.small, schedules=schedules)
    if micro_batch is None:          # a micro-batch size the user fixed is kept for every pipeline
        _rebalance(request, best, per_size, max(sizes), clock)
    plan = best.plan.with_predicted(best.evaluation.predicted())
    return PlanResult(plan=plan, evaluation=best.evaluation, solve_time_s=time.perf_counter() - clock.start,
                      num_templates=best.templates, hit_time_limit=clock.hit)


def _search_sizes(request: _Pass, sizes: list[int], clock: _Deadline, best: _Best) -> list[tuple]:
    """Each micro-batch size's search (every other one in the helper process when there is one, on large
    clusters), merged into `best` in the order of `sizes`; each size's best plan, polished."""
    parallel = not request.small and not clock.over()
    found = run_split(_size_search, sizes, request, clock) if parallel else None
    per_size = []
    for n, mb in enumerate(sizes):
        if clock.over() and (best.plan is not None or per_size):      # past the limit: keep what was found
            break
        local, improved = found[n] if found else _size_search(mb, request, clock)
        best.templates += local.templates
        best.merge_unmet(local)
        if improved is not None:
            per_size.append(improved)
            best.offer(*improved)
    return per_size


def _size_search(mb: int, request: _Pass, clock: _Deadline) -> tuple[_Best, tuple | None]:
    """(what the search at micro-batch size `mb` kept, its best plan polished, or None). Every size's best is
    polished: the estimate can misjudge the stage order by more than the sizes differ."""
    table = request.table(mb)
    local = _Best(keep=REFINED_CANDIDATES if request.small else 1, goal=request.goal, cluster=request.cluster)
    _plan_for_micro_batch(table, request.cluster, request.global_batch, clock, local, request.schedules)
    if local.plan is None:
        return local, None
    if request.mixed_recompute and request.recompute:
        local.top = [drop_unneeded_recompute(plan, ev, request.cluster, request.model, request.profile,
                                             request.schedules) for plan, ev in local.top]
    return local, improve_best(local.top, table, request.cluster, request.small, request.schedules, clock.over,
                               local.key)


def _nothing_found(request: _Pass, best: _Best, clock: _Deadline) -> str:
    """The one line for a pass that found no plan: what the goal would need, or why nothing fits."""
    goal, cluster = request.goal, request.cluster
    if best.fastest_unmet is None:
        hint = "" if request.recompute else \
            "; activation recomputation may make it fit (recompute='auto', --recompute auto)"
        return _no_fit_message(cluster, request.model, request.profile, request.seq_len) + hint
    cheapest = best.cheapest_unmet
    if goal.max_usd_per_hour is not None:      # the plan cheapest per token: what a budget would need
        cheap = _plan_training(cluster=cluster, model=request.model, profile=request.profile,
                               global_batch=request.global_batch, seq_len=request.seq_len,
                               micro_batch=request.micro_batch, time_limit_s=max(1.0, clock.left()),
                               incumbents=(), schedules=request.schedules, recompute=request.recompute,
                               shard=request.shard, goal=Goal(objective="cost", prices=goal.prices))
        cheapest = min((cheapest, (cheap.plan, cheap.evaluation)), key=lambda e: goal.usd_per_hour(e[0], cluster))
    return unmet_goal_message(goal, cluster, best.fastest_unmet, cheapest)


def _rebalance(request: _Pass, best: _Best, per_size: list[tuple], largest: int, clock: _Deadline) -> None:
    """Each size's best plan, with smaller micro-batches where they balance the batch better."""
    for plan, ev in [(best.plan, best.evaluation)] + [e for e in per_size if e[0] is not best.plan]:
        if clock.over():
            break
        best.offer(*rebalance_micro_batches(plan, ev, request.cluster, request.model, request.profile,
                                            largest=largest, schedules=request.schedules))


def _plan_for_micro_batch(table: GroupCostTable, cluster: Cluster, global_batch: int, clock: _Deadline,
                          best: _Best, schedules: tuple[str, ...]) -> None:
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
