"""Stage 1: device grouping as an integer program solved by SCIP (PySCIPOpt is imported only here).

Variables: n_T >= 0, the number of pipelines built from template T. For a deadline D every pipeline of T can
finish at most cap_T(D) micro-batches (from its exact split). The program maximizes the micro-batches the
whole cluster finishes by D subject to the GPUs of each type, and to packing TP groups inside nodes: for
every type and TP degree t, groups of degree >= t must fit in the nodes' room for groups that large.
The smallest D whose optimum reaches the global batch is found by bisection.

With prices (GroupingMoney) nodes are rented whole (cost/money.py bills per instance): an integer r_c per class
of identical nodes (type, GPUs, $/hour) says how many are rented, the packing rows above count only the room of
rented nodes, and the $/hour is sum_c price_c r_c. A budget bounds it; the "cost" mode instead minimizes it
subject to finishing the batch by D (the caller scans D: $ per iteration is about $/hour x D).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from pyscipopt import Model, quicksum

from autohet_ray.cluster.spec import Cluster
from autohet_ray.planner.candidates.space import Kind, TemplateEval


@dataclass(frozen=True)
class Grouping:
    counts: dict[int, int]       # template index -> number of pipelines
    capacity: int                # micro-batches finished by the deadline
    deadline_s: float
    others: tuple["Grouping", ...] = ()     # other solutions SCIP found that also finish the batch
    timed_out: bool = False      # SCIP stopped at its time limit (the result may then vary from run to run)


@dataclass(frozen=True)
class NodeClass:
    """Identical nodes, rented whole: `nodes` of them, each `gpus` GPUs of `device` at `usd_per_hour`."""
    device: str
    gpus: int
    usd_per_hour: float
    nodes: int


@dataclass(frozen=True)
class GroupingMoney:
    classes: tuple[NodeClass, ...]
    budget: float | None = None                             # $/hour at most
    minimize_cost: bool = False
    cover: dict[str, tuple[float, ...]] = field(default_factory=dict)   # device -> [n]: least $/hour of n GPUs


def _add_rentals(model, money: GroupingMoney):
    """The rented nodes of each class (integer variables) and their $/hour, with its budget."""
    rented = {c: model.addVar(vtype="I", lb=0, ub=cls.nodes, name=f"rent_{c}") for c, cls in enumerate(money.classes)}
    total = quicksum(cls.usd_per_hour * rented[c] for c, cls in enumerate(money.classes))
    if money.budget is not None:
        model.addCons(total <= money.budget * (1 + 1e-9), name="budget")
    return rented, total


def _room(cluster: Cluster, device: str, tp: int, rented=None, money: GroupingMoney | None = None):
    """GPUs of `device` usable by groups of degree >= tp (each node holds whole groups only); with `rented`,
    those of the rented nodes (an expression)."""
    if rented is None:
        return sum((n.count // tp) * tp for n in cluster.nodes if n.device == device)
    return quicksum((cls.gpus // tp) * tp * rented[c] for c, cls in enumerate(money.classes) if cls.device == device)


def solve_grouping(templates: list[TemplateEval], cluster: Cluster, total_microbatches: int, deadline_s: float,
                   time_limit_s: float, warm_start: dict[int, int] | None = None,
                   money: GroupingMoney | None = None) -> Grouping:
    caps = [min(t.max_microbatches(deadline_s), total_microbatches) for t in templates]
    usable = [i for i, c in enumerate(caps) if c > 0]
    model = Model("device_grouping")
    model.hideOutput()
    model.setParam("limits/time", max(0.1, time_limit_s))
    n = {i: model.addVar(vtype="I", lb=0, name=f"n_{i}") for i in usable}
    degrees = sorted({k[1] for t in templates for k in t.kinds})
    usage = {i: templates[i].usage().items() for i in usable}
    rented, usd = _add_rentals(model, money) if money is not None else (None, None)
    for device in cluster.device_types():
        for tp in degrees:
            terms = [c * k[1] * n[i] for i in usable for k, c in usage[i] if k[0] == device and k[1] >= tp]
            if terms:
                model.addCons(quicksum(terms) <= _room(cluster, device, tp, rented, money),
                              name=f"room_{device}_{tp}")
    model.addCons(quicksum(n.values()) <= total_microbatches, name="one_microbatch_per_pipeline")
    capacity = quicksum(caps[i] * n[i] for i in usable)
    if money is not None and money.minimize_cost:
        model.addCons(capacity >= total_microbatches, name="finish_the_batch")
        model.setObjective(usd, "minimize")
        warm_start = None            # its capacity may fall short of this deadline
    else:
        model.setObjective(capacity, "maximize")
    if warm_start and money is not None and money.budget is not None:
        warm_start = None            # it may break the budget
    if warm_start:
        sol = model.createSol()
        for i, var in n.items():
            model.setSolVal(sol, var, warm_start.get(i, 0))
        for c, var in (rented or {}).items():
            model.setSolVal(sol, var, money.classes[c].nodes)      # every node rented: the plain room
        model.addSol(sol)          # stored before presolve: SCIP starts from it (trySol needs a later stage)
    model.optimize()
    timed_out = model.getStatus() == "timelimit"
    if model.getNSols() == 0:
        return Grouping({}, 0, deadline_s, timed_out=timed_out)
    best = _as_grouping(model, model.getBestSol(), n, caps, deadline_s)
    others = {tuple(sorted(g.counts.items())): g for g in (_as_grouping(model, sol, n, caps, deadline_s)
                                                            for sol in model.getSols())
              if g.capacity >= total_microbatches and g.counts != best.counts}
    return Grouping(best.counts, best.capacity, deadline_s, tuple(others.values()), timed_out)


def _as_grouping(model, sol, n, caps, deadline_s) -> Grouping:
    counts = {i: int(round(model.getSolVal(sol, var))) for i, var in n.items()}
    counts = {i: c for i, c in counts.items() if c > 0}
    return Grouping(counts, sum(caps[i] * c for i, c in counts.items()), deadline_s)


def kinds_available(cluster: Cluster, kinds: list[Kind]) -> dict[Kind, int]:
    return {k: sum(n.count // k[1] for n in cluster.nodes if n.device == k[0]) for k in kinds}
