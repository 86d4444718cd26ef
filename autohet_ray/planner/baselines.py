"""Baselines priced with the same cost model, each the best plan within its own rules (searched).

Megatron-LM: one uniform (TP, PP, DP) over the GPUs used; ranks laid out Megatron's way (TP fastest, then DP,
then PP) over the nodes in some order, so stage j of every replica takes the j-th slice of tp*dp GPUs; equal
layers per stage (PP divides the layers), equal micro-batches per replica; it must fit every GPU it uses.
Whale: the same uniform structure and layout, with hardware-aware balancing: one layer split shared by all
replicas, chosen by stage speed (the slowest replica's stage j sets stage j's speed), and micro-batches
split across replicas by replica speed.
Both search every TP, PP, DP, micro-batch and node-type order over all GPUs (the rule "one uniform
TP x PP x DP for all GPUs"); with `subsets=True` they may also leave whole GPU types idle, which a user of
Megatron could do by hand (reported separately, as a stronger reference). Like the planner's plans, each
runs the faster schedule the cost model prices (1F1B or zero-bubble H1), so gains come from the layout alone.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from autohet_ray.cluster.spec import Cluster
from autohet_ray.cost.evaluate import Evaluation, best_schedule
from autohet_ray.cost.terms import GroupCostTable
from autohet_ray.model.spec import ModelSpec
from autohet_ray.plan.schedule import PLAN_SCHEDULES
from autohet_ray.plan.schema import Pipeline, Plan, Stage
from autohet_ray.planner.batch import allocate_microbatches
from autohet_ray.planner.split import best_split
from autohet_ray.profile.db import ProfileDB


@dataclass(frozen=True, kw_only=True)
class BaselineResult:
    name: str
    plan: Plan | None
    evaluation: Evaluation | None
    reason: str = ""


def _layouts(cluster: Cluster, model: ModelSpec, subsets: bool):
    """(nodes in rank order, tp, pp, dp) for every type order (and type subset) Megatron could be given."""
    types = cluster.device_types()
    for r in range(len(types), 0 if subsets else len(types) - 1, -1):
        for subset in itertools.permutations(types, r):
            nodes = [n for t in subset for n in cluster.nodes if n.device == t]
            gpus = sum(n.count for n in nodes)
            for tp in (1, 2, 4, 8, 16):
                if not model.valid_tp(tp) or any(n.count % tp for n in nodes):
                    continue
                for pp in range(1, model.num_layers + 1):
                    if gpus % (tp * pp) == 0:
                        yield nodes, tp, pp, gpus // (tp * pp)


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


def _plan(model, cluster, grid, counts, micro, *, global_batch, micro_batch, seq_len) -> Plan:
    pipelines = []
    for replica, m in zip(grid, micro):
        stages, start = [], 0
        for (node, device, gpus), n in zip(replica, counts):
            stages.append(Stage(layers=(start, start + n), tp=len(gpus), device_type=device, node=node, devices=gpus))
            start += n
        pipelines.append(Pipeline(num_microbatches=m, stages=tuple(stages)))
    return Plan(model=model.name, model_spec=model.to_dict(), cluster=cluster.name, global_batch=global_batch,
                micro_batch=micro_batch, seq_len=seq_len, pipelines=tuple(pipelines))


def _whale_balance(table: GroupCostTable, grid, total: int):
    """Layer split by stage speed (shared by all replicas) and micro-batches by replica speed."""
    pp = len(grid[0])
    slowest = [max((table.get(r[j][1], len(r[j][2])) for r in grid), key=lambda g: g.layer_s) for j in range(pp)]
    share = max(1, total // len(grid))
    split = best_split(slowest, table.model.num_layers, share, [0.0] * (pp - 1))
    if split is None:
        return None
    stage_s = [[table.get(r[j][1], len(r[j][2])).stage_time(split.counts[j], j == 0, j == pp - 1)
                for j in range(pp)] for r in grid]
    fns = [lambda m, s=s: (m - 1) * max(s) + sum(s) for s in stage_s]
    micro = allocate_microbatches(fns, total)
    return (split.counts, micro) if micro else None


def best_baseline(name: str, *, cluster: Cluster, model: ModelSpec, profile: ProfileDB, global_batch: int,
                  seq_len: int, micro_batches: list[int], subsets: bool = False,
                  schedules: tuple[str, ...] = PLAN_SCHEDULES) -> BaselineResult:
    assert name in ("megatron", "whale")
    best_plan, best_ev, reason = None, None, "no uniform (TP, PP, DP) layout exists for this cluster"
    for mb in micro_batches:
        total = global_batch // mb
        table = GroupCostTable(model=model, cluster=cluster, profile=profile, micro_batch=mb, seq_len=seq_len)
        for nodes, tp, pp, dp in _layouts(cluster, model, subsets):
            if dp > total:
                continue
            grid = _grid(nodes, tp, pp, dp)
            if name == "megatron":
                if model.num_layers % pp or total % dp:
                    continue
                counts, micro = [model.num_layers // pp] * pp, [total // dp] * dp
            else:
                balanced = _whale_balance(table, grid, total)
                if balanced is None:
                    continue
                counts, micro = balanced
            plan = _plan(model, cluster, grid, counts, micro, global_batch=global_batch, micro_batch=mb,
                         seq_len=seq_len)
            plan, ev = best_schedule(plan, cluster, model, profile, table, schedules)
            if not ev.feasible:
                reason = f"every uniform layout runs out of memory (e.g. tp={tp} pp={pp} dp={dp}: {ev.reason})"
                continue
            if best_ev is None or ev.iteration_time_s < best_ev.iteration_time_s:
                best_plan, best_ev = plan, ev
    if best_plan is None:
        return BaselineResult(name=name, plan=None, evaluation=None, reason=reason)
    return BaselineResult(name=name, plan=best_plan.with_predicted(best_ev.predicted()), evaluation=best_ev)
