"""Sharded optimizer state: slice layout, pricing (memory, optimizer step, reduce-scatter and all-gather),
the plan field, the planner's modes, the baselines and the lower bound."""
import math
from dataclasses import replace

import pytest

from autohet_ray import ConfigError
from autohet_ray.cluster import cluster_from_dict
from autohet_ray.cost import evaluate_plan
from autohet_ray.cost.sharding import saved_bytes, shard_ways
from autohet_ray.cost.terms import GroupCostTable
from autohet_ray.layout import Chunk, covers_exactly
from autohet_ray.model import PRESETS
from autohet_ray.plan import Pipeline, Plan, Stage
from autohet_ray.plan.schema import plan_from_dict
from autohet_ray.planner.baselines import best_baseline
from autohet_ray.planner.search import plan_training
from autohet_ray.profile import analytic_profile
from autohet_ray.profile.precision import precision
from autohet_ray.runtime.grad_sync import Segment, SyncOp
from autohet_ray.runtime.shard_layout import owned_pieces, slice_bounds

SMALL = PRESETS["small-gpt"]             # 8 layers, hidden 128, seq 64
DEVICE = {"bf16_tflops": 100, "fp32_tflops": 10, "memory_gb": 4, "hbm_gbps": 1000, "link_gbps": 200,
          "link_kind": "nvlink", "nic_gbps": 100}


def _cluster(gpus=4, memory_gb=4.0):
    return cluster_from_dict({"name": "t", "network": {"inter_node_gbps": 100},
                              "devices": {"X": DEVICE | {"memory_gb": memory_gb}},
                              "nodes": [{"name": "n0", "device": "X", "count": gpus}]})


def _op(*shapes):
    segs = tuple(Segment(name=f"p{i}", region=Chunk.whole(s), contributors=frozenset({0, 1, 2}))
                 for i, s in enumerate(shapes))
    return SyncOp(ranks=(0, 1, 2), segments=segs, sharded=True)


@pytest.mark.parametrize("weights", [None, (3.0, 1.0, 1.0), (1.0, 0.0, 2.0)])
def test_slices_are_row_aligned_boxes_that_tile_the_bucket(weights):
    op = _op((10, 7), (5,), (4, 3))
    bounds = slice_bounds(op, weights)
    assert bounds[0] == 0 and bounds[-1] == 70 + 5 + 12 and list(bounds) == sorted(bounds)
    pieces = [p for k in range(3) for p in owned_pieces(op, bounds[k], bounds[k + 1])]
    for i, seg in enumerate(op.segments):
        mine = [p.region for p in pieces if p.segment == i]
        assert covers_exactly(mine, seg.region.sizes)
    sizes = [b - a for a, b in zip(bounds, bounds[1:])]
    total = sum(sizes)
    shares = weights or (1.0, 1.0, 1.0)
    for size, w in zip(sizes, shares):       # within one row (7 elements) of the weighted target
        assert abs(size - total * w / sum(shares)) <= 7


def test_resident_bytes_per_parameter():
    table = GroupCostTable(model=SMALL, cluster=_cluster(), micro_batch=1, seq_len=64,
                           profile=analytic_profile(SMALL, _cluster(), 64))
    whole, two, four = (table.get("X", 1, False, w) for w in (1, 2, 4))
    assert whole.resident_bytes_per_param == 18                 # bf16: 2 + 4 + 4 + 8
    assert two.resident_bytes_per_param == 2 + 4 + 12 / 2
    assert four.resident_bytes_per_param == 2 + 4 + 12 / 4
    assert two.optimizer_s(2, True, False) == pytest.approx(whole.optimizer_s(2, True, False) / 2)
    fp32 = precision("float32")                                 # weight is its own master, a slice keeps a copy
    assert fp32.state_bytes_per_param - fp32.optimizer_state_bytes + fp32.sharded_state_bytes / 2 == 14


def _two_pipelines(shard):
    def stage(layers, dev):
        return Stage(layers=layers, tp=1, device_type="X", node="n0", devices=(dev,), shard_optimizer=shard)
    return Plan(model=SMALL.name, model_spec=SMALL.to_dict(), global_batch=8, micro_batch=1, seq_len=64,
                pipelines=(Pipeline(num_microbatches=4, stages=(stage((0, 3), 0), stage((3, 8), 1))),
                           Pipeline(num_microbatches=4, stages=(stage((0, 5), 2), stage((5, 8), 3)))))


def test_sharded_plan_is_priced_with_half_the_state_and_a_reduce_scatter():
    cluster = _cluster()
    profile = analytic_profile(SMALL, cluster, 64)
    plain, sharded = _two_pipelines(False), _two_pipelines(True)
    assert plan_from_dict(sharded.to_dict()) == sharded and "shard_optimizer" not in str(plain.to_dict())
    a, b = evaluate_plan(plain, cluster, SMALL, profile), evaluate_plan(sharded, cluster, SMALL, profile)
    saved = saved_bytes(sharded, cluster, SMALL, profile)
    assert all(shard_ways(sharded, k, j) == 2 for k, j in saved)
    for k, p in enumerate(sharded.pipelines):
        for j, s in enumerate(p.stages):
            device = f"n0:{s.devices[0]}"
            assert a.memory_bytes[device] - b.memory_bytes[device] == pytest.approx(saved[(k, j)], abs=2)
            assert saved[(k, j)] > 0
    assert b.sync_time_s == pytest.approx(a.sync_time_s / 2)     # the reduce-scatter: half the ring
    assert saved_bytes(plain, cluster, SMALL, profile) == {key: 0.0 for key in saved}


def test_modes_are_checked():
    with pytest.raises(ConfigError, match="optimizer_sharding='zero3'"):
        plan_training(cluster=_cluster(), model=SMALL, profile=analytic_profile(SMALL, _cluster(), 64),
                      global_batch=8, seq_len=64, optimizer_sharding="zero3")


def test_auto_is_never_slower_and_dp_shards_every_stage():
    """(Time limits far above the few seconds these searches take: a search cut short could differ.)"""
    cluster = _cluster(memory_gb=80)
    profile = analytic_profile(SMALL, cluster, 64)
    run = lambda mode, limit: plan_training(cluster=cluster, model=SMALL, profile=profile,  # noqa: E731
                                            global_batch=8, seq_len=64, time_limit_s=limit, optimizer_sharding=mode)
    none, dp, auto = run("none", 300), run("dp", 300), run("auto", 600)
    assert not (none.hit_time_limit or dp.hit_time_limit or auto.hit_time_limit)
    assert not any(s.shard_optimizer for p in none.plan.pipelines for s in p.stages)
    if len(dp.plan.pipelines) > 1:
        assert all(s.shard_optimizer for p in dp.plan.pipelines for s in p.stages)
    assert auto.evaluation.iteration_time_s <= none.evaluation.iteration_time_s * (1 + 1e-9)
    again = evaluate_plan(auto.plan, cluster, SMALL, profile)
    assert again.iteration_time_s == pytest.approx(auto.evaluation.iteration_time_s)


def test_megatron_baseline_shards_across_its_replicas_when_allowed():
    cluster = _cluster(memory_gb=80)
    profile = analytic_profile(SMALL, cluster, 64)
    args = dict(cluster=cluster, model=SMALL, profile=profile, global_batch=16, seq_len=64, micro_batches=[1, 2])
    plain, sharded = best_baseline("megatron", **args), best_baseline("megatron", **args, optimizer_sharding="dp")
    assert not any(s.shard_optimizer for p in plain.plan.pipelines for s in p.stages)
    if len(sharded.plan.pipelines) > 1:
        assert all(s.shard_optimizer for p in sharded.plan.pipelines for s in p.stages)
    whale = best_baseline("whale", **args, optimizer_sharding="dp")
    assert not any(s.shard_optimizer for p in whale.plan.pipelines for s in p.stages)


def test_lower_bound_with_sharding_stays_below_sharded_plans():
    from autohet_ray.planner.bounds.bound import lower_bound_iteration_s
    cluster = _cluster(memory_gb=80)
    profile = analytic_profile(SMALL, cluster, 64)
    kw = dict(cluster=cluster, model=SMALL, profile=profile, global_batch=8, seq_len=64)
    plain, shard = lower_bound_iteration_s(**kw), lower_bound_iteration_s(**kw, optimizer_sharding="auto")
    assert shard <= plain and math.isfinite(shard)
    assert shard <= evaluate_plan(_two_pipelines(True), cluster, SMALL, profile).iteration_time_s


def test_sharding_makes_a_plan_fit_that_nothing_replicated_fits():
    """Two layers, four one-GPU nodes (no TP, at most two stages): a stage with a layer and the embedding
    (or head) needs ~1.04 GB replicated, 0.69 GB sharded two ways; 0.75 GB are usable. Only a search that
    prices sharded state while it enumerates finds the two sharded pipelines."""
    from autohet_ray.model.spec import model_from_dict
    model = model_from_dict({"name": "wide2", "family": "gpt", "num_layers": 2, "hidden": 2048, "num_heads": 16,
                             "num_kv_heads": 16, "ffn_hidden": 8192, "vocab_size": 4096, "max_seq_len": 64})
    cluster = cluster_from_dict({"name": "t", "network": {"inter_node_gbps": 100},
                                 "devices": {"X": DEVICE | {"memory_gb": 2.75}},
                                 "nodes": [{"name": f"n{i}", "device": "X", "count": 1} for i in range(4)]})
    profile = analytic_profile(model, cluster, 64)
    kw = dict(cluster=cluster, model=model, profile=profile, global_batch=8, seq_len=64, time_limit_s=300)
    with pytest.raises(ConfigError, match="fits nowhere"):
        plan_training(**kw, optimizer_sharding="none")
    for mode in ("dp", "auto"):
        result = plan_training(**kw, optimizer_sharding=mode)
        assert result.evaluation.feasible and len(result.plan.pipelines) == 2
        assert all(s.shard_optimizer for p in result.plan.pipelines for s in p.stages)


def test_plan_table_shows_per_stage_sharding_and_the_memory_it_saves():
    """Pipeline 0 cuts at layer 3, pipeline 1 at layer 5; stage 0 of pipeline 0 and stage 1 of pipeline 1 ask
    to shard. As in the runtime (runtime/shard_sync.sharded_units), a unit is sharded when any holder asks:
    layers 0-2 and the embedding, layers 5-7 and the head. So every stage keeps half the (master + moments)
    of the units it holds of those, whether it asked or not."""
    from autohet_ray.cli.plan import plan_table
    from autohet_ray.cli.units import size
    from autohet_ray.model.costs import layer_params
    from autohet_ray.model.spec import model_from_dict
    wide = model_from_dict({"name": "wide8", "family": "gpt", "num_layers": 8, "hidden": 2048, "num_heads": 16,
                            "num_kv_heads": 16, "ffn_hidden": 8192, "vocab_size": 4096, "max_seq_len": 64})
    cluster = _cluster(memory_gb=80)
    profile = analytic_profile(wide, cluster, 64)
    plain = replace(_two_pipelines(False), model=wide.name, model_spec=wide.to_dict())
    plan = plain.with_optimizer_sharding([[True, False], [False, True]])
    ev, whole = evaluate_plan(plan, cluster, wide, profile), evaluate_plan(plain, cluster, wide, profile)
    rows = plan_table(plan, ev.memory_bytes, saved_bytes(plan, cluster, wide, profile)).splitlines()[2:]   # header, legend
    layer, embed, head = (layer_params(wide, kind) for kind in ("layer", "embedding", "head"))
    sharded_params = [3 * layer + embed, 3 * layer + head, 3 * layer + embed, 3 * layer + head]
    stages = [s for p in plan.pipelines for s in p.stages]
    assert len(rows) == len(stages) == 4
    for row, stage, params in zip(rows, stages, sharded_params):
        saved = whole.memory_bytes[f"n0:{stage.devices[0]}"] - ev.memory_bytes[f"n0:{stage.devices[0]}"]
        assert saved == pytest.approx(params * 12 / 2, abs=2)        # bf16: 12 B of master + moments, halved
        kind = "sharded" if stage.shard_optimizer else "partly sharded (by co-holders)"
        assert row.endswith(f"{kind} 2-way, saves {size(saved)}")


def test_reduce_scatter_and_all_gather_are_ring_halves_on_gpus_and_gloo_priced_on_a_cpu_profile():
    """gloo runs reduce_scatter_tensor as an all-reduce (pytorch/pytorch#118911); a profile measured on a CPU
    (runtime ranks on gloo) prices the sharded bucket's collectives at gloo's shares, an analytic (GPU) or CUDA
    one at a ring's halves."""
    from autohet_ray.cost.sharding import GLOO_SHARES, RING_SHARES, collective_shares
    cluster = _cluster()
    gpu = analytic_profile(SMALL, cluster, 64)
    cpu = replace(gpu, kind="measured", meta={"source": "measured on cpu (x86_64), torch.float32, one TP rank's shard"})
    cuda = replace(cpu, meta={"source": "measured on cuda (NVIDIA H200), torch.bfloat16"})
    assert [collective_shares(p) for p in (gpu, cpu, cuda)] == [RING_SHARES, GLOO_SHARES, RING_SHARES]
    assert RING_SHARES == (0.5, 0.5) and GLOO_SHARES[0] >= 1.0
    for profile, (scatter, _) in ((gpu, RING_SHARES), (cpu, GLOO_SHARES)):
        plain = evaluate_plan(_two_pipelines(False), cluster, SMALL, profile)
        sharded = evaluate_plan(_two_pipelines(True), cluster, SMALL, profile)
        assert sharded.sync_time_s == pytest.approx(plain.sync_time_s * scatter)
