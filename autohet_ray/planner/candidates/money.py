"""The planner's side of money (cost/money.py has the prices and the Goal): the grouping program's nodes, rented
whole, and their $/hour, the deadlines scanned for the cheapest plan, the estimates that rank candidate
groupings, and the one line that says what a goal no plan meets would need.

Cheapest plan: $ per iteration = $/hour x seconds per iteration. For each deadline D of a geometric scan from
the fastest grouping's deadline up to the slowest single pipeline's, SCIP finds the cheapest grouping that
finishes the batch by D; the full cost model then ranks the realized plans by $ per token (or, under a
budget, by samples/s: the budget is a row of the program and the deadline is bisected as for throughput)."""
from __future__ import annotations

import math
from dataclasses import replace

from autohet_ray.cluster.spec import Cluster
from autohet_ray.cost.money import Goal, check_priced, node_usd_per_hour, plan_nodes, plan_usd_per_hour
from autohet_ray.plan.schema import Plan
from autohet_ray.planner.candidates.grouping import Grouping, GroupingMoney, NodeClass, solve_grouping

SCAN_POINTS = 16           # deadlines scanned from the fastest grouping's to the slowest single pipeline's
SCAN_RATIO_MIN = 1.04      # adjacent deadlines differ by at least this factor


def grouping_money(goal: Goal, cluster: Cluster) -> GroupingMoney | None:
    """The grouping program's money: the cluster's classes of identical nodes (rented whole), the budget, and
    the least $/hour of whole nodes that hold n GPUs of each type."""
    if goal.plain:
        return None
    classes: dict[tuple, int] = {}
    for n in cluster.nodes:
        key = (n.device, n.count, node_usd_per_hour(cluster, goal.prices, n.name))
        classes[key] = classes.get(key, 0) + 1
    return GroupingMoney(tuple(NodeClass(d, g, usd, k) for (d, g, usd), k in classes.items()),
                         budget=goal.max_usd_per_hour, minimize_cost=False, cover=_covers(classes))


def _covers(classes: dict[tuple, int]) -> dict[str, tuple[float, ...]]:
    """Per device, [n]: the least $/hour of whole nodes holding at least n of its GPUs (0/1 knapsack cover)."""
    out = {}
    for device in dict.fromkeys(d for d, _, _ in classes):
        nodes = [(g, usd) for (d, g, usd), k in classes.items() if d == device for _ in range(k)]
        least = [0.0] + [math.inf] * sum(g for g, _ in nodes)
        for gpus, usd in nodes:
            for n in range(len(least) - 1, 0, -1):
                least[n] = min(least[n], least[max(0, n - gpus)] + usd)
        out[device] = tuple(least)
    return out


def usage_usd_per_hour(gpus: dict[str, int], money: GroupingMoney) -> float:
    """$/hour of the whole nodes that hold this many GPUs of each type, at the least."""
    return sum(money.cover[d][n] if n < len(money.cover[d]) else math.inf for d, n in gpus.items() if n > 0)


def grouping_gpus(counts: dict[int, int], templates) -> dict[str, int]:
    gpus: dict[str, int] = {}
    for i, copies in counts.items():
        for (device, tp), c in templates[i].usage().items():
            gpus[device] = gpus.get(device, 0) + copies * c * tp
    return gpus


def estimate_key(goal: Goal, money: GroupingMoney | None, gpus: dict[str, int], estimate_s: float,
                 global_batch: int) -> float:
    """The goal's key (cost/money.py Goal.key) of a grouping from its estimated iteration time."""
    if money is None:
        return estimate_s
    usd = usage_usd_per_hour(gpus, money)
    if goal.max_usd_per_hour is not None and usd > goal.max_usd_per_hour * (1 + 1e-9):
        return math.inf
    if goal.min_samples_per_s is not None and global_batch / estimate_s < goal.min_samples_per_s * 0.9:
        return math.inf              # the estimate is rough: keep what comes within 10% of the floor
    return usd * estimate_s if goal.minimizes_cost else estimate_s


def cheapest_groupings(templates, cluster: Cluster, total: int, money: GroupingMoney, fastest_s: float,
                       time_left, floor_deadline_s: float | None = None, keep: int | None = None) -> list[Grouping]:
    """The `keep` cheapest groupings (by estimated $ per iteration) of those found at the scanned deadlines,
    cheapest first. The scan stops once no grouping at a later deadline can make the `keep` cheapest: each
    costs at least the cheapest single pipeline's $/hour times its deadline."""
    slowest = max(t.sync_nic_s + (t.exact_s[total - 1] if len(t.exact_s) >= total else
                                  t.fixed_s + (total - 1) * t.bottleneck_s) for t in templates)
    if floor_deadline_s is not None:
        slowest = min(slowest, floor_deadline_s)
    ratio = max(SCAN_RATIO_MIN, (slowest / fastest_s) ** (1 / SCAN_POINTS)) if slowest > fastest_s else 2.0
    cheap = replace(money, minimize_cost=True)
    key = lambda g: usage_usd_per_hour(grouping_gpus(g.counts, templates), money) * g.deadline_s  # noqa: E731
    least_rate = min(usage_usd_per_hour(grouping_gpus({i: 1}, templates), money) for i in range(len(templates)))
    found, deadline = [], fastest_s
    while deadline <= slowest * (1 + 1e-9) and time_left() > 0:
        if keep is not None and len(found) >= keep and least_rate * deadline >= sorted(map(key, found))[keep - 1]:
            break                  # (sorted is stable: a later grouping of an equal key ranks after those found)
        g = solve_grouping(templates, cluster, total, deadline, min(10.0, max(0.1, time_left() / 4)), None, cheap)
        found += [x for x in (g, *g.others) if x.counts and x.capacity >= total]
        deadline *= ratio
    return sorted(found, key=key)[:keep]


def on_cheapest_nodes(plan: Plan, cluster: Cluster, goal: Goal) -> Plan:
    """The plan moved, node for node, onto the cheapest of identical nodes (same type, GPUs and NIC): a spot
    node before an on-demand one. Identical nodes are equally fast in the cost model."""
    if goal.prices is None:
        return plan
    used = plan_nodes(plan)
    price = lambda name: node_usd_per_hour(cluster, goal.prices, name)  # noqa: E731
    shape = lambda name: (cluster.node(name).device, cluster.node(name).count,  # noqa: E731
                          cluster.node(name).nic_gbps)
    moved: dict[str, str] = {}
    for key in dict.fromkeys(shape(n) for n in used):
        mine = [n for n in used if shape(n) == key]
        pool = sorted((n.name for n in cluster.nodes if shape(n.name) == key), key=price)
        target = pool[:len(mine)]
        for src, dst in zip(sorted(mine, key=price, reverse=True), sorted(target, key=price, reverse=True)):
            moved[src] = dst
    if all(a == b for a, b in moved.items()) or sum(map(price, moved.values())) >= sum(map(price, moved)):
        return plan
    pipelines = tuple(replace(p, stages=tuple(replace(s, node=moved[s.node]) for s in p.stages))
                      for p in plan.pipelines)
    return replace(plan, pipelines=pipelines, predicted=None)


def unmet_goal_message(goal: Goal, cluster: Cluster, fastest, cheapest) -> str:
    """One line: what a goal no plan met would need. `fastest` / `cheapest`: (plan, evaluation) of the fastest
    plan that fits in memory but broke the goal, and of the cheapest per token (or per hour, of those seen)."""
    plan, ev = fastest
    if goal.min_samples_per_s is not None and ev.samples_per_s < goal.min_samples_per_s:
        return (f"no plan reaches {goal.min_samples_per_s:g} samples/s on {cluster.name}: the fastest found gives "
                f"{ev.samples_per_s:.1f} samples/s at ${plan_usd_per_hour(plan, cluster, goal.prices):.2f}/hour; "
                f"lower --min-samples-per-s or add GPUs")
    plan, ev = cheapest
    usd = plan_usd_per_hour(plan, cluster, goal.prices)
    return (f"no plan found fits a budget of ${goal.max_usd_per_hour:g}/hour on {cluster.name}: the plan cheapest "
            f"per token costs ${usd:.2f}/hour ({ev.samples_per_s:.1f} samples/s); raise --max-cost-per-hour to "
            f"{math.ceil(usd * 100) / 100:.2f} for it" + (" or lower --min-samples-per-s" if goal.min_samples_per_s
                                                        else ""))


def check_goal_cluster(goal: Goal, cluster: Cluster) -> None:
    """ConfigError naming the cluster's device types the goal's prices lack."""
    if goal.prices is not None:
        check_priced(cluster, goal.prices)
