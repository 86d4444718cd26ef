"""Exact contiguous layer split of one pipeline under memory limits.

Because stage j's time is affine in its layer count (a_j + n_j * b_j), any vector of counts n_j >= 1 with
sum L is a valid contiguous split. For a bottleneck bound B each stage can take at most cap_j(B) layers
(time <= B and memory); the smallest sum of stage times under that bound puts the surplus layers on the
stages with the smallest per-layer time first. Trying every distinct bound B (each stage time value) gives
the exact minimum of (m - 1) * max(bottleneck, slowest link) + sum of stage times; candidates are then priced
with the round-trip-aware period of `cost.pipeline.steady_period`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autohet_ray.cost.memory import live_counts
from autohet_ray.cost.pipeline import in_flight, steady_period
from autohet_ray.cost.terms import GroupCost
from autohet_ray.planner.candidates.floor import STEADY_FROM, steady_microbatches

ONE_F_ONE_B = ("1f1b",)


@dataclass(frozen=True)
class Split:
    counts: tuple[int, ...]        # layers per stage
    stage_s: tuple[float, ...]     # fwd+bwd per micro-batch per stage
    time_s: float                  # 1F1B time with the given links and micro-batches
    memory_bound: bool = False     # some stage holds as many layers as its memory allows

    @property
    def bottleneck_s(self) -> float:
        return max(self.stage_s)


def memory_caps(groups: list[GroupCost], num_microbatches: int, schedules: tuple[str, ...] = ONE_F_ONE_B) -> list[int]:
    """The most layers each stage holds under the loosest of `schedules` (a split is usable when one of them
    fits; 1F1B keeps the fewest activations, so with it allowed its caps are the answer)."""
    p = len(groups)
    if "1f1b" in schedules:
        return [g.max_layers_in_memory(j == 0, j == p - 1, in_flight(j, p, num_microbatches))
                for j, g in enumerate(groups)]
    m = steady_microbatches(p, num_microbatches)
    return [max(min(g.max_layers_in_memory(j == 0, j == p - 1, acts, held)
                    for acts, held in live_counts(s, p, j, m)) for s in schedules)
            for j, g in enumerate(groups)]


def best_split(groups: list[GroupCost], num_layers: int, num_microbatches: int,
               link_s: list[float], schedules: tuple[str, ...] = ONE_F_ONE_B) -> Split | None:
    """The optimal split for these stage groups in this order, or None if the model does not fit under any
    of `schedules`."""
    p = len(groups)
    if p > num_layers:
        return None
    caps = [min(c, num_layers - p + 1) for c in memory_caps(groups, num_microbatches, schedules)]
    if min(caps) < 1 or sum(caps) < num_layers:
        return None
    fixed = [g.stage_time(0, j == 0, j == p - 1) for j, g in enumerate(groups)]
    per = [g.layer_s for g in groups]
    order = sorted(range(p), key=lambda j: per[j])
    links_total, link_max = 2 * sum(link_s), max(link_s, default=0.0)
    bounds = sorted({fixed[j] + n * per[j] for j in range(p) for n in range(1, caps[j] + 1)})
    lo = _first_feasible(bounds, fixed, per, caps, num_layers)
    best: Split | None = None
    lower_sum = _fill(fixed, per, caps, order, num_layers)[1]
    for bound in bounds[lo:]:
        if best is not None and (num_microbatches - 1) * max(bound, link_max) + lower_sum + links_total >= best.time_s:
            break
        bcaps = [min(caps[j], int((bound - fixed[j]) / per[j] + 1e-9)) for j in range(p)]
        if min(bcaps) < 1 or sum(bcaps) < num_layers:
            continue
        counts, total = _fill(fixed, per, bcaps, order, num_layers)
        stage_s = tuple(fixed[j] + counts[j] * per[j] for j in range(p))
        t = (num_microbatches - 1) * steady_period(list(stage_s), link_s) + total + links_total
        if best is None or t < best.time_s - 1e-15:
            best = Split(tuple(counts), stage_s, t, any(c == cap for c, cap in zip(counts, caps)))
    return best


class SplitsByCount:
    """`best_split(groups, num_layers, m, link_s, schedules)` for many m of one pipeline, faster: from p
    micro-batches on the memory caps no longer change with m, so the bounds best_split tries, and the split
    each gives, are worked out once; each m then only ranks them, with best_split's own stopping rule and
    arithmetic (the same result, bit for bit)."""

    def __init__(self, groups: list[GroupCost], num_layers: int, link_s: list[float],
                 schedules: tuple[str, ...] = ONE_F_ONE_B):
        self.groups, self.num_layers, self.link_s, self.schedules = groups, num_layers, link_s, schedules
        p = len(groups)      # from here on the memory caps are those of every larger count (memory_caps)
        self.steady_from = p if "1f1b" in schedules else steady_microbatches(p, STEADY_FROM * p)
        self._steady: tuple | None = None

    def best(self, num_microbatches: int) -> Split | None:
        p = len(self.groups)
        if num_microbatches < self.steady_from or p > self.num_layers:
            return best_split(self.groups, self.num_layers, num_microbatches, self.link_s, self.schedules)
        if self._steady is None:
            self._steady = self._bounds()
        scan, lower_sum, links_total, link_max = self._steady
        best, best_t = None, 0.0
        for bound, candidate in scan:
            if best is not None and \
                    (num_microbatches - 1) * max(bound, link_max) + lower_sum + links_total >= best_t:
                break
            if candidate is None:
                continue
            t = (num_microbatches - 1) * candidate[1] + candidate[2] + links_total
            if best is None or t < best_t - 1e-15:
                best, best_t = candidate, t
        return None if best is None else Split(best[0], best[3], best_t, best[4])

    def _bounds(self) -> tuple:
        """([(bound, (counts, period, sum of stage times, stage times, memory bound) or None)] in the order
        best_split tries them, lower_sum, links_total, link_max), for p micro-batches or more."""
        groups, p, num_layers = self.groups, len(self.groups), self.num_layers
        links_total, link_max = 2 * sum(self.link_s), max(self.link_s, default=0.0)
        caps = [min(c, num_layers - p + 1) for c in memory_caps(groups, self.steady_from, self.schedules)]
        if min(caps) < 1 or sum(caps) < num_layers:
            return [], 0.0, links_total, link_max
        fixed = [g.stage_time(0, j == 0, j == p - 1) for j, g in enumerate(groups)]
        per = [g.layer_s for g in groups]
        order = sorted(range(p), key=lambda j: per[j])
        bounds = sorted({fixed[j] + n * per[j] for j in range(p) for n in range(1, caps[j] + 1)})
        scan = []
        for bound in bounds[_first_feasible(bounds, fixed, per, caps, num_layers):]:
            bcaps = [min(caps[j], int((bound - fixed[j]) / per[j] + 1e-9)) for j in range(p)]
            if min(bcaps) < 1 or sum(bcaps) < num_layers:
                scan.append((bound, None))
                continue
            counts, total = _fill(fixed, per, bcaps, order, num_layers)
            stage_s = tuple(fixed[j] + counts[j] * per[j] for j in range(p))
            scan.append((bound, (tuple(counts), steady_period(list(stage_s), self.link_s), total, stage_s,
                                 any(c == cap for c, cap in zip(counts, caps)))))
        return scan, _fill(fixed, per, caps, order, num_layers)[1], links_total, link_max


def best_splits(groups: list[GroupCost], num_layers: int, max_microbatches: int,
                link_s: list[float], schedules: tuple[str, ...] = ONE_F_ONE_B) -> list[Split | None]:
    """[best_split(groups, num_layers, m, link_s) for m in 1..max_microbatches], faster: from p micro-batches
    on, the memory caps no longer change with m, so the candidate splits (one per bound) are the same for
    every m and only their ranking, (m - 1) * period + sum of stage times, moves with m."""
    p = len(groups)
    out = [best_split(groups, num_layers, m, link_s, schedules) for m in range(1, min(p, max_microbatches + 1))]
    if max_microbatches < p:
        return out
    candidates = _all_candidates(groups, num_layers, p, link_s, schedules)
    if not candidates:
        return out + [None] * (max_microbatches - p + 1)
    periods = np.array([c[1] for c in candidates])
    totals = np.array([c[2] for c in candidates]) + 2 * sum(link_s)
    ms = np.arange(p, max_microbatches + 1)
    times = (ms[:, None] - 1) * periods[None, :] + totals[None, :]
    for m, pick in zip(ms, np.argmin(times, axis=1)):    # first of equal times, as best_split keeps
        counts, period, _, stage_s, bound = candidates[pick]
        out.append(Split(counts, stage_s, float(times[m - p, pick]), bound))
    return out


def _all_candidates(groups, num_layers, num_microbatches, link_s, schedules):
    """(counts, period, sum of stage times, stage times, memory bound) for every bound best_split tries."""
    p = len(groups)
    if p > num_layers:
        return []
    caps = [min(c, num_layers - p + 1) for c in memory_caps(groups, num_microbatches, schedules)]
    if min(caps) < 1 or sum(caps) < num_layers:
        return []
    fixed = [g.stage_time(0, j == 0, j == p - 1) for j, g in enumerate(groups)]
    per = [g.layer_s for g in groups]
    order = sorted(range(p), key=lambda j: per[j])
    bounds = sorted({fixed[j] + n * per[j] for j in range(p) for n in range(1, caps[j] + 1)})
    seen, out = set(), []
    for bound in bounds[_first_feasible(bounds, fixed, per, caps, num_layers):]:
        bcaps = [min(caps[j], int((bound - fixed[j]) / per[j] + 1e-9)) for j in range(p)]
        if min(bcaps) < 1 or sum(bcaps) < num_layers:
            continue
        counts, total = _fill(fixed, per, bcaps, order, num_layers)
        if tuple(counts) in seen:
            continue
        seen.add(tuple(counts))
        stage_s = tuple(fixed[j] + counts[j] * per[j] for j in range(p))
        out.append((tuple(counts), steady_period(list(stage_s), link_s), total, stage_s,
                    any(c == cap for c, cap in zip(counts, caps))))
    return out


def _first_feasible(bounds, fixed, per, caps, num_layers) -> int:
    lo, hi = 0, len(bounds) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        total = sum(min(caps[j], int((bounds[mid] - fixed[j]) / per[j] + 1e-9)) for j in range(len(per)))
        if total >= num_layers:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _fill(fixed, per, caps, order, num_layers) -> tuple[list[int], float]:
    counts = [1] * len(per)
    left = num_layers - len(per)
    for j in order:
        take = min(left, caps[j] - 1)
        counts[j] += take
        left -= take
    assert left == 0
    return counts, sum(fixed[j] + counts[j] * per[j] for j in range(len(per)))
