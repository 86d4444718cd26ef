"""The zero-bubble H1 schedule in the cost model: the paper's bubble, memory, and the schedule choice."""
import pytest

from autohet_ray.cost import evaluate_plan
from autohet_ray.cost.evaluate import best_schedule
from autohet_ray.cost.terms import SPLIT_BACKWARD_OVERHEAD, GroupCostTable
from autohet_ray.cost.timeline import simulate
from autohet_ray.model.costs import weight_grad_share
from autohet_ray.plan import Pipeline
from test_cost import MODEL, _cluster, _plan, _profile, _stage


def _makespan(slots):
    return max(s.end_s for s in slots)


def test_two_stages_by_hand():
    # stage 1 (defers W by one): F0 [1,2] B0 [2,3] F1 [3,4] B1 [4,5] W0 [5,6] W1 [6,7]
    # stage 0: F0 [0,1] F1 [1,2] B0 [3,4] W0 [4,5] B1 [5,6] W1 [6,7]; 1F1B with B and W fused ends at 9
    zb = simulate([1.0, 1.0], [1.0, 1.0], [0.0], 2, "zb-h1", [1.0, 1.0])
    assert _makespan(zb) == 7.0
    assert [(s.kind, s.microbatch, s.start_s) for s in sorted(zb, key=lambda s: s.start_s) if s.stage == 0] == \
        [("F", 0, 0.0), ("F", 1, 1.0), ("B", 0, 3.0), ("W", 0, 4.0), ("B", 1, 5.0), ("W", 1, 6.0)]
    assert _makespan(simulate([1.0, 1.0], [2.0, 2.0], [0.0], 2)) == 9.0


@pytest.mark.parametrize("p,m", [(2, 4), (3, 3), (4, 8), (5, 6), (3, 10)])
def test_uniform_stages_match_the_papers_bubble(p, m):
    # Qi et al. 2023: ZB-H1 takes m (F + B + W) + (p - 1)(F + B - W), 1F1B m (F + B + W) + (p - 1)(F + B + W)
    f, b, w = 1.0, 1.2, 0.8
    zb = _makespan(simulate([f] * p, [b] * p, [0.0] * (p - 1), m, "zb-h1", [w] * p))
    assert zb == pytest.approx(m * (f + b + w) + (p - 1) * (f + b - w))
    assert _makespan(simulate([f] * p, [b + w] * p, [0.0] * (p - 1), m)) == pytest.approx((m + p - 1) * (f + b + w))


def test_weight_gradient_share_counts_one_gemm_per_weight():
    assert weight_grad_share(MODEL, "head", 16) == 0.5 and weight_grad_share(MODEL, "embedding", 16) == 0.0
    params = 4 * 32 * 32 + 4 * 32 + 2 * 32 * MODEL.ffn_hidden + MODEL.ffn_hidden + 32 + 4 * 32
    assert weight_grad_share(MODEL, "layer", 16) == pytest.approx(2 * params / (2 * (2 * params + 4 * 16 * 32)))


def _two_stage_plan(schedule, m=4):
    pipe = Pipeline(num_microbatches=m, stages=(_stage((0, 1)), _stage((1, 4), devices=(1,))))
    return _plan([pipe]).with_schedule(schedule)


def test_zero_bubble_is_faster_and_holds_more_activations_on_later_stages():
    one, zb = (evaluate_plan(_two_stage_plan(s), _cluster(), MODEL, _profile()) for s in ("1f1b", "zb-h1"))
    assert zb.iteration_time_s < one.iteration_time_s
    # the same work, scheduled differently; the split backward costs SPLIT_BACKWARD_OVERHEAD more
    cluster, profile = _cluster(), _profile()
    table = GroupCostTable(model=MODEL, cluster=cluster, profile=profile, micro_batch=1, seq_len=16)
    fwd = [table.get("X", 1).stage_split(n, j == 0, j == 1)[0] for j, n in enumerate((1, 3))]
    for t1, tz, f in zip(one.stage_times_s[0], zb.stage_times_s[0], fwd):
        assert tz == pytest.approx(f + SPLIT_BACKWARD_OVERHEAD * (t1 - f))
    # memory: 1F1B keeps 2 / 1 micro-batches' activations (A) on stages 0 / 1. ZB-H1 frees A at B but keeps
    # each TP linear's input and output gradient (H) until W. Stage 0 runs W right after B: peak max(2A, A + H);
    # stage 1 runs W(i) after B(i + 1): F0 B0 F1 B1 W0 F2 B2 W1 ... holds A + H, then 2 H
    h, f, tokens = MODEL.hidden, MODEL.ffn_hidden, 16
    held_layer = tokens * 2 * ((h + 3 * h) + (h + h) + (h + f) + (f + h))       # bf16; x + grad of qkv, proj, fc1, fc2
    held_head = tokens * 2 * (h + MODEL.vocab_size)
    gc = table.get("X", 1)
    assert (gc.layer_held_bytes, gc.head_held_bytes) == (held_layer, held_head)
    act0, act1 = 1000 + 100, 3 * 1000 + 500
    h0, h1 = held_layer, 3 * held_layer + held_head
    assert one.memory_bytes["n0:0"] - 2 * act0 == zb.memory_bytes["n0:0"] - max(2 * act0, act0 + h0)
    assert one.memory_bytes["n0:1"] - act1 == zb.memory_bytes["n0:1"] - max(act1 + h1, 2 * h1)


def test_live_counts_follow_the_actions():
    from autohet_ray.cost.memory import live_counts
    from autohet_ray.plan.schedule import in_flight_bound
    for p, m in [(1, 3), (2, 4), (4, 2), (4, 8)]:
        for j in range(p):
            assert live_counts("1f1b", p, j, m) == ((in_flight_bound("1f1b", p, j, m), 0),)
    assert live_counts("zb-h1", 2, 1, 4) == ((0, 2), (1, 1))
    assert live_counts("zb-h1", 2, 0, 4) == ((1, 1), (2, 0))


def test_best_schedule_takes_the_faster_one_that_fits():
    from autohet_ray.cluster import cluster_from_dict
    from autohet_ray.cost.terms import MEMORY_RESERVE_BYTES
    from test_cost import DEVICE
    plan, ev = best_schedule(_two_stage_plan("1f1b"), _cluster(), MODEL, _profile())
    assert plan.schedule == "zb-h1" and ev.feasible
    # a device between the two peaks: ZB-H1's held weight-gradient inputs no longer fit, 1F1B still does
    one, zb = (max(evaluate_plan(_two_stage_plan(s), _cluster(), MODEL, _profile()).memory_bytes.values())
               for s in ("1f1b", "zb-h1"))
    assert zb > one
    tight = dict(DEVICE, memory_gb=(MEMORY_RESERVE_BYTES + (one + zb) / 2) / 1e9)
    cluster = cluster_from_dict({"name": "t", "devices": {"X": tight},
                                 "nodes": [{"name": "n0", "device": "X", "count": 4}]})
    plan, ev = best_schedule(_two_stage_plan("zb-h1"), cluster, MODEL, _profile())
    assert plan.schedule == "1f1b" and ev.feasible
    assert not evaluate_plan(_two_stage_plan("zb-h1"), cluster, MODEL, _profile()).feasible
