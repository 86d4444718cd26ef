"""Baselines priced with the same cost model, each the best plan within its own rules (searched).

Megatron-LM: one uniform (TP, PP, DP) over the GPUs used; ranks laid out Megatron's way (TP fastest, then DP,
then PP) over the nodes in some order, so stage j of every replica takes the j-th slice of tp*dp GPUs; equal
layers per stage (PP divides the layers), equal micro-batches per replica; it must fit every GPU it uses.
Whale: the same uniform structure and layout, with hardware-aware balancing: one layer split shared by all
replicas, chosen by stage speed (the slowest replica's stage j sets stage j's speed), and micro-batches
split across replicas by replica speed.
Both search every TP, PP, DP, micro-batch and node-type order over all GPUs (the rule "one uniform
TP x PP x DP for all GPUs"); with `subsets=True` they may also leave whole GPU types idle, or run one type
alone on a power-of-two number of its nodes, which a user of Megatron could do by hand ("megatron-subset",
reported separately, as the stronger reference). Like the planner's plans, each
runs the faster schedule the cost model prices (1F1B or zero-bubble H1), so gains come from the layout alone.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from autohet_ray.cluster.spec import Cluster
from autohet_ray.cost.evaluate import Evaluation, best_schedule
from autohet_ray.cost.sync import sync_buckets
from autohet_ray.cost.terms import GroupCostTable
from autohet_ray.model.spec import ModelSpec
from autohet_ray.plan.schedule import PLAN_SCHEDULES
from autohet_ray.plan.schema import Pipeline, Plan, Stage
from autohet_ray.planner.candidates.batch import allocate_microbatches
from autohet_ray.planner.candidates.floor import INFEASIBLE, pipeline_floor_s, stage_floors, with_sync_floor
from autohet_ray.planner.passes.recompute import check_recompute, drop_unneeded_recompute
from autohet_ray.planner.candidates.split import best_split
from autohet_ray.profile.db import ProfileDB


@dataclass(frozen=True, kw_only=True)
class BaselineResult:
    name: str
    plan: Plan | None
    evaluation: Evaluation | None
    reason: str = ""


def _node_orders(cluster: Cluster, subsets: bool):
    """Node lists in rank order: every order of the device types (all their nodes); with `subsets` also
    every order of every subset of types, and each type alone on a power-of-two number of its nodes."""
    types = cluster.device_types()
    of_type = {t: [n for n in cluster.nodes if n.device == t] for t in types}
    seen = set()
    for r in range(len(types), 0 if subsets else len(types) - 1, -1):
        for subset in itertools.permutations(types, r):
            yield [n for t in subset for n in of_type[t]]
    if subsets:
        for t in types:
            count = 1
            while count < len(of_type[t]):
                nodes = tuple(of_type[t][:count])
                if nodes not in seen:
                    seen.add(nodes)
                    yield list(nodes)
                count *= 2


def _layouts(cluster: Cluster, model: ModelSpec, subsets: bool):
    """(nodes in rank order, tp, pp, dp) for every node order (and subset) Megatron could be given."""
    for nodes in _node_orders(cluster, subsets):
        gpus = sum(n.count for n in nodes)
        for tp in (1, 2, 4, 8, 16):
            if not model.valid_tp(tp) or any(n.count % tp for n in nodes):
                continue
            for pp in range(1, model.num_layers + 1):
                if gpus % (tp * pp) == 0:
                    yield nodes, tp, pp, gpus // (tp * pp)


def _replica_types(nodes, tp: int, pp: int, dp: int) -> list[tuple[str, ...]]:
    """[replica] -> device type of each stage, in Megatron's tp-dp-pp rank order over the node list."""
    flat = [n.device for n in nodes for _ in range(n.count)]
    return [tuple(flat[(j * dp + k) * tp] for j in range(pp)) for k in range(dp)]


def _grid(nodes, tp: int, pp: int, dp: int) -> list[list[tuple[str, str, tuple[int, ...]]]]:
    """[replica][stage] -> (node, device type, GPUs): Megatron's tp-dp-pp rank order over the node list."""
    flat = [(n.name, n.device, i) for n in nodes for i in range(n.count)]
    grid = [[None] * pp for _ in range(dp)]
    for j in range(pp):
        for k in range(dp):
            start = (j * dp + k) * tp
            chunk = flat[start:start + tp]
            grid[k][j] = (chunk[0][0], chunk[0][1], tuple(c[2] for c in chunk))
    return grid


def _plan(model, cluster, grid, counts, micro, *, global_batch, micro_batch, seq_len, recompute=False) -> Plan:
    pipelines = []
    for replica, m in zip(grid, micro):
        stages, start = [], 0
        for (node, device, gpus), n in zip(replica, counts):
            stages.append(Stage(layers=(start, start + n), tp=len(gpus), device_type=device, node=node, devices=gpus,
                                recompute=recompute))
            start += n
        pipelines.append(Pipeline(num_microbatches=m, stages=tuple(stages)))
    return Plan(model=model.name, model_spec=model.to_dict(), cluster=cluster.name, global_batch=global_batch,
                micro_batch=micro_batch, seq_len=seq_len, pipelines=tuple(pipelines))


def _whale_balance(table: GroupCostTable, replicas: list[tuple[str, ...]], tp: int, total: int):
    """Layer split by stage speed (shared by all replicas) and micro-batches by replica speed."""
    pp = len(replicas[0])
    slowest = [max((table.get(r[j], tp) for r in dict.fromkeys(replicas)), key=lambda g: g.layer_s) for j in range(pp)]
    share = max(1, total // len(replicas))
    split = best_split(slowest, table.model.num_layers, share, [0.0] * (pp - 1))
    if split is None:
        return None
    stage_s = {r: [table.get(r[j], tp).stage_time(split.counts[j], j == 0, j == pp - 1) for j in range(pp)]
               for r in set(replicas)}
    fns = [lambda m, a=max(stage_s[r]), b=sum(stage_s[r]): (m - 1) * a + b for r in replicas]
    micro = allocate_microbatches(fns, total)
    return (split.counts, micro) if micro else None


@dataclass(frozen=True)
class _Candidate:
    floor_s: float               # planner/candidates/floor.py: no evaluation of this layout can be faster
    micro_batch: int
    nodes: tuple
    tp: int
    pp: int
    dp: int
    counts: tuple[int, ...]      # layers per stage
    micro: tuple[int, ...]       # micro-batches per replica
    recompute: bool = False      # every stage recomputes its activations in the backward


RECOMPUTE_OPTIONS = {"none": (False,), "full": (True,), "auto": (False, True)}


def _candidates(name, cluster, model, profile, global_batch, seq_len, micro_batches, subsets, schedules,
                recompute="none", shard=False):
    """Every layout within the baseline's rules, with its floor (under "auto" each with and without
    recomputation on every stage)."""
    out = []
    layouts = [(nodes, tp, pp, dp, _replica_types(nodes, tp, pp, dp))
               for nodes, tp, pp, dp in _layouts(cluster, model, subsets)]
    for mb, flag in itertools.product(micro_batches, RECOMPUTE_OPTIONS[recompute]):
        total = global_batch // mb
        table = GroupCostTable(model=model, cluster=cluster, profile=profile, micro_batch=mb, seq_len=seq_len,
                               recompute=flag)
        floors: dict[tuple, float] = {}
        for nodes, tp, pp, dp, replicas in layouts:
            if dp > total:
                continue
            if name == "megatron":
                if model.num_layers % pp or total % dp:
                    continue
                counts, micro = (model.num_layers // pp,) * pp, (total // dp,) * dp
            else:
                balanced = _whale_balance(table, replicas, tp, total)
                if balanced is None:
                    continue
                counts, micro = tuple(balanced[0]), tuple(balanced[1])
            floor = 0.0
            for r, m in set(zip(replicas, micro)):
                key = (r, tp, counts, m)
                if key not in floors:
                    groups = [table.get(d, tp, None, dp if shard and dp > 1 else 1) for d in r]
                    floors[key] = min(pipeline_floor_s(groups, counts, m, s) for s in schedules)
                floor = max(floor, floors[key])
            out.append(_Candidate(floor, mb, tuple(nodes), tp, pp, dp, counts, micro, flag))
    return out


def best_baseline(name: str, *, cluster: Cluster, model: ModelSpec, profile: ProfileDB, global_batch: int,
                  seq_len: int, micro_batches: list[int], subsets: bool = False,
                  schedules: tuple[str, ...] = PLAN_SCHEDULES, recompute: str = "none",
                  optimizer_sharding: str = "none") -> BaselineResult:
    """The fastest plan within the baseline's rules. Layouts are priced in order of their floor, and the
    search stops once the floor reaches the fastest priced plan (as fast as pricing every layout).
    `recompute` as the planner's: "none", "full" (every stage), or "auto" (every layout with and without it
    on all stages; then, as the planner does, kept only on the stages that need it to fit)."""
    assert name in ("megatron", "whale")
    check_recompute(recompute)
    # Megatron-LM shards its optimizer state across data-parallel replicas (--use-distributed-optimizer) when
    # the job allows sharding; Whale, like the other heterogeneous planners, does not shard
    shard = name == "megatron" and optimizer_sharding != "none"
    candidates = _candidates(name, cluster, model, profile, global_batch, seq_len, micro_batches, subsets,
                             schedules, recompute, shard)
    if not candidates:
        return BaselineResult(name=name, plan=None, evaluation=None,
                              reason=no_layout_reason(name, cluster, model, global_batch, micro_batches, subsets))
    # stable: equal floors keep the enumeration order, so the same input gives the same plan
    ranked = sorted(candidates, key=lambda c: c.floor_s)
    if ranked[0].floor_s == INFEASIBLE:
        ranked = ranked[:1]               # priced once, for the memory message
    best_plan, best_ev, reason = _fastest(ranked, cluster, model, profile, global_batch, seq_len, schedules, shard)
    if best_plan is None:
        hint = "" if recompute != "none" else "; activation recomputation may make it fit (--recompute auto)"
        return BaselineResult(name=name, plan=None, evaluation=None, reason=reason + hint)
    if recompute == "auto":
        best_plan, best_ev = drop_unneeded_recompute(best_plan, best_ev, cluster, model, profile, schedules)
    return BaselineResult(name=name, plan=best_plan.with_predicted(best_ev.predicted()), evaluation=best_ev)


def _fastest(ranked: list[_Candidate], cluster, model, profile, global_batch: int, seq_len: int, schedules,
             shard: bool) -> tuple[Plan | None, Evaluation | None, str]:
    """(plan, evaluation) of the fastest candidate that fits, priced in order of their floors until the floor
    reaches the fastest priced, or Nones with why none fits."""
    best_plan, best_ev, reason = None, None, ""
    buckets: dict[tuple, dict] = {}         # layout -> its all-reduce buckets (they ignore micro-batch counts)
    for c in ranked:
        if best_ev is not None and c.floor_s >= best_ev.iteration_time_s:
            break
        table = GroupCostTable(model=model, cluster=cluster, profile=profile, micro_batch=c.micro_batch,
                               seq_len=seq_len, recompute=c.recompute)
        plan = _plan(model, cluster, _grid(c.nodes, c.tp, c.pp, c.dp), c.counts, c.micro,
                     global_batch=global_batch, micro_batch=c.micro_batch, seq_len=seq_len, recompute=c.recompute)
        plan = plan.with_optimizer_sharding(shard and c.dp > 1)
        layout = (tuple(n.name for n in c.nodes), c.tp, c.pp, c.dp, c.counts)
        if layout not in buckets:
            buckets[layout] = sync_buckets(plan, cluster, model, profile)
        # (the sync floor prices all-reduces and replicated state: no floor for a sharded plan)
        if best_ev is not None and not (shard and c.dp > 1) and \
                _sync_floor(plan, table, buckets[layout], schedules) >= best_ev.iteration_time_s:
            continue
        plan, ev = best_schedule(plan, cluster, model, profile, table, schedules, buckets[layout])
        assert ev.iteration_time_s >= c.floor_s * (1 - 1e-9) or not ev.feasible, (ev.iteration_time_s, c)
        if not ev.feasible:
            reason = (f"every uniform layout runs out of memory (e.g. tp={c.tp} pp={c.pp} dp={c.dp}: "
                      f"{ev.reason})")
            continue
        if best_ev is None or ev.iteration_time_s < best_ev.iteration_time_s:
            best_plan, best_ev = plan, ev
    return best_plan, best_ev, reason


def _sync_floor(plan: Plan, table: GroupCostTable, buckets: dict, schedules: tuple[str, ...]) -> float:
    """planner/candidates/floor.py's floor with each stage's all-reduces after its last gradient action starts."""
    bucket_s = {key: sum(d for _, d, _ in items) for key, items in buckets.items()}
    best = INFEASIBLE
    for schedule in schedules:
        worst, memo = 0.0, {}
        for k, p in enumerate(plan.pipelines):
            shape = (tuple((s.device_type, s.tp) for s in p.stages), p.num_microbatches)
            if shape not in memo:
                memo[shape] = stage_floors([table.get(*kind) for kind in shape[0]],
                                           tuple(s.num_layers for s in p.stages), p.num_microbatches, schedule)
            if memo[shape] is None:
                worst = INFEASIBLE
                break
            worst = max(worst, with_sync_floor(memo[shape], [bucket_s[(k, j)] for j in range(len(p.stages))]))
        best = min(best, worst)
    return best


def no_layout_reason(name, cluster: Cluster, model: ModelSpec, global_batch: int, micro_batches: list[int],
                     subsets: bool) -> str:
    """Why no layout exists within the rules (Megatron: TP x PP x DP must be the GPUs used, PP must divide
    the layers and DP the micro-batches)."""
    sizes = sorted({n.count for n in cluster.nodes})
    what = "any subset of the GPUs" if subsets else f"all {cluster.num_gpus} GPUs"
    rules = (f"TP dividing every node's GPU count ({', '.join(map(str, sizes))}), TP x PP x DP = the GPUs used, "
             f"PP <= {model.num_layers} layers")
    if name == "megatron":
        rules += (f", PP dividing the {model.num_layers} layers, and DP dividing the micro-batches per "
                  f"iteration (global batch {global_batch} / micro-batch {'|'.join(map(str, micro_batches))})")
    return f"no uniform (TP, PP, DP) layout covers {what}: {name} needs {rules}"
