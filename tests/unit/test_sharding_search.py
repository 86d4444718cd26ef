"""The sharded search's holders ladder (planner/passes/sharding.py), checked against a brute force of its own.

Eight one-GPU nodes and a two-layer model: a pipeline has one or two stages, and a plan with K pipelines keeps
(master + moments) / K on each stage. Memory is set so that only four pipelines of two stages fit: two
holders (what the search assumed before the ladder) leave too much state per stage, three pipelines likewise,
and one-stage pipelines hold the whole model."""
import itertools

import pytest

from autohet_ray import ConfigError
from autohet_ray.cluster import cluster_from_dict
from autohet_ray.cost.evaluate import best_schedule
from autohet_ray.model.spec import model_from_dict
from autohet_ray.plan import Pipeline, Plan, Stage
from autohet_ray.planner.search import plan_training
from autohet_ray.planner.passes.sharding import way_ladder
from autohet_ray.profile import analytic_profile

MODEL = model_from_dict({"name": "wide2", "family": "gpt", "num_layers": 2, "hidden": 2048, "num_heads": 16,
                         "num_kv_heads": 16, "ffn_hidden": 8192, "vocab_size": 4096, "max_seq_len": 64})
DEVICE = {"bf16_tflops": 100, "fp32_tflops": 10, "hbm_gbps": 1000, "link_gbps": 200, "link_kind": "nvlink",
          "nic_gbps": 100}
GPUS, BATCH, SEQ, MICRO_BATCHES = 8, 4, 64, (1, 2, 4)


def _cluster(memory_gb: float):
    return cluster_from_dict({"name": "t", "network": {"inter_node_gbps": 100},
                              "devices": {"X": DEVICE | {"memory_gb": memory_gb}},
                              "nodes": [{"name": f"n{i}", "device": "X", "count": 1} for i in range(GPUS)]})


def _plan(stage_counts, allocation, mb, shard) -> Plan:
    """Pipelines of 1 or 2 stages (one GPU each, on their own nodes), `allocation` micro-batches each."""
    nodes, pipelines = iter(range(GPUS)), []
    for stages, m in zip(stage_counts, allocation):
        cuts = [(0, 2)] if stages == 1 else [(0, 1), (1, 2)]
        pipelines.append(Pipeline(num_microbatches=m, stages=tuple(
            Stage(layers=c, tp=1, device_type="X", node=f"n{next(nodes)}", devices=(0,), shard_optimizer=shard)
            for c in cuts)))
    return Plan(model=MODEL.name, model_spec=MODEL.to_dict(), cluster="t", global_batch=BATCH, micro_batch=mb,
                seq_len=SEQ, pipelines=tuple(pipelines))


def _compositions(total, parts):
    for cut in itertools.combinations(range(1, total), parts - 1):
        yield [b - a for a, b in zip((0, *cut), (*cut, total))]


def brute_force(cluster, profile, shard: bool):
    """Every plan of this space (pipeline count, stages per pipeline, micro-batch size, allocation, schedule),
    every stage sharded or none: the fastest feasible (plan, evaluation), or None."""
    best = None
    for mb in MICRO_BATCHES:
        total = BATCH // mb
        for k in range(1, min(GPUS, total) + 1):
            for counts in itertools.combinations_with_replacement((2, 1), k):
                if sum(counts) > GPUS:
                    continue
                for allocation in _compositions(total, k):
                    plan, ev = best_schedule(_plan(counts, allocation, mb, shard), cluster, MODEL, profile)
                    if ev.feasible and (best is None or ev.iteration_time_s < best[1].iteration_time_s):
                        best = (plan, ev)
    return best


def _peak(cluster, profile, pipelines: int) -> int:
    """Least peak memory of `pipelines` sharded two-stage pipelines over micro-batch sizes and schedules."""
    peaks = []
    for mb in MICRO_BATCHES:
        total = BATCH // mb
        if total >= pipelines:
            allocation = next(_compositions(total, pipelines))
            _, ev = best_schedule(_plan((2,) * pipelines, allocation, mb, True), cluster, MODEL, profile)
            peaks.append(max(ev.memory_bytes.values()))
    return min(peaks)


@pytest.fixture(scope="module")
def tight():
    """The cluster with memory between what four and three sharded pipelines need, and its profile."""
    roomy = _cluster(1000.0)
    profile = analytic_profile(MODEL, roomy, SEQ)
    four, three = _peak(roomy, profile, 4), _peak(roomy, profile, 3)
    assert four < three
    cluster = _cluster(2.0 + (four + three) / 2 / 1e9)           # 2 GB: the reserve (cost/terms.py)
    return cluster, analytic_profile(MODEL, cluster, SEQ)


def test_ladder_goes_to_the_most_pipelines_possible():
    assert way_ladder(24, 256) == [2, 4, 8, 16]
    assert way_ladder(8, 4) == [2, 4]
    assert way_ladder(1, 64) == []


def test_only_four_sharded_pipelines_fit_and_the_planner_finds_the_brute_force_best(tight):
    cluster, profile = tight
    assert brute_force(cluster, profile, shard=False) is None
    best_plan, best = brute_force(cluster, profile, shard=True)
    assert len(best_plan.pipelines) == 4
    kw = dict(cluster=cluster, model=MODEL, profile=profile, global_batch=BATCH, seq_len=SEQ, time_limit_s=300)
    with pytest.raises(ConfigError):
        plan_training(**kw, optimizer_sharding="none")
    with pytest.raises(ConfigError):         # two assumed holders (the search before the ladder) find nothing
        plan_training(**kw, optimizer_sharding="dp", shard_ways=2)
    for mode in ("dp", "auto"):
        result = plan_training(**kw, optimizer_sharding=mode)
        assert not result.hit_time_limit
        assert result.evaluation.feasible and len(result.plan.pipelines) == 4
        assert all(s.shard_optimizer for p in result.plan.pipelines for s in p.stages)
        assert result.evaluation.iteration_time_s == pytest.approx(best.iteration_time_s, rel=1e-9)


def test_auto_contains_the_unsharded_search(tight):
    """With room for everything, auto's result is never slower than none's (it runs none's exact search)."""
    cluster = _cluster(80.0)
    profile = analytic_profile(MODEL, cluster, SEQ)
    kw = dict(cluster=cluster, model=MODEL, profile=profile, global_batch=BATCH, seq_len=SEQ, time_limit_s=300)
    none, auto = plan_training(**kw, optimizer_sharding="none"), plan_training(**kw, optimizer_sharding="auto")
    assert not (none.hit_time_limit or auto.hit_time_limit)
    assert auto.evaluation.iteration_time_s <= none.evaluation.iteration_time_s * (1 + 1e-12)
    unsharded = brute_force(cluster, profile, shard=False)[1]
    assert none.evaluation.iteration_time_s <= unsharded.iteration_time_s * (1 + 1e-9)
