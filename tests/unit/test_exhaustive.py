"""The exhaustive searcher (tests/exhaustive.py) against a naive brute force that prunes nothing."""
import itertools
import math
from dataclasses import replace

import pytest

from autohet_ray.cluster import cluster_from_dict
from autohet_ray.cost import evaluate_plan
from autohet_ray.cost.money import Goal, Price, Prices, cluster_usd_per_hour
from autohet_ray.model import PRESETS
from autohet_ray.plan.schema import Pipeline, Plan, Stage
from autohet_ray.profile import analytic_profile
from exhaustive import exhaustive_best


def _cluster(*nodes, gbps=200):
    return cluster_from_dict({"name": "tiny", "network": {"inter_node_gbps": gbps},
                              "nodes": [{"name": f"n{i}", "device": d, "count": c} for i, (d, c) in enumerate(nodes)]})


def _node_groups(node, model, profile, mb):
    """Every ordered list of power-of-two group sizes on a node (repeats allowed), with total <= count."""
    sizes = [t for t in (1, 2, 4, 8) if t <= node.count and model.valid_tp(t) and profile.has(node.device, t, mb)]
    out = [[]]
    frontier = [[]]
    while frontier:
        grown = [g + [t] for g in frontier for t in sizes if sum(g) + t <= node.count]
        out += grown
        frontier = grown
    return out


def _partitions(items):
    if not items:
        yield []
        return
    for rest in _partitions(items[1:]):
        for i in range(len(rest)):
            yield rest[:i] + [[items[0]] + rest[i]] + rest[i + 1:]
        yield [[items[0]]] + rest


def _splits(total, parts):
    return [c for c in itertools.product(range(1, total + 1), repeat=parts) if sum(c) == total]


def naive_best(cluster, model, profile, batch, micro_batches, schedules, recompute=(False,), goal=None,
               shard=(False,)):
    """The fastest plan's time (with `goal`: the least goal key, cost/money.py); `recompute` and `shard`: the
    recompute and shard-optimizer flags each stage may take."""
    options = list(itertools.product(recompute, shard))
    best = None
    for schedule, mb in itertools.product(schedules, micro_batches):
        if batch % mb:
            continue
        for per_node in itertools.product(*[_node_groups(n, model, profile, mb) for n in cluster.nodes]):
            groups = []
            for node, sizes in zip(cluster.nodes, per_node):
                start = 0
                for t in sizes:
                    groups.append((node, tuple(range(start, start + t))))
                    start += t
            if not groups:
                continue
            for part in _partitions(groups):
                if len(part) > batch // mb:
                    continue
                orders = [list(itertools.permutations(block)) for block in part]
                for chosen in itertools.product(*orders):
                    if any(len(o) > model.num_layers for o in chosen):
                        continue
                    layer_splits = [_splits(model.num_layers, len(o)) for o in chosen]
                    flag_sets = [list(itertools.product(options, repeat=len(o))) for o in chosen]
                    for counts, flags in itertools.product(itertools.product(*layer_splits),
                                                           itertools.product(*flag_sets)):
                        for alloc in _splits(batch // mb, len(part)):
                            plan = _plan(model, batch, mb, schedule, chosen, counts, alloc, flags)
                            ev = evaluate_plan(plan, cluster, model, profile)
                            if not ev.feasible:
                                continue
                            key = goal.key(plan, cluster, ev.iteration_time_s) if goal else ev.iteration_time_s
                            if key < (math.inf if best is None else best):
                                best = key
    return best


def _plan(model, batch, mb, schedule, orders, counts, alloc, flags):
    pipelines = []
    for order, split, m, stage_flags in zip(orders, counts, alloc, flags):
        stages, start = [], 0
        for (node, gpus), n, (flag, shard) in zip(order, split, stage_flags):
            stages.append(Stage(layers=(start, start + n), tp=len(gpus), device_type=node.device, node=node.name,
                                devices=gpus, recompute=flag, shard_optimizer=shard))
            start += n
        pipelines.append(Pipeline(num_microbatches=m, stages=tuple(stages)))
    return Plan(model=model.name, global_batch=batch, micro_batch=mb, seq_len=model.max_seq_len,
                pipelines=tuple(pipelines), schedule=schedule)


CASES = [  # (nodes, model, layers, batch, micro-batches, schedules): 3 GPUs, so that the brute force finishes
    ((("H800", 2), ("H20", 1)), "gpt3-1.3b", 6, 8, (1, 2), ("1f1b", "zb-h1")),
    ((("A100-40GB", 1), ("V100", 1), ("H20", 1)), "llama-13b", 6, 6, (1,), ("1f1b",)),   # memory binds
    ((("H100", 1), ("L40S", 2)), "bert-large", 6, 8, (1, 2), ("zb-h1",)),
    ((("A100-40GB", 2), ("RTX-4090", 1)), "llama-13b", 5, 6, (1,), ("1f1b", "zb-h1")),  # memory binds, TP2
]


@pytest.mark.parametrize("nodes, name, layers, batch, mbs, schedules", CASES)
def test_exhaustive_search_matches_naive_brute_force(nodes, name, layers, batch, mbs, schedules):
    cluster, model = _cluster(*nodes), replace(PRESETS[name], num_layers=layers)
    profile = analytic_profile(model, cluster, model.max_seq_len, micro_batches=mbs)
    expected = naive_best(cluster, model, profile, batch, mbs, schedules)
    found = exhaustive_best(cluster, model, profile, batch, model.max_seq_len, list(mbs), schedules=schedules)
    assert expected is not None and found is not None
    plan, ev = found
    assert ev.iteration_time_s == pytest.approx(expected, rel=1e-12)
    again = evaluate_plan(plan, cluster, model, profile)
    assert again.feasible and again.iteration_time_s == pytest.approx(ev.iteration_time_s, rel=1e-12)
    assert plan.schedule in schedules


def test_exhaustive_search_reports_none_when_nothing_fits():
    cluster, model = _cluster(("V100", 1)), replace(PRESETS["llama-13b"], num_layers=8)
    profile = analytic_profile(model, cluster, model.max_seq_len, micro_batches=(1,))
    assert exhaustive_best(cluster, model, profile, 4, model.max_seq_len, [1]) is None


def test_mixed_micro_batches_never_lose_to_one_size():
    cluster, model = _cluster(("H800", 1), ("A10", 1)), replace(PRESETS["gpt3-1.3b"], num_layers=4)
    profile = analytic_profile(model, cluster, model.max_seq_len, micro_batches=(1, 2))
    one = exhaustive_best(cluster, model, profile, 6, model.max_seq_len, [1, 2])
    mixed = exhaustive_best(cluster, model, profile, 6, model.max_seq_len, [1, 2], mixed_micro_batches=True)
    assert mixed[1].iteration_time_s <= one[1].iteration_time_s
    assert sum(mixed[0].samples_of(k) for k in range(len(mixed[0].pipelines))) == 6


def test_exhaustive_search_with_recomputation_matches_naive_brute_force():
    """Each stage with or without recomputation: at 40k tokens the A100-40GB + 2 V100 mix fits llama-7b only
    with it on some stage."""
    cluster = _cluster(("A100-40GB", 1), ("V100", 2))
    model = replace(PRESETS["llama-7b"], num_layers=8, max_seq_len=40960)
    profile = analytic_profile(model, cluster, model.max_seq_len, micro_batches=(1,))
    assert naive_best(cluster, model, profile, 2, (1,), ("1f1b",)) is None
    expected = naive_best(cluster, model, profile, 2, (1,), ("1f1b",), recompute=(False, True))
    plan, ev = exhaustive_best(cluster, model, profile, 2, model.max_seq_len, [1], schedules=("1f1b",),
                               recompute="auto")
    assert expected is not None and ev.iteration_time_s == pytest.approx(expected, rel=1e-12)
    assert any(s.recompute for p in plan.pipelines for s in p.stages)
    assert exhaustive_best(cluster, model, profile, 2, model.max_seq_len, [1], schedules=("1f1b",)) is None


_PRICES = Prices.of_gpus({"H800": Price(on_demand=12.29, spot=4.92), "H20": Price(on_demand=5.12, spot=2.05),
                          "A100-40GB": Price(on_demand=4.09, spot=1.64), "V100": Price(on_demand=3.06, spot=1.22),
                          "H100": Price(on_demand=12.29, spot=4.92), "L40S": Price(on_demand=3.77, spot=1.51)})
GOALS = {"cost": dict(objective="cost"), "budget": dict(max_usd_per_hour=0.6),     # of all the nodes' $/hour
         "floor": dict(min_samples_per_s=0.05)}                                          # of the fastest plan's
# CASES[0] with the single H20 first (on spot): its 2-GPU H800 node, billed whole, is what the goals weigh
MONEY_CASES = [((("H20", 1), ("H800", 2)), *CASES[0][1:]), CASES[1], CASES[2]]


@pytest.mark.parametrize("goal", list(GOALS))
@pytest.mark.parametrize("case", [0, 1, 2])
def test_exhaustive_search_matches_naive_brute_force_for_money_goals(case, goal):
    """The goal's key ($ per iteration, or seconds within a budget / above a floor) over every plan, every
    subset of GPUs included, each node billed whole; the first node is on spot."""
    nodes, name, layers, batch, mbs, schedules = MONEY_CASES[case]
    cluster = cluster_from_dict({"name": "tiny", "network": {"inter_node_gbps": 200},
                                 "nodes": [{"name": f"n{i}", "device": d, "count": c, "spot": i == 0}
                                           for i, (d, c) in enumerate(nodes)]})
    model = replace(PRESETS[name], num_layers=layers)
    profile = analytic_profile(model, cluster, model.max_seq_len, micro_batches=mbs)
    fastest = naive_best(cluster, model, profile, batch, mbs, schedules)
    share = GOALS[goal]
    goal = Goal(prices=_PRICES, **{k: (v if k == "objective" else v * (
        cluster_usd_per_hour(cluster, _PRICES) if k == "max_usd_per_hour" else batch / fastest))
        for k, v in share.items()})
    expected = naive_best(cluster, model, profile, batch, mbs, schedules, goal=goal)
    found = exhaustive_best(cluster, model, profile, batch, model.max_seq_len, list(mbs), schedules=schedules,
                            goal=goal)
    assert expected is not None and found is not None
    plan, ev = found
    assert goal.key(plan, cluster, ev.iteration_time_s) == pytest.approx(expected, rel=1e-12)
    assert ev.iteration_time_s > fastest * (1 + 1e-9)      # the goal binds: the fastest plan is not its answer


@pytest.mark.parametrize("nodes", [(("V100-16GB", 2),), (("V100-16GB", 1), ("A10", 1))])
def test_exhaustive_search_with_optimizer_sharding_matches_naive_brute_force(nodes):
    """Each stage with or without sharded optimizer state: on 2 V100-16GB, gpt3-2.7b cut to 8 layers fits one
    copy per GPU (data parallel, no bubble) only sharded across the two."""
    cluster = _cluster(*nodes)
    model = replace(PRESETS["gpt3-2.7b"], num_layers=8, max_seq_len=2048)
    profile = analytic_profile(model, cluster, 2048, micro_batches=(1,))
    plain = naive_best(cluster, model, profile, 4, (1,), ("1f1b", "zb-h1"))
    expected = naive_best(cluster, model, profile, 4, (1,), ("1f1b", "zb-h1"), shard=(False, True))
    plan, ev = exhaustive_best(cluster, model, profile, 4, 2048, [1], schedules=("1f1b", "zb-h1"),
                               optimizer_sharding="auto")
    assert ev.iteration_time_s == pytest.approx(expected, rel=1e-12)
    assert evaluate_plan(plan, cluster, model, profile).iteration_time_s == pytest.approx(expected, rel=1e-12)
    if len(nodes) == 1:                      # sharding makes the fastest plan: two pipelines, sharded
        assert expected < plain * (1 - 1e-3)
        assert len(plan.pipelines) == 2 and any(s.shard_optimizer for p in plan.pipelines for s in p.stages)
