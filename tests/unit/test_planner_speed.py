"""The planner's speed-ups change no result: the timeline summary against an independent recursive
formulation of the same schedule, the memory screen against the full evaluation, best_schedule against pricing
every schedule, and the cost scan's early stop against the full scan."""
from __future__ import annotations

import random
from functools import lru_cache

import pytest

from autohet_ray.cluster import cluster_from_dict
from autohet_ray.cost.evaluate import best_schedule, evaluate_plan, fits_in_memory
from autohet_ray.cost.money import Goal, Price, Prices
from autohet_ray.cost.terms import GroupCostTable
from autohet_ray.cost.timeline import simulate, simulate_summary
from autohet_ray.model import PRESETS
from autohet_ray.plan.schedule import SCHEDULES
from autohet_ray.planner.candidates.best import _Deadline
from autohet_ray.planner.candidates import money as money_module
from autohet_ray.planner.candidates.grouping import solve_grouping
from autohet_ray.planner.candidates.money import cheapest_groupings, grouping_money
from autohet_ray.planner.candidates.per_size import _shortlist, enumerate_templates
from autohet_ray.planner.search import plan_training
from autohet_ray.planner.candidates.split import SplitsByCount, best_split
from autohet_ray.profile import analytic_profile


def _reference(fwd, bwd, links, back, m, schedule, wgrad):
    """{(stage, kind, micro-batch): (start, end)} by recursion: an action starts when its stage's previous
    action ended and its input arrived; a link carries one message at a time per direction, in the order its
    sender produces them."""
    p = len(fwd)
    orders = [[(a.kind, a.microbatch) for a in SCHEDULES[schedule](p, j, m)] for j in range(p)]
    index = [{a: n for n, a in enumerate(o)} for o in orders]
    duration = {"F": fwd, "B": bwd, "W": wgrad}

    @lru_cache(maxsize=None)
    def end(j, n):
        kind, i = orders[j][n]
        before = end(j, n - 1) if n else 0.0
        if kind == "F":
            ready = arrival("F", j - 1, i) if j else 0.0
        elif kind == "B":
            ready = end(j, index[j][("F", i)]) if j == p - 1 else arrival("B", j + 1, i)
        else:
            ready = 0.0
        return max(before, ready) + duration[kind][j]

    @lru_cache(maxsize=None)
    def arrival(kind, sender, i):
        """When the message of `kind` for micro-batch i from stage `sender` arrives at its neighbour."""
        sends = [mb for k, mb in orders[sender] if k == kind]
        k = sends.index(i)
        free = arrival(kind, sender, sends[k - 1]) if k else 0.0
        wire = links[sender] if kind == "F" else back[sender - 1]
        return max(end(sender, index[sender][(kind, i)]), free) + wire

    return {(j, *orders[j][n]): (end(j, n) - duration[orders[j][n][0]][j], end(j, n))
            for j in range(p) for n in range(len(orders[j]))}


@pytest.mark.parametrize("seed", range(4))
def test_timeline_matches_an_independent_recursive_formulation(seed):
    rng = random.Random(seed)
    for _ in range(60):
        p, m = rng.randint(1, 6), rng.randint(1, 12)
        schedule = rng.choice(["1f1b", "zb-h1", "gpipe"])
        fwd = [rng.uniform(0.1, 2) for _ in range(p)]
        bwd = [rng.uniform(0.1, 3) for _ in range(p)]
        wgrad = [rng.uniform(0, 1) for _ in range(p)] if schedule == "zb-h1" else None
        links = [rng.choice([0.0, rng.uniform(0, 1)]) for _ in range(p - 1)]
        back = [rng.uniform(0, 1) for _ in range(p - 1)]
        want = _reference(fwd, bwd, links, back, m, schedule, wgrad)
        slots = simulate(fwd, bwd, links, m, schedule, wgrad, back)
        got = {(s.stage, s.kind, s.microbatch): (s.start_s, s.end_s) for s in slots}
        assert sorted(got) == sorted(want)
        assert [x for key in sorted(got) for x in got[key]] == pytest.approx([x for key in sorted(want)
                                                                              for x in want[key]])
        summary = simulate_summary(tuple(fwd), tuple(bwd), tuple(links), m, schedule,
                                   None if wgrad is None else tuple(wgrad), tuple(back))
        assert summary.end_s == pytest.approx(max(end for _, end in want.values()))
        kind = "W" if wgrad is not None else "B"
        for j, slot in enumerate(summary.last_gradient):
            assert (slot.start_s, slot.end_s) == pytest.approx(want[(j, kind, m - 1)])


def _cluster(nodes, spot_first=False):
    return cluster_from_dict({"name": "t", "network": {"inter_node_gbps": 100},
                              "nodes": [{"name": f"n{i}", "device": d, "count": c, "spot": spot_first and i == 0}
                                        for i, (d, c) in enumerate(nodes)]})


def _planned(nodes, model_name):
    cluster, model = _cluster(nodes), PRESETS[model_name]
    profile = analytic_profile(model, cluster, model.max_seq_len, micro_batches=(1, 2, 4))
    return cluster, model, profile


@pytest.mark.parametrize("nodes,model_name,batch,some_do_not_fit", [
    ((("A100-40GB", 2), ("V100", 2)), "llama-7b", 16, True),
    ((("H800", 2), ("H20", 2)), "gpt3-6.7b", 32, True),
    ((("L40S", 4),), "llama-7b", 32, False),
])
def test_memory_screen_and_best_schedule_agree_with_the_full_evaluation(nodes, model_name, batch, some_do_not_fit):
    cluster, model, profile = _planned(nodes, model_name)
    plan = plan_training(cluster=cluster, model=model, profile=profile, global_batch=batch,
                         seq_len=model.max_seq_len, recompute="auto", time_limit_s=30).plan
    fits_seen = set()
    for variant in (plan, plan.with_recompute(False), plan.with_recompute(True)):
        priced = []
        for schedule in ("1f1b", "zb-h1"):
            candidate = variant.with_schedule(schedule)
            ev = evaluate_plan(candidate, cluster, model, profile)
            assert fits_in_memory(candidate, cluster, model, profile) == ev.feasible
            fits_seen.add(ev.feasible)
            priced.append((candidate, ev))
        fitting = [e for e in priced if e[1].feasible]
        want = min(fitting, key=lambda e: e[1].iteration_time_s) if fitting else priced[0]
        got = best_schedule(variant, cluster, model, profile)
        assert got[0] == want[0] and got[1].iteration_time_s == want[1].iteration_time_s
        assert got[1].feasible == want[1].feasible
    assert fits_seen == ({True, False} if some_do_not_fit else {True})


PRICES = Prices.of_gpus({"A100-80GB": Price(on_demand=5.12, spot=2.05), "H20": Price(on_demand=5.12, spot=2.05),
                         "H800": Price(on_demand=12.29, spot=4.92)})


@pytest.mark.parametrize("keep", [1, 6])
def test_the_cost_scan_stops_early_only_where_nothing_kept_could_change(keep, monkeypatch):
    cluster = _cluster((("H800", 8), ("A100-80GB", 8), ("H20", 8)), spot_first=True)
    model = PRESETS["llama-7b"]
    profile = analytic_profile(model, cluster, model.max_seq_len, micro_batches=(2,))
    table = GroupCostTable(model=model, cluster=cluster, profile=profile, micro_batch=2, seq_len=model.max_seq_len)
    clock = _Deadline(0.0, float("inf"))
    shortlist = _shortlist(enumerate_templates(table, cluster, 128, clock))
    money = grouping_money(Goal(objective="cost", prices=PRICES), cluster)
    fastest = min(t.fixed_s + 127 * t.bottleneck_s for t in shortlist) / 4
    solves = []
    monkeypatch.setattr(money_module, "solve_grouping", lambda *a, **k: solves.append(a[3]) or solve_grouping(*a, **k))
    full = cheapest_groupings(shortlist, cluster, 128, money, fastest, lambda: 60.0)
    scanned = len(solves)
    early = cheapest_groupings(shortlist, cluster, 128, money, fastest, lambda: 60.0, keep=keep)
    assert len(full) > keep and len(solves) - scanned < scanned          # it did stop early
    assert [(g.counts, g.deadline_s) for g in early] == [(g.counts, g.deadline_s) for g in full[:keep]]


@pytest.mark.parametrize("model_name,micro_batch,recompute", [("llama-13b", 1, False), ("gpt3-6.7b", 2, True),
                                                               ("llama-7b", 4, False)])
def test_splits_by_count_equal_best_split_for_every_count(model_name, micro_batch, recompute):
    cluster = _cluster((("A100-80GB", 8), ("H20", 8), ("V100", 8), ("H800", 8)))
    model = PRESETS[model_name]
    profile = analytic_profile(model, cluster, model.max_seq_len, micro_batches=(micro_batch,))
    table = GroupCostTable(model=model, cluster=cluster, profile=profile, micro_batch=micro_batch,
                           seq_len=model.max_seq_len, recompute=recompute)
    kinds = [(d, t) for d in ("A100-80GB", "H20", "V100", "H800") for t in (1, 2, 4)]
    rng, found = random.Random(7), 0
    for _ in range(12):
        groups = [table.get(*rng.choice(kinds)) for _ in range(rng.randint(1, 8))]
        links = [rng.uniform(0, 0.01) for _ in groups[1:]]
        for schedules in (("1f1b", "zb-h1"), ("zb-h1",)):
            splits = SplitsByCount(groups, model.num_layers, links, schedules)
            for m in [*range(1, 40), 64, 255, 1024]:
                want = best_split(groups, model.num_layers, m, links, schedules)
                assert splits.best(m) == want
                found += want is not None
    assert found > 500


def test_memory_is_priced_on_a_schedule_short_enough_to_hold_every_state():
    from autohet_ray.cost.evaluate import REPEATING_SCHEDULES, SAME_MEMORY_FROM
    from autohet_ray.cost.memory import live_counts
    assert "gpipe" not in REPEATING_SCHEDULES
    for schedule in ("1f1b", "zb-h1", "gpipe"):
        for p in (1, 2, 3, 5, 8, 13, 16):
            for j in range(p):
                for m in (SAME_MEMORY_FROM * p, SAME_MEMORY_FROM * p + 1, 3 * SAME_MEMORY_FROM * p + 5, 300):
                    short = min(m, SAME_MEMORY_FROM * p)
                    if schedule == "gpipe":     # every forward before any backward: no steady pattern
                        assert short == m or live_counts(schedule, p, j, short) != live_counts(schedule, p, j, m)
                    else:
                        assert live_counts(schedule, p, j, short) == live_counts(schedule, p, j, m), (p, j, m)
