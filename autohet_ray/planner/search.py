"""The planner: one planning pass runs PASSES below, in order. Its search builds candidate plans per micro-batch size
(candidates/: enumerate pipeline templates, group devices with SCIP, split layers and allocate micro-batches
exactly, place on nodes) and keeps the best by the full cost model (which also prices gradient sync exactly); the
passes of passes/ then improve what it kept. Around the pass, `plan_training` runs it once per number of holders of
sharded optimizer state (passes/sharding.py) and with and without activation recomputation
(passes/recompute.py). Layer splits are bounded by the memory of the schedules allowed (only zb-h1: its
activations and held weight-gradient inputs). The lower bound (bounds/) and the baselines (baselines.py) price
the same cost model apart from the search."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

from autohet_ray import ConfigError
from autohet_ray.cluster.spec import Cluster
from autohet_ray.cost.evaluate import Evaluation, best_schedule
from autohet_ray.cost.money import THROUGHPUT, Goal
from autohet_ray.cost.terms import GroupCostTable
from autohet_ray.model.spec import ModelSpec
from autohet_ray.plan.schedule import PLAN_SCHEDULES
from autohet_ray.plan.schema import Plan
from autohet_ray.plan.validate import check_micro_batch
from autohet_ray.planner.candidates.best import _Best, _Deadline
from autohet_ray.planner.candidates.money import check_goal_cluster, unmet_goal_message
from autohet_ray.planner.candidates.per_size import plan_for_micro_batch
from autohet_ray.planner.candidates.templates import SMALL_CLUSTER_GPUS
from autohet_ray.planner.no_fit import no_fit_message as _no_fit_message
from autohet_ray.planner.passes.polish import polish
from autohet_ray.planner.passes.rebalance import rebalance_micro_batches
from autohet_ray.planner.passes.recompute import check_recompute, drop_unneeded_recompute, plan_auto_recompute
from autohet_ray.planner.passes.refine import REFINED_CANDIDATES, improve_best, refine
from autohet_ray.planner.passes.sharding import check_sharding, plan_sharded
from autohet_ray.planner.result import PlanResult
from autohet_ray.planner.workers import run_split
from autohet_ray.profile.db import ProfileDB

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
    (planner/passes/recompute.py): "none", "full" (every stage) or "auto" (per stage, where it makes the plan fit or
    faster); `optimizer_sharding` (planner/passes/sharding.py) likewise, "dp" and "auto" searching at several
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


@dataclass(kw_only=True)
class _Search:
    """What the passes of one planning pass share: the request, its clock, and the best plans so far."""
    request: _Pass
    clock: _Deadline
    best: _Best
    incumbents: tuple[Plan, ...]
    sizes: list[int]                              # the micro-batch sizes searched
    per_size: list[tuple] = field(default_factory=list)   # each size's best plan, polished


class PlanningPass(NamedTuple):
    name: str
    does: str
    run: Callable[[_Search], None]


def _seed(s: _Search) -> None:
    for plan in s.incumbents:
        plan = plan.with_recompute(s.request.recompute).with_optimizer_sharding(s.request.shard > 1)
        s.best.offer(*best_schedule(plan, s.request.cluster, s.request.model, s.request.profile,
                                    schedules=s.request.schedules))


def _search(s: _Search) -> None:
    s.per_size = _search_sizes(s.request, s.sizes, s.clock, s.best)
    if s.best.plan is None:
        raise ConfigError(_nothing_found(s.request, s.best, s.clock))


def _polish_incumbent(s: _Search) -> None:
    if all(s.best.plan is not plan for plan, _ in s.per_size):       # an incumbent
        s.best.plan, s.best.evaluation = polish(s.best.plan, s.best.evaluation,
                                                s.request.table(s.best.plan.micro_batch), s.request.cluster,
                                                exhaustive=s.request.small, schedules=s.request.schedules)


def _rebalance_pass(s: _Search) -> None:
    if s.request.micro_batch is None:      # a micro-batch size the user fixed is kept for every pipeline
        _rebalance(s.request, s.best, s.per_size, max(s.sizes), s.clock)


# One planning pass, in order. Each pass reads and extends the search's state; the best plan at the end is the answer.
PASSES = (
    PlanningPass("seed", "price the incumbents (e.g. the baselines' plans) as candidates", _seed),
    PlanningPass("search", "per micro-batch size: templates, SCIP groupings, exact split and micro-batches, placement "
                 "(candidates/); each size's best few polished and refined (passes/polish.py, passes/refine.py)",
                 _search),
    PlanningPass("polish", "an incumbent still best: its stage order polished (passes/polish.py)", _polish_incumbent),
    PlanningPass("rebalance", "per-pipeline micro-batch sizes where they balance the batch better "
                 "(passes/rebalance.py)", _rebalance_pass),
)


def _plan_training(*, cluster: Cluster, model: ModelSpec, profile: ProfileDB, global_batch: int, seq_len: int,
                   micro_batch: int | None, time_limit_s: float, incumbents: tuple[Plan, ...],
                   schedules: tuple[str, ...], recompute: bool, mixed_recompute: bool = False,
                   shard: int = 1, goal: Goal = THROUGHPUT) -> PlanResult:
    """One planning pass (PASSES) with recomputation on every stage or none. `mixed_recompute` (small clusters
    under recompute="auto"): each size's best few plans first drop recomputation where it is not needed, so a plan
    that recomputes on one pipeline only is ranked as such. `shard`: the holders its sharded optimizer state
    is priced across while searching (1: unsharded)."""
    clock = _Deadline(time.perf_counter(), time_limit_s)
    request = _Pass(cluster=cluster, model=model, profile=profile, global_batch=global_batch, seq_len=seq_len,
                    micro_batch=micro_batch, schedules=schedules, recompute=recompute,
                    mixed_recompute=mixed_recompute, shard=shard, goal=goal)
    state = _Search(request=request, clock=clock, best=_Best(goal=goal, cluster=cluster), incumbents=incumbents,
                    sizes=micro_batch_candidates(global_batch, profile, micro_batch))
    for planning_pass in PASSES:
        planning_pass.run(state)
    best = state.best
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
    plan_for_micro_batch(table, request.cluster, request.global_batch, clock, local, request.schedules)
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
