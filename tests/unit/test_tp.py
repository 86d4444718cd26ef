"""Single-process pieces of the TP runtime: shard layouts, vocab-parallel CE at TP1, sync planning,
bridge routes, and plan/batch checks."""
import pytest
import torch
import torch.nn.functional as F

from autohet_ray import ConfigError
from autohet_ray.layout import overlap, shard_chunk
from autohet_ray.model.spec import PRESETS
from autohet_ray.nn import build_model, materialize, param_shapes
from autohet_ray.plan.rankmap import build_rank_map
from autohet_ray.plan.schema import Pipeline, Plan, Stage
from autohet_ray.runtime.bridge import route
from autohet_ray.runtime.checks import check_batch, check_plan
from autohet_ray.runtime.grad_sync import plan_grad_sync, unit_holders, unit_of
from autohet_ray.runtime.parallelize import build_stage_model, rank_layouts, shard_dim
from autohet_ray.runtime.tp import TPContext
from autohet_ray.runtime.vocab_ce import vocab_parallel_cross_entropy


def _pipe(m, *stages):
    return Pipeline(num_microbatches=m, stages=tuple(
        Stage(layers=(a, b), tp=tp, device_type="cpu", node="n0", devices=tuple(range(tp))) for a, b, tp in stages))


def _plan(*pipes, micro_batch=2, seq_len=8):
    return Plan(model="tiny-gpt", global_batch=micro_batch * sum(p.num_microbatches for p in pipes),
                micro_batch=micro_batch, seq_len=seq_len, pipelines=pipes)


def test_shard_dims():
    assert shard_dim("embedding.tok.weight") == 0
    assert shard_dim("embedding.pos.weight") is None
    assert shard_dim("layers.3.attn.qkv.weight") == 0 and shard_dim("layers.3.attn.qkv.bias") == 0
    assert shard_dim("layers.3.attn.proj.weight") == 1 and shard_dim("layers.3.attn.proj.bias") is None
    assert shard_dim("layers.0.mlp.gate_up.weight") == 0 and shard_dim("layers.0.mlp.down.weight") == 1
    assert shard_dim("head.out.weight") == 0 and shard_dim("head.norm.weight") is None


@pytest.mark.parametrize("name,tp", [("tiny-gpt", 2), ("tiny-llama", 2), ("tiny-llama-kv4", 4), ("tiny-bert", 4)])
def test_stage_shards_are_slices_of_the_whole_model(name, tp):
    spec = PRESETS[name]
    with torch.device("meta"):
        whole = build_model(spec)
    materialize(whole, seed=5, num_layers=spec.num_layers, device="cpu", dtype=torch.float32)
    full = dict(whole.named_parameters())
    for rank in range(tp):
        ctx = TPContext(size=tp, rank=rank, group=object())     # no communication while building
        model, layout = build_stage_model(spec, layers=(1, 3), first=True, last=True, tp=ctx, seed=5,
                                          device=torch.device("cpu"), dtype=torch.float32)
        for n, p in model.named_parameters():
            shape, chunk = layout[n]
            assert shape == tuple(full[n].shape)
            assert torch.equal(p.detach(), full[n].detach()[chunk.slices()]), n


def test_rank_layouts_are_the_layouts_the_stages_build():
    """The driver's layouts of every plan rank (no module built) equal what each rank's stage builds."""
    spec = PRESETS["tiny-llama-kv4"]
    plan = _plan(_pipe(2, (0, 1, 2), (1, 4, 4)), _pipe(1, (0, 3, 1), (3, 4, 2)))
    layouts = rank_layouts(plan, spec)
    infos = build_rank_map(plan, spec.num_layers).ranks
    assert len(layouts) == len(infos) == 2 + 4 + 1 + 2
    for info, layout in zip(infos, layouts):
        stages = plan.pipelines[info.pipeline].stages
        stage = stages[info.stage]
        ctx = TPContext(size=stage.tp, rank=info.tp_rank, group=object() if stage.tp > 1 else None)
        _, built = build_stage_model(spec, layers=stage.layers, first=info.stage == 0,
                                     last=info.stage == len(stages) - 1, tp=ctx, seed=0,
                                     device=torch.device("cpu"), dtype=torch.float32)
        assert layout == built, info


def test_vocab_ce_matches_torch_at_tp1():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=g, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 11, (3, 5), generator=g)
    labels[0, :2] = -100
    ours = vocab_parallel_cross_entropy(logits, labels, tp=TPContext())
    ref = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="none").view(3, 5)
    assert torch.allclose(ours, ref)
    (ga,) = torch.autograd.grad(ours.sum(), logits)
    (gb,) = torch.autograd.grad(ref.sum(), logits)
    assert torch.allclose(ga, gb)


def test_unit_of():
    assert unit_of("embedding.tok.weight") == "embedding"
    assert unit_of("layers.12.mlp.fc1.bias") == 12
    assert unit_of("head.out.weight") == "head"


def _sync_ops(plan, spec):
    return plan_grad_sync(build_rank_map(plan, spec.num_layers),
                          [(n, s, shard_dim(n)) for n, s in param_shapes(spec).items()])


def test_symmetric_sync_is_per_tp_rank_among_coholders():
    spec = PRESETS["tiny-gpt"]
    plan = _plan(_pipe(2, (0, 1, 1), (1, 4, 1)), _pipe(3, (0, 3, 1), (3, 4, 1)))
    rmap = build_rank_map(plan, spec.num_layers)
    groups = {op.ranks for op in _sync_ops(plan, spec)}
    # layer 0 + embedding: ranks 0, 2; layers 1-2: 1, 2; layer 3 + head: 1, 3
    assert groups == {(0, 2), (1, 2), (1, 3)}
    for layer in range(spec.num_layers):
        assert rmap.sync_groups(layer)[0] in groups


def test_sync_plan_tiles_every_tensor_for_every_holder():
    """Mixed TP degrees: each holder rank's segments tile exactly its own chunk of every parameter, and
    every segment sums exactly one contribution per pipeline."""
    spec = PRESETS["tiny-llama-kv4"]
    plan = _plan(_pipe(2, (0, 2, 4), (2, 3, 1), (3, 4, 2)), _pipe(1, (0, 4, 2)), _pipe(1, (0, 1, 1), (1, 4, 1)))
    rmap = build_rank_map(plan, spec.num_layers)
    ops = _sync_ops(plan, spec)
    shapes = param_shapes(spec)
    for name, shape in shapes.items():
        holders = unit_holders(rmap, unit_of(name))
        for h in holders:
            for r, rank in enumerate(h):
                mine = shard_chunk(shape, shard_dim(name), len(h), r)
                regions = [s.region for op in ops if rank in op.ranks for s in op.segments if s.name == name]
                assert all(overlap(x, mine) == x for x in regions), (name, rank)
                assert all(overlap(a, b) is None for i, a in enumerate(regions) for b in regions[i + 1:])
                assert sum(x.numel for x in regions) == mine.numel, (name, rank)
        for op in ops:
            for s in op.segments:
                if s.name == name:
                    per_pipeline = [sum(1 for x in h if x in s.contributors) for h in holders]
                    assert per_pipeline == [1] * len(holders), (name, op.ranks)
    assert all(len(set(op.ranks)) == len(op.ranks) > 1 for op in ops)
    assert len({op.ranks for op in ops}) == len(ops)


def test_single_pipeline_needs_no_sync():
    spec = PRESETS["tiny-gpt"]
    assert _sync_ops(_plan(_pipe(4, (0, 2, 2), (2, 4, 1))), spec) == ()


def test_routes():
    r = route((4, 5), (2, 3), 5)                                       # same degree: rank to rank, slice 1 of 2
    assert (r.send_to, r.recv_from, r.parts, r.index, r.broadcast_from) == (3, 3, 2, 1, None)
    r = route((4, 5), (2,), 5)                                         # TP2 next to TP1: only the leader talks
    assert r.send_to is None and r.recv_from is None and r.broadcast_from == 4
    r = route((4, 5), (2,), 4)
    assert r.send_to == 2 and r.recv_from == 2 and r.broadcast_from == 4 and r.parts == 1
    r = route((2,), (4, 5, 6, 7), 2)
    assert r.send_to == 4 and r.broadcast_from is None
    assert route((2,), None, 2).send_to is None


def test_plan_errors():
    spec = PRESETS["tiny-gpt"]
    with pytest.raises(ConfigError, match="layers"):
        check_plan(_plan(_pipe(2, (0, 1, 1), (2, 4, 1))), spec)
    with pytest.raises(ConfigError, match="covers layers"):
        check_plan(_plan(_pipe(2, (0, 3, 1))), spec)
    with pytest.raises(ConfigError, match="TP degree 8"):
        check_plan(_plan(_pipe(2, (0, 4, 8))), spec)
    with pytest.raises(ConfigError, match="max_seq_len"):
        check_plan(_plan(_pipe(2, (0, 4, 1)), seq_len=64), spec)
    bad_batch = Plan(model="tiny-gpt", global_batch=5, micro_batch=2, seq_len=8, pipelines=(_pipe(2, (0, 4, 1)),))
    with pytest.raises(ConfigError, match="global_batch"):
        check_plan(bad_batch, spec)


def test_batch_errors():
    spec = PRESETS["tiny-gpt"]
    plan = _plan(_pipe(2, (0, 4, 1)))
    ids = torch.zeros(4, 8, dtype=torch.long)
    check_batch({"input_ids": ids, "labels": ids}, plan, spec)
    with pytest.raises(ConfigError, match="shape"):
        check_batch({"input_ids": ids[:3], "labels": ids[:3]}, plan, spec)
    with pytest.raises(ConfigError, match="LongTensor"):
        check_batch({"input_ids": ids.float(), "labels": ids}, plan, spec)
    with pytest.raises(ConfigError, match="input_ids"):
        check_batch({"labels": ids}, plan, spec)
    with pytest.raises(ConfigError, match="values"):
        check_batch({"input_ids": ids + spec.vocab_size, "labels": ids}, plan, spec)
    with pytest.raises(ConfigError, match="ignored"):
        check_batch({"input_ids": ids, "labels": ids - 100}, plan, spec)


def test_sync_buckets_close_at_unit_boundaries_once_full_later_units_first():
    """Pure data parallelism: every unit has the same holders. With the default cap the tiny model is one
    bucket; with a small cap each bucket closes at the first unit boundary past it, the head's bucket comes
    first and the embedding's last, and the buckets together reduce exactly the same regions."""
    spec = PRESETS["tiny-gpt"]
    plan = _plan(_pipe(2, (0, 4, 1)), _pipe(2, (0, 4, 1)))
    rmap = build_rank_map(plan, spec.num_layers)
    params = [(n, s, shard_dim(n)) for n, s in param_shapes(spec).items()]
    whole = plan_grad_sync(rmap, params)
    assert len(whole) == 1
    per_unit = plan_grad_sync(rmap, params, bucket_elements=1)
    units = [[unit_of(s.name) for s in op.segments] for op in per_unit]
    assert [u[0] for u in units] == ["head", 3, 2, 1, 0, "embedding"] and all(len(set(u)) == 1 for u in units)
    layer = sum(seg.region.numel for seg in per_unit[1].segments)          # elements of one layer
    cap = layer + 1                                                      # a layer alone does not fill a bucket
    order = ["embedding", 0, 1, 2, 3, "head"]
    paired = list(reversed(plan_grad_sync(rmap, params, bucket_elements=cap)))      # model order
    groups = [sorted({unit_of(s.name) for s in op.segments}, key=order.index) for op in paired]
    assert [u for g in groups for u in g] == order                      # contiguous runs of units, in order
    for op, group in zip(paired[:-1], groups):
        sizes = [sum(seg.region.numel for seg in op.segments if unit_of(seg.name) == u) for u in group]
        assert sum(sizes) >= cap > sum(sizes[:-1]), (group, sizes)      # closed at the first boundary past it
    assert any(len(g) > 1 for g in groups)
    key = lambda op: sorted((s.name, s.region.offsets) for s in op.segments)  # noqa: E731
    assert sorted(x for op in per_unit for x in key(op)) == sorted(x for op in whole for x in key(op))
