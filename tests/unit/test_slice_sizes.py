"""Uneven slices of sharded optimizer state: the plan field (JSON, validation), their pricing (memory per holder
at its own slice, collectives at the widest slice) and the planner's post-pass that sizes them by headroom."""
import json
import math

import pytest

from autohet_ray import ConfigError
from autohet_ray.cluster import cluster_from_dict
from autohet_ray.cost import evaluate_plan
from autohet_ray.cost.sharding import shard_ways, sharded_buckets, slice_share, widest_slice_factor
from autohet_ray.cost.sync import sync_buckets
from autohet_ray.model import PRESETS
from autohet_ray.model.costs import layer_params
from autohet_ray.plan import Pipeline, Plan, Stage
from autohet_ray.plan.schema import plan_from_dict, plan_from_json
from autohet_ray.planner.passes.slice_sizes import headroom_weights, size_slices
from autohet_ray.profile import analytic_profile

SMALL = PRESETS["small-gpt"]             # 8 layers, hidden 128, seq 64
DEVICE = {"bf16_tflops": 100, "fp32_tflops": 10, "hbm_gbps": 1000, "link_gbps": 200, "link_kind": "nvlink",
          "nic_gbps": 100}
RESERVE_GB = 2.0                         # cost/terms.MEMORY_RESERVE_BYTES
PARAMS = 8 * layer_params(SMALL, "layer") + layer_params(SMALL, "embedding") + layer_params(SMALL, "head")
SLICE_BYTES = 12                         # bf16: fp32 master and two moments per parameter


def _cluster(small_gb: float, large_gb: float = 40.0):
    return cluster_from_dict({"name": "t", "network": {"inter_node_gbps": 100},
                              "devices": {"S": DEVICE | {"memory_gb": small_gb}, "L": DEVICE | {"memory_gb": large_gb}},
                              "nodes": [{"name": "s", "device": "S", "count": 1},
                                        {"name": "l", "device": "L", "count": 1}]})


def _plan(weights=(1.0, 1.0)) -> Plan:
    """Two single-stage pipelines holding the whole model, every unit sharded between them."""
    def stage(node, device, w):
        return Stage(layers=(0, 8), tp=1, device_type=device, node=node, devices=(0,), shard_optimizer=True,
                     slice_weight=w)
    return Plan(model=SMALL.name, model_spec=SMALL.to_dict(), global_batch=8, micro_batch=1, seq_len=64,
                pipelines=(Pipeline(num_microbatches=4, stages=(stage("s", "S", weights[0]),)),
                           Pipeline(num_microbatches=4, stages=(stage("l", "L", weights[1]),))))


def test_slice_weight_round_trips_through_json_and_equal_slices_are_not_written():
    plan = _plan((0.25, 1.0))
    again = plan_from_json(plan.to_json())
    assert again.slice_weights() == ((0.25,), (1.0,))
    stages = json.loads(plan.to_json())["pipelines"]
    assert stages[0]["stages"][0]["slice_weight"] == 0.25 and "slice_weight" not in stages[1]["stages"][0]


@pytest.mark.parametrize("bad", [0, -1.5, "big", True, math.inf, float("nan")])
def test_a_bad_slice_weight_is_named_with_what_is_valid(bad):
    raw = _plan().to_dict()
    raw["pipelines"][1]["stages"][0]["slice_weight"] = bad
    with pytest.raises(ConfigError, match=r"pipelines\[1\]\.stages\[0\]\.slice_weight=.* must be a finite number > 0"):
        plan_from_dict(raw)


def test_memory_follows_each_holders_own_slice():
    """Weights 1:3: the small GPU keeps a quarter of the state, the large three quarters, so their peaks differ
    from the equal-slice ones by -1/4 and +1/4 of the 12 bytes per parameter (hand computation)."""
    cluster = _cluster(40.0)
    profile = analytic_profile(SMALL, cluster, 64)
    equal, uneven = (evaluate_plan(p, cluster, SMALL, profile) for p in (_plan(), _plan((1.0, 3.0))))
    assert slice_share(_plan((1.0, 3.0)), 0, 0, 4) == 0.25
    assert shard_ways(_plan((1.0, 3.0)), 0, 0, SMALL) == pytest.approx(4.0)
    assert shard_ways(_plan((1.0, 3.0)), 1, 0, SMALL) == pytest.approx(4 / 3)
    delta = SLICE_BYTES * PARAMS * (0.5 - 0.25)
    assert uneven.memory_bytes["s:0"] == pytest.approx(equal.memory_bytes["s:0"] - delta, abs=2)
    assert uneven.memory_bytes["l:0"] == pytest.approx(equal.memory_bytes["l:0"] + delta, abs=2)


def test_collectives_take_what_the_widest_slice_implies():
    """The runtime pads each slice to the largest: 2 holders at 1:3 move 2 x 3/4 = 1.5 times the bytes of
    equal halves, in the reduce-scatter and in the all-gather."""
    cluster = _cluster(40.0)
    profile = analytic_profile(SMALL, cluster, 64)
    plan, uneven = _plan(), _plan((1.0, 3.0))
    assert widest_slice_factor(uneven, ((0, 0), (1, 0))) == 1.5
    buckets = sync_buckets(plan, cluster, SMALL, profile)
    (eq_buckets, eq_gather), (un_buckets, un_gather) = (sharded_buckets(p, buckets, profile) for p in (plan, uneven))
    for key in eq_buckets:
        for (_, a, _), (_, b, _) in zip(eq_buckets[key], un_buckets[key]):
            assert b == pytest.approx(1.5 * a)
        assert un_gather[key] == pytest.approx(1.5 * eq_gather[key])


def _tight_cluster():
    """Usable memory: each GPU's peak without slices plus 4 (small) and 12 (large) bytes per parameter. Equal
    slices (6 bytes each) do not fit on the small GPU; slices by headroom (a quarter there) do."""
    loose = _cluster(40.0)
    ev = evaluate_plan(_plan(), loose, SMALL, analytic_profile(SMALL, loose, 64))
    without = {d: ev.memory_bytes[d] - SLICE_BYTES * PARAMS / 2 for d in ("s:0", "l:0")}
    return _cluster(RESERVE_GB + (without["s:0"] + 4 * PARAMS) / 1e9,
                    RESERVE_GB + (without["l:0"] + 12 * PARAMS) / 1e9), without["s:0"]


def test_post_pass_gives_less_headroom_a_smaller_slice_and_makes_the_plan_fit():
    cluster, without_slices = _tight_cluster()
    profile = analytic_profile(SMALL, cluster, 64)
    plan = _plan()
    equal = evaluate_plan(plan, cluster, SMALL, profile)
    assert not equal.feasible and "out of memory on s:0" in equal.reason
    sized, ev = size_slices(plan, equal, cluster, SMALL, profile)
    assert ev.feasible, ev.reason
    # hand computation: each weight is headroom / parameters, headroom 4 and 12 bytes per parameter: the small
    # GPU keeps 4 / (4 + 12) of every unit's state (3 bytes per parameter, in its 4)
    share = 4 / (4 + 12)
    assert slice_share(sized, 0, 0, 0) == pytest.approx(share, rel=1e-3)
    assert sized.slice_weights()[0][0] < sized.slice_weights()[1][0] == 1.0
    assert ev.memory_bytes["s:0"] == pytest.approx(without_slices + SLICE_BYTES * PARAMS * share, rel=1e-4)
    assert ev.memory_bytes["s:0"] <= ev.capacity_bytes["s:0"]


def test_post_pass_keeps_equal_slices_when_they_fit_and_uneven_ones_are_slower():
    """Both GPUs with room to spare: uneven slices would only pad the collectives."""
    cluster = _cluster(40.0, 80.0)
    profile = analytic_profile(SMALL, cluster, 64)
    plan = _plan()
    ev = evaluate_plan(plan, cluster, SMALL, profile)
    assert headroom_weights(plan, ev, SMALL, profile) != plan.slice_weights()     # there was a choice
    sized, kept = size_slices(plan, ev, cluster, SMALL, profile)
    assert sized is plan and kept is ev


def test_plan_table_shows_each_stages_share_under_uneven_slices():
    from autohet_ray.cli.plan import plan_table
    from autohet_ray.cost.sharding import saved_bytes
    cluster = _cluster(40.0)
    profile = analytic_profile(SMALL, cluster, 64)
    for weights, notes in (((1.0, 3.0), ["keeps 25% (uneven slices)", "keeps 75% (uneven slices)"]),
                           ((1.0, 1.0), ["sharded 2-way", "sharded 2-way"])):
        plan = _plan(weights)
        rows = plan_table(plan, evaluate_plan(plan, cluster, SMALL, profile).memory_bytes,
                          saved_bytes(plan, cluster, SMALL, profile)).splitlines()[2:]   # header, legend
        assert [note in row for note, row in zip(notes, rows)] == [True, True]
        assert all(("uneven" in row) == (weights != (1.0, 1.0)) for row in rows)
