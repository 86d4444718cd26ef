"""Money on the command line (the --prices / --objective / --max-cost-per-hour / --min-samples-per-s options are
TrainJob's fields, cli/options.py): the plan's money report: its $/hour and $ per million tokens beside each
baseline's, the GPUs it leaves out with what each would add, and the instances to rent (the fleet answer: whole
instances, as cost/money.py bills them)."""
from __future__ import annotations

import time
from dataclasses import replace

from autohet_ray import ConfigError
from autohet_ray.cost.money import (Goal, cluster_usd_per_hour, node_rental, node_usd_per_hour, plan_usd_per_hour,
                                    usd_per_million_tokens)
from autohet_ray.planner import plan_training
from autohet_ray.planner.workers import run_split

LEFT_OUT_TIME_LIMIT_S = 0.5      # each "what would it add" re-plan


def _money(plan, samples_per_s: float, cluster, goal: Goal, seq_len: int) -> dict:
    usd = plan_usd_per_hour(plan, cluster, goal.prices)
    return {"usd_per_hour": round(usd, 4),
            "usd_per_million_tokens": round(usd_per_million_tokens(usd, samples_per_s, seq_len), 6)}


def _gpus_used(plan) -> dict[str, int]:
    used: dict[str, int] = {}
    for p in plan.pipelines:
        for s in p.stages:
            used[s.node] = used.get(s.node, 0) + s.tp
    return used


def left_out(plan, cluster, goal: Goal) -> list[dict]:
    """GPUs the plan does not use, per class (device type, spot or on-demand, on nodes it uses or not): which
    nodes, how many, and what renting them adds per hour (nothing on the nodes used: they are paid for whole)."""
    used = _gpus_used(plan)
    classes: dict[tuple, dict] = {}
    for n in cluster.nodes:
        free = n.count - used.get(n.name, 0)
        if free > 0:
            row = classes.setdefault((n.device, n.spot, n.name in used),
                                     {"device": n.device, "spot": n.spot, "gpus": 0, "nodes": [],
                                      "of_used_nodes": n.name in used, "usd_per_hour": 0.0})
            row["gpus"] += free
            row["nodes"].append(n.name)
            if n.name not in used:
                row["usd_per_hour"] = round(row["usd_per_hour"] + node_usd_per_hour(cluster, goal.prices, n.name), 4)
    return list(classes.values())


def _compact(plan, used: dict[str, list[int]]):
    """The plan with each node's GPUs renumbered 0.. in order (on a node shrunk to the GPUs the plan uses)."""
    index = {node: {g: i for i, g in enumerate(sorted(gpus))} for node, gpus in used.items()}
    return replace(plan, pipelines=tuple(replace(p, stages=tuple(
        replace(s, devices=tuple(index[s.node][g] for g in s.devices)) for s in p.stages)) for p in plan.pipelines),
        predicted=None)


def what_each_adds(result, cluster, goal: Goal, request: dict, seq_len: int, rows: list[dict]) -> None:
    """For each left-out class: the fastest plan on the GPUs the plan uses plus that class (a short re-plan at
    the plan's micro-batch size, seeded with the plan, so it never loses throughput), its samples/s gained,
    $/hour and $ per million tokens, into the row."""
    used: dict[str, list[int]] = {}
    for p in result.plan.pipelines:
        for s in p.stages:
            used.setdefault(s.node, []).extend(s.devices)
    seed = _compact(result.plan, used)
    adds = run_split(_what_it_adds, [row["nodes"] for row in rows], result, used, seed, cluster, goal, request,
                     seq_len)
    for row, found in zip(rows, adds):
        row["adds"] = found


def _what_it_adds(names: list[str], result, used: dict, seed, cluster, goal: Goal, request: dict,
                  seq_len: int) -> dict:
    """The "adds" of one left-out class (its nodes `names`): see what_each_adds. Runs in the helper process
    when there is one (planner/workers.py)."""
    nodes = tuple(n if n.name in names else replace(n, count=len(used[n.name]))
                  for n in cluster.nodes if n.name in used or n.name in names)
    sub = replace(cluster, nodes=nodes)
    try:
        r = plan_training(**(request | {"micro_batch": request["micro_batch"] or result.plan.micro_batch}),
                          cluster=sub, time_limit_s=LEFT_OUT_TIME_LIMIT_S, incumbents=(seed,))
    except ConfigError as err:
        return {"reason": str(err)}
    money = _money(r.plan, r.evaluation.samples_per_s, cluster, goal, seq_len)   # billed for its whole nodes
    return {"samples_per_s": round(r.evaluation.samples_per_s - result.evaluation.samples_per_s, 3), **money}


def rent(plan, cluster, goal: Goal) -> list[dict]:
    """The instances a plan rents: every node it uses, whole (its instance type, GPUs, $/hour)."""
    out = []
    for name, gpus in _gpus_used(plan).items():
        node, rental = cluster.node(name), node_rental(cluster.node(name), goal.prices)
        out.append({"node": name, "instance": rental.instance, "device": node.device, "spot": node.spot,
                    "gpus": rental.gpus, "gpus_used": gpus, "usd_per_hour": round(rental.usd_per_hour, 4)})
    return out


def money_report(result, baselines: dict, cluster, goal: Goal, seq_len: int, request: dict) -> dict:
    """The `money` part of `autohet plan --json` (with --prices)."""
    started = time.perf_counter()
    report = {"objective": goal.objective, "max_usd_per_hour": goal.max_usd_per_hour,
              "min_samples_per_s": goal.min_samples_per_s,
              "plan": _money(result.plan, result.evaluation.samples_per_s, cluster, goal, seq_len),
              "all_nodes_usd_per_hour": round(cluster_usd_per_hour(cluster, goal.prices), 4),
              "baselines": {n: _money(b.plan, b.evaluation.samples_per_s, cluster, goal, seq_len)
                            for n, b in baselines.items() if b.evaluation is not None}}
    rows = left_out(result.plan, cluster, goal)
    if rows:
        what_each_adds(result, cluster, goal, request, seq_len, rows)
    report["left_out"] = rows
    report["rent"] = rent(result.plan, cluster, goal)
    report["left_out_time_s"] = round(time.perf_counter() - started, 3)
    return report


def _spot(flag: bool) -> str:
    return "spot" if flag else "on-demand"


def money_lines(report: dict, titles: dict) -> list[str]:
    plan = report["plan"]
    lines = [f"cost: ${plan['usd_per_hour']:.2f}/hour, ${plan['usd_per_million_tokens']:.4f} per million tokens "
             f"(objective {report['objective']}; billed per instance, all nodes would cost "
             f"${report['all_nodes_usd_per_hour']:.2f}/hour)"]
    for name, money in report["baselines"].items():
        lines.append(f"  vs {titles.get(name, name):<29}: ${money['usd_per_hour']:8.2f}/hour, "
                     f"${money['usd_per_million_tokens']:.4f} per million tokens")
    for row in report["left_out"]:
        names = row["nodes"] if len(row["nodes"]) <= 3 else row["nodes"][:2] + [f"{len(row['nodes']) - 2} more"]
        where = "on the nodes used" if row["of_used_nodes"] else f"on {', '.join(names)}"
        adds = row.get("adds", {})
        gain = (f"adding them: {adds['samples_per_s']:+.1f} samples/s, ${adds['usd_per_hour']:.2f}/hour, "
                f"${adds['usd_per_million_tokens']:.4f} per million tokens") if "samples_per_s" in adds \
            else f"adding them: {adds.get('reason', 'not evaluated')}"
        if report["objective"] == "cost" and adds.get("usd_per_million_tokens", float("inf")) < \
                plan["usd_per_million_tokens"]:
            gain += " (cheaper per token than the plan: a longer --plan-time-limit-s may find it)"
        lines.append(f"left out: {row['gpus']}x {row['device']} ({_spot(row['spot'])}) {where}; {gain}")
    lines.append("rent: " + rent_line(report["rent"]))
    return lines


def rent_line(rented: list[dict]) -> str:
    """The instances to rent, per instance type and market: how many, which nodes, the GPUs the plan uses."""
    kinds: dict[tuple, list[dict]] = {}
    for r in rented:
        kinds.setdefault((r["instance"], r["device"], r["gpus"], r["spot"]), []).append(r)
    return "; ".join(f"{len(rows)}x {instance or 'node'} ({gpus}x {device}, {_spot(spot)}: "
                     f"{', '.join(r['node'] for r in rows)}; uses {sum(r['gpus_used'] for r in rows)} of "
                     f"{gpus * len(rows)} GPUs, ${sum(r['usd_per_hour'] for r in rows):.2f}/hour)"
                     for (instance, device, gpus, spot), rows in kinds.items())
