"""Small clusters: every grouping of the templates, not only those the grouping program returns. At the
smallest deadline SCIP returns the grouping that finishes the most micro-batches, and the deadline model is an
estimate: a grouping that finishes just the batch can be faster in the full cost model (two pipelines of
different depth sharing a GPU type, with uneven micro-batch counts, was 7% faster on 2 A100 + 1 H20). Each
grouping's deadline is the least D at which its pipelines finish the batch (from their exact times)."""
from __future__ import annotations

import heapq

from autohet_ray.cluster.spec import Cluster
from autohet_ray.planner.candidates.grouping import Grouping

MAX_GROUPINGS = 200000        # enumeration stops past this many (a small cluster has far fewer)


def _room(cluster: Cluster) -> dict[tuple[str, int], int]:
    """(type, TP degree) -> GPUs of that type usable by groups of degree >= it (whole groups per node)."""
    out = {}
    for n in cluster.nodes:
        for tp in (1, 2, 4, 8, 16):
            out[(n.device, tp)] = out.get((n.device, tp), 0) + (n.count // tp) * tp
    return out


def _needs(template, keys) -> tuple[int, ...]:
    """GPUs one pipeline of the template takes in groups of degree >= tp, per (type, tp) of `keys`."""
    usage = template.usage().items()
    return tuple(sum(c * t for (d, t), c in usage if d == device and t >= tp) for device, tp in keys)


def _deadline(pipelines, total: int) -> float:
    """The least deadline at which these pipelines finish `total` micro-batches (each m-th from its exact
    time), or inf."""
    times = heapq.merge(*[[t.sync_nic_s + x for x in t.exact_s] for t in pipelines])
    for k, x in enumerate(times, start=1):
        if k == total:
            return x
    return float("inf")


def all_groupings(templates, cluster: Cluster, total: int, keep: int) -> list[Grouping]:
    """The `keep` groupings (template index -> copies) with the smallest deadlines, smallest first."""
    room = _room(cluster)
    keys = list(room)
    limit = tuple(room[k] for k in keys)
    order = [i for i, t in enumerate(templates) if t.exact_s]
    needs = {i: _needs(templates[i], keys) for i in order}
    best, seen = [], [0]

    def rec(k: int, counts: dict[int, int], used: tuple, pipes: list) -> None:
        if k == len(order):
            if pipes and seen[0] < MAX_GROUPINGS:
                seen[0] += 1
                d = _deadline(pipes, total)
                if d < float("inf"):
                    heapq.heappush(best, (-d, sorted(counts.items())))
                    if len(best) > keep:
                        heapq.heappop(best)
            return
        i = order[k]
        rec(k + 1, counts, used, pipes)
        c, more = 0, used
        while len(pipes) + c < total:
            c += 1
            more = tuple(a + b for a, b in zip(more, needs[i]))
            if any(a > b for a, b in zip(more, limit)):
                return
            rec(k + 1, {**counts, i: c}, more, pipes + [templates[i]] * c)
    rec(0, {}, tuple(0 for _ in keys), [])
    return [Grouping(dict(c), total, -d) for d, c in sorted(best, reverse=True)]
