"""The planner: enumerate pipeline templates, group devices with SCIP, allocate micro-batches exactly,
place on nodes, and keep the best plan by the full cost model (which also prices gradient sync exactly).
Small clusters then refine their best few plans in the full cost model (refine.py). Layer splits are
bounded by the memory of the schedules allowed (only zb-h1: its activations and held weight-gradient inputs)."""
from __future__ import annotations

import time

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
from autohet_ray.planner.grouping import Grouping, kinds_available, solve_grouping
from autohet_ray.planner.money import (check_goal_cluster, cheapest_groupings, estimate_key, grouping_gpus,
                                       grouping_money, on_cheapest_nodes, unmet_goal_message)
from autohet_ray.planner.no_fit import no_fit_message as _no_fit_message
from autohet_ray.planner.polish import polish
from autohet_ray.planner.rebalance import rebalance_micro_batches
from autohet_ray.planner.result import PlanResult
from autohet_ray.planner.recompute import check_recompute, drop_unneeded_recompute, plan_auto_recompute
from autohet_ray.planner.sharding import check_sharding, plan_sharded
from autohet_ray.planner.refine import REFINED_CANDIDATES, improve_best, refine
from autohet_ray.planner.space import (LinkCache, TemplateEval, evaluate_template, group_kinds, multisets, orderings,
                                      slow_first, zero_bubble_saving)
from autohet_ray.planner.split import best_split
from autohet_ray.profile.db import ProfileDB

SMALL_CLUSTER_GPUS = 8        # up to here: every stage order, mixed TP per type, exact times per m (at 12-16 GPUs
#                               of 3 types that took 60-99 s; the larger-cluster search takes ~2.5 s CPU there)
BISECTION_STEPS = 40
CANDIDATES_PER_BATCH = 6
DEADLINE_SLACKS = (0.01, 0.02, 0.04)   # small clusters: also solve this much above the smallest deadline
SMALL_CANDIDATES = 40         # small clusters: full-model evaluations are cheap, the deadline model is rough
SHORTLIST = 300
MAX_MICROBATCH_TOKENS = 8192
ALL_ORDERS_UP_TO = 2          # small clusters: pipelines of up to this many stages keep every stage order
EXACT_TIMES_UP_TO = 256       # small clusters: exact per-template times for up to this many micro-batches


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


def _plan_training(*, cluster: Cluster, model: ModelSpec, profile: ProfileDB, global_batch: int, seq_len: int,
                   micro_batch: int | None, time_limit_s: float, incumbents: tuple[Plan, ...],
                   schedules: tuple[str, ...], recompute: bool, mixed_recompute: bool = False,
                   shard: int = 1, goal: Goal = THROUGHPUT) -> PlanResult:
    """One planning pass with recomputation on every stage or none. `mixed_recompute` (small clusters under
    recompute="auto"): each size's best few plans first drop recomputation where it is not needed, so a plan
    that recomputes on one pipeline only is ranked as such. `shard`: the holders its sharded optimizer state
    is priced across while searching (1: unsharded)."""
    clock = _Deadline(time.perf_counter(), time_limit_s)
    incumbents = tuple(plan.with_recompute(recompute).with_optimizer_sharding(shard > 1) for plan in incumbents)
    best, per_size = _Best(goal=goal, cluster=cluster), []
    for plan in incumbents:
        best.offer(*best_schedule(plan, cluster, model, profile, schedules=schedules))
    sizes = micro_batch_candidates(global_batch, profile, micro_batch)
    small = cluster.num_gpus <= SMALL_CLUSTER_GPUS
    for mb in sizes:
        if clock.over() and (best.plan is not None or per_size):      # past the limit: keep what was found
            break
        table = GroupCostTable(model=model, cluster=cluster, profile=profile, micro_batch=mb, seq_len=seq_len,
                               recompute=recompute, shard_ways=shard)
        local = _Best(keep=REFINED_CANDIDATES if small else 1, goal=goal, cluster=cluster)
        _plan_for_micro_batch(table, cluster, global_batch, clock, local, schedules)
        best.templates += local.templates
        best.merge_unmet(local)
        if local.plan is not None:
            # every size's best is polished: the estimate can misjudge the stage order by more than the sizes differ
            if mixed_recompute and recompute:
                local.top = [drop_unneeded_recompute(plan, ev, cluster, model, profile, schedules)
                             for plan, ev in local.top]
            per_size.append(improve_best(local.top, table, cluster, small, schedules, clock.over, local.key))
            best.offer(*per_size[-1])
    if best.plan is None and best.fastest_unmet is not None:
        cheapest = best.cheapest_unmet
        if goal.max_usd_per_hour is not None:      # the plan cheapest per token: what a budget would need
            cheap = _plan_training(cluster=cluster, model=model, profile=profile, global_batch=global_batch,
                                   seq_len=seq_len, micro_batch=micro_batch, time_limit_s=max(1.0, clock.left()),
                                   incumbents=(), schedules=schedules, recompute=recompute, shard=shard,
                                   goal=Goal(objective="cost", prices=goal.prices))
            cheapest = min((cheapest, (cheap.plan, cheap.evaluation)), key=lambda e: goal.usd_per_hour(e[0], cluster))
        raise ConfigError(unmet_goal_message(goal, cluster, best.fastest_unmet, cheapest))
    if best.plan is None:
        hint = "" if recompute else "; activation recomputation may make it fit (recompute='auto', --recompute auto)"
        raise ConfigError(_no_fit_message(cluster, model, profile, seq_len) + hint)
    if all(best.plan is not plan for plan, _ in per_size):       # an incumbent
        table = GroupCostTable(model=model, cluster=cluster, profile=profile, micro_batch=best.plan.micro_batch,
                               seq_len=seq_len, recompute=recompute, shard_ways=shard)
        best.plan, best.evaluation = polish(best.plan, best.evaluation, table, cluster,
                                            exhaustive=cluster.num_gpus <= SMALL_CLUSTER_GPUS, schedules=schedules)
    if micro_batch is None:          # a micro-batch size the user fixed is kept for every pipeline
        # each size's best plan, with smaller micro-batches where they balance the batch better
        for plan, ev in [(best.plan, best.evaluation)] + [e for e in per_size if e[0] is not best.plan]:
            if clock.over():
                break
            best.offer(*rebalance_micro_batches(plan, ev, cluster, model, profile, largest=max(sizes),
                                                schedules=schedules))
    plan = best.plan.with_predicted(best.evaluation.predicted())
    return PlanResult(plan=plan, evaluation=best.evaluation, solve_time_s=time.perf_counter() - clock.start,
                      num_templates=best.templates, hit_time_limit=clock.hit)


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
        solved = cheapest_groupings(shortlist, cluster, total, money, fastest, clock.left, floor_s)[
            :SMALL_CANDIDATES if small else 2 * CANDIDATES_PER_BATCH] + solved
    # replicated groupings index `templates`, the program's index the shortlist
    memo: dict = {}
    for grouping, pool in [(g, templates) for g in replicated] + [(g, shortlist) for g in solved]:
        plan = _realize(grouping, pool, table, cluster, global_batch, zero_bubble, memo, schedules)
        plan = plan if plan is None or money is None else on_cheapest_nodes(plan, cluster, goal)
        if plan is not None and not best.beats(plan, cluster, table, schedules):
            best.offer(*best_schedule(plan, cluster, table.model, table.profile, table, schedules))


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
            groups = [table.get(*k) for k in t.kinds]
            split = best_split(groups, model.num_layers, m, list(t.link_s), schedules)
            saving = zero_bubble_saving(groups, split, m) if split and zero_bubble else 0.0
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
