"""The planner's exact sub-solvers against brute force."""
import itertools
import random

import pytest

from autohet_ray.cost.pipeline import one_f_one_b_time
from autohet_ray.cost.terms import GroupCost
from autohet_ray.planner.batch import allocate_microbatches
from autohet_ray.planner.split import best_split


def _group(layer_s, embed_s=0.1, head_s=0.3, capacity=10**12, layer_params=1000.0, act=10):
    return GroupCost(device_type="X", tp=1, layer_s=layer_s, embed_s=embed_s, head_s=head_s, layer_fwd_fraction=1 / 3,
                     layer_params=layer_params, embed_params=500.0, head_params=500.0, layer_act_bytes=act,
                     embed_act_bytes=act, head_act_bytes=act, capacity_bytes=capacity, hbm_Bps=1e12)


def _compositions(n, parts):
    for cut in itertools.combinations(range(1, n), parts - 1):
        edges = (0,) + cut + (n,)
        yield tuple(b - a for a, b in zip(edges, edges[1:]))


def _brute_split(groups, layers, m, links):
    best = None
    p = len(groups)
    for counts in _compositions(layers, p):
        mems = [g.stage_memory(n, j == 0, j == p - 1, min(p - j, m)) for j, (g, n) in enumerate(zip(groups, counts))]
        if any(mem > g.capacity_bytes for mem, g in zip(mems, groups)):
            continue
        t = one_f_one_b_time([g.stage_time(n, j == 0, j == p - 1) for j, (g, n) in enumerate(zip(groups, counts))],
                             links, m)
        best = t if best is None else min(best, t)
    return best


@pytest.mark.parametrize("seed", range(40))
def test_split_matches_brute_force(seed):
    rng = random.Random(seed)
    p, layers, m = rng.randint(1, 4), rng.randint(4, 12), rng.randint(1, 10)
    cap = rng.choice([10**12, 18000 * 4 + 200])      # sometimes memory binds
    groups = [_group(rng.uniform(0.1, 1.0), capacity=cap) for _ in range(p)]
    links = [rng.uniform(0, 0.3) for _ in range(p - 1)]
    got = best_split(groups, layers, m, links)
    want = _brute_split(groups, layers, m, links)
    if want is None:
        assert got is None
    else:
        assert got is not None and got.time_s == pytest.approx(want, rel=1e-9)
        assert sum(got.counts) == layers and min(got.counts) >= 1


@pytest.mark.parametrize("seed", range(30))
def test_microbatch_allocation_matches_brute_force(seed):
    rng = random.Random(seed)
    k, total = rng.randint(1, 4), rng.randint(4, 12)
    slopes = [rng.uniform(0.5, 3) for _ in range(k)]
    offsets = [rng.uniform(0, 5) for _ in range(k)]
    fns = [lambda m, a=a, b=b: a * m + b for a, b in zip(slopes, offsets)]
    got = allocate_microbatches(fns, total)
    want = min(max(f(m) for f, m in zip(fns, counts)) for counts in _compositions(total, k))
    assert sum(got) == total and max(f(m) for f, m in zip(fns, got)) == pytest.approx(want)
    assert allocate_microbatches(fns, k - 1) is None
