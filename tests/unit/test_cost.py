"""Cost model against hand-computed cases on a synthetic profile with round numbers."""
import pytest

from autohet_ray.cluster import cluster_from_dict
from autohet_ray.cost import allreduce_time, evaluate_plan, one_f_one_b_time
from autohet_ray.cost.terms import GRAD_SYNC_BYTES, MEMORY_RESERVE_BYTES, OPTIMIZER_BYTES_PER_PARAM, \
    STATE_BYTES_PER_PARAM
from autohet_ray.cost.timeline import one_f_one_b_order, simulate
from autohet_ray.model import PRESETS, layer_params
from autohet_ray.plan import Pipeline, Plan, Stage
from autohet_ray.profile import LayerProfile, LinkProfile, ProfileDB

MODEL = PRESETS["tiny-gpt"]          # 4 layers, hidden 32, seq 16
DEVICE = {"bf16_tflops": 100, "fp32_tflops": 10, "memory_gb": 16, "hbm_gbps": 1000, "link_gbps": 200,
          "link_kind": "nvlink", "nic_gbps": 100}
MS = 1e-3


def _cluster(nodes=(("n0", 4),)):
    return cluster_from_dict({"name": "t", "network": {"inter_node_gbps": 100}, "devices": {"X": DEVICE},
                              "nodes": [{"name": n, "device": "X", "count": c} for n, c in nodes]})


def _profile(intra_latency=1 * MS, inter_latency=2 * MS):
    layers = {"embedding": LayerProfile(fwd_s=0.5 * MS, bwd_s=0.5 * MS, param_bytes=0, activation_bytes=100),
              "layer": LayerProfile(fwd_s=1 * MS, bwd_s=2 * MS, param_bytes=0, activation_bytes=1000),
              "head": LayerProfile(fwd_s=1 * MS, bwd_s=1 * MS, param_bytes=0, activation_bytes=500)}
    double = {k: LayerProfile(fwd_s=2 * v.fwd_s, bwd_s=2 * v.bwd_s, param_bytes=v.param_bytes,
                              activation_bytes=2 * v.activation_bytes) for k, v in layers.items()}
    return ProfileDB(kind="measured", model=MODEL.name, seq_len=16,
                     entries={("X", 1, 1): layers, ("X", 1, 2): double},
                     links={"intra:X": LinkProfile(bandwidth_Bps=1e12, latency_s=intra_latency),
                            "inter": LinkProfile(bandwidth_Bps=1e12, latency_s=inter_latency)})


def _stage(layers, node="n0", devices=(0,)):
    return Stage(layers=layers, tp=len(devices), device_type="X", node=node, devices=tuple(devices))


def _plan(pipelines):
    return Plan(model=MODEL.name, global_batch=sum(p.num_microbatches for p in pipelines), micro_batch=1,
                seq_len=16, pipelines=tuple(pipelines))


def test_uniform_pipeline_simulation_matches_textbook_1f1b():
    for p, m in [(1, 5), (2, 4), (4, 8), (3, 2)]:
        slots = simulate([1.0] * p, [2.0] * p, [0.0] * (p - 1), m)
        assert max(s.end_s for s in slots) == pytest.approx((m + p - 1) * 3.0)
        assert one_f_one_b_time([3.0] * p, [0.0] * (p - 1), m) == pytest.approx((m + p - 1) * 3.0)


def test_closed_form_tracks_the_simulation():
    import random
    rng = random.Random(0)
    for _ in range(200):
        p, m = rng.randint(1, 6), rng.randint(1, 16)
        fwd = [rng.uniform(0.5, 2) for _ in range(p)]
        links = [rng.uniform(0, 0.5) for _ in range(p - 1)]
        sim = max(s.end_s for s in simulate(fwd, [2 * f for f in fwd], links, m))
        closed = one_f_one_b_time([3 * f for f in fwd], links, m)
        assert 0.92 <= closed / sim <= 1.25   # measured on 2000 random pipelines: 0.93 .. 1.24


def test_one_f_one_b_order_has_warmup_steady_cooldown():
    assert one_f_one_b_order(0, 3, 4) == [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("F", 3), ("B", 1),
                                          ("B", 2), ("B", 3)]
    assert one_f_one_b_order(2, 3, 4) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2),
                                          ("F", 3), ("B", 3)]


def test_two_stage_pipeline_by_hand():
    # stage 0: 2 layers (fwd 1, bwd 2 ms) + embedding (0.5 + 0.5) -> f0 = 2.5, b0 = 4.5 ms
    # stage 1: 2 layers + head (1 + 1) -> f1 = 3, b1 = 5 ms; links 1 ms (+ 1024 B at 1 TB/s, ignored below)
    # 1F1B, m = 4, worked by hand (start-end, ms):
    #   s0: F0 0-2.5  F1 2.5-5  B0 12.5-17  F2 17-19.5  B1 20.5-25  F3 25-27.5  B2 29.5-34  B3 37.5-42
    #   s1: F0 3.5-6.5  B0 6.5-11.5  F1 11.5-14.5  B1 14.5-19.5  F2 20.5-23.5  B2 23.5-28.5  F3 28.5-31.5
    #       B3 31.5-36.5
    # The round trip s0 -> s1 -> s0 (17 ms per 2 micro-batches in flight) paces it, not stage 1's 8 ms; the
    # planner's closed form prices that period: 3 * 8.5 + 15 + 2 = 42.5 ms; the evaluator simulates exactly.
    plan = _plan([Pipeline(num_microbatches=4, stages=(_stage((0, 2)), _stage((2, 4), devices=(1,))))])
    ev = evaluate_plan(plan, _cluster(), MODEL, _profile())
    link = 1 * MS + 1024 / 1e12
    assert ev.stage_times_s[0] == pytest.approx((7 * MS, 8 * MS))
    assert ev.link_times_s[0] == pytest.approx((link,))
    assert ev.pipeline_times_s[0] == pytest.approx(42 * MS, rel=1e-6)
    assert one_f_one_b_time([7 * MS, 8 * MS], [link], 4) == pytest.approx(42.5 * MS, rel=1e-6)
    params = [2 * layer_params(MODEL, "layer") + layer_params(MODEL, "embedding"),
              2 * layer_params(MODEL, "layer") + layer_params(MODEL, "head")]
    assert ev.optimizer_time_s == pytest.approx(max(params) * OPTIMIZER_BYTES_PER_PARAM / 1e12)
    assert ev.sync_time_s == 0.0
    assert ev.iteration_time_s == pytest.approx(ev.pipeline_times_s[0] + ev.optimizer_time_s)
    # memory: state + activations of the micro-batches in flight (stage 0 of 2 holds 2, stage 1 holds 1)
    assert ev.memory_bytes["n0:0"] == int(params[0] * STATE_BYTES_PER_PARAM + 2 * (2 * 1000 + 100))
    assert ev.memory_bytes["n0:1"] == int(params[1] * STATE_BYTES_PER_PARAM + 1 * (2 * 1000 + 500))
    assert ev.capacity_bytes["n0:0"] == 16 * 10**9 - MEMORY_RESERVE_BYTES


def test_exact_timeline_of_two_stages():
    # f = (7/3, 8/3) ms forward share is profile-driven: stage 0 fwd = 2*1 + 0.5 = 2.5 ms, bwd 4.5 ms;
    # stage 1 fwd = 2*1 + 1 = 3 ms, bwd 5 ms. With m=1: 2.5 + link + 3 + 5 + link + 4.5.
    plan = _plan([Pipeline(num_microbatches=1, stages=(_stage((0, 2)), _stage((2, 4), devices=(1,))))])
    ev = evaluate_plan(plan, _cluster(), MODEL, _profile())
    link = 1 * MS + 1024 / 1e12
    assert ev.pipeline_times_s[0] == pytest.approx(15 * MS + 2 * link)


def test_each_pipeline_is_priced_at_its_own_micro_batch_size():
    def two_stages(m, devices, micro_batch=None):
        return Pipeline(num_microbatches=m, micro_batch=micro_batch,
                        stages=(_stage((0, 2), devices=(devices[0],)), _stage((2, 4), devices=(devices[1],))))
    mixed = Plan(model=MODEL.name, global_batch=3 + 2 * 2, micro_batch=1, seq_len=16,
                 pipelines=(two_stages(3, (0, 1)), two_stages(2, (2, 3), micro_batch=2)))
    alone = Plan(model=MODEL.name, global_batch=4, micro_batch=2, seq_len=16, pipelines=(two_stages(2, (2, 3)),))
    ev, ev_alone = (evaluate_plan(p, _cluster(), MODEL, _profile()) for p in (mixed, alone))
    assert ev.pipeline_times_s[1] == pytest.approx(ev_alone.pipeline_times_s[0])
    assert ev.stage_times_s[1] == pytest.approx(tuple(2 * t for t in ev.stage_times_s[0]))
    assert ev.samples_per_s == pytest.approx(7 / ev.iteration_time_s)


def test_gradient_sync_intra_node_by_hand():
    p0 = Pipeline(num_microbatches=2, stages=(_stage((0, 4)),))
    p1 = Pipeline(num_microbatches=1, stages=(_stage((0, 4), devices=(1,)),))
    ev = evaluate_plan(_plan([p0, p1]), _cluster(), MODEL, _profile())
    # three buckets (the 4 layers, the embedding, the head), each a 2-member ring over the intra link:
    # 2*(2-1)/2 * bytes / bw + 2*(2-1) * latency
    buckets = [4 * layer_params(MODEL, "layer"), layer_params(MODEL, "embedding"), layer_params(MODEL, "head")]
    expect = sum(b * GRAD_SYNC_BYTES / 1e12 + 2 * MS for b in buckets)
    assert ev.sync_time_s == pytest.approx(expect)


def test_gradient_sync_across_nodes_uses_nic_and_asymmetric_boundaries_split_buckets():
    cluster = _cluster((("n0", 2), ("n1", 2)))
    p0 = Pipeline(num_microbatches=1, stages=(_stage((0, 1)), _stage((1, 4), devices=(1,))))
    p1 = Pipeline(num_microbatches=1, stages=(_stage((0, 3), node="n1"), _stage((3, 4), node="n1", devices=(1,))))
    ev = evaluate_plan(_plan([p0, p1]), cluster, MODEL, _profile())
    nic = 100e9 / 8 / 2                      # 100 Gb/s node NIC shared by the node's 2 syncing GPUs
    lay, emb, head = (layer_params(MODEL, k) * GRAD_SYNC_BYTES for k in ("layer", "embedding", "head"))
    ring = lambda b: b / nic + 2 * 2 * MS  # noqa: E731  (2 members: 2*(2-1)/2 * bytes/bw + 2 latencies)
    # p0 stage 1 holds layers 1..3: layers 1,2 are held by p1's stage 0, layer 3 by p1's stage 1 -> 2 buckets
    p0s1 = ring(2 * lay) + ring(lay) + ring(head)
    # p1 stage 0 holds layers 0..2: layer 0 with p0's stage 0, layers 1,2 with p0's stage 1, and the embedding
    p1s0 = ring(lay) + ring(2 * lay) + ring(emb)
    p0s0, p1s1 = ring(lay) + ring(emb), ring(lay) + ring(head)
    assert ev.sync_time_s == pytest.approx(max(p0s0, p0s1, p1s0, p1s1), rel=1e-9)


def test_tp_stage_adds_allreduces_and_out_of_memory_is_reported():
    assert allreduce_time(1e9, 4, LinkProfile(bandwidth_Bps=1e9, latency_s=0.0)) == pytest.approx(1.5)
    assert allreduce_time(1e9, 1, LinkProfile(bandwidth_Bps=1e9, latency_s=1.0)) == 0.0
    tight = dict(DEVICE, memory_gb=2.0000001)
    cluster = cluster_from_dict({"name": "t", "devices": {"X": tight}, "nodes": [{"name": "n0", "device": "X",
                                                                                  "count": 1}]})
    plan = _plan([Pipeline(num_microbatches=1, stages=(_stage((0, 4)),))])
    ev = evaluate_plan(plan, cluster, MODEL, _profile())
    assert not ev.feasible and "out of memory on n0:0" in ev.reason and "missing" in ev.reason


def test_later_stages_sync_while_earlier_stages_cool_down():
    cluster = _cluster((("n0", 2), ("n1", 2)))
    pipes = [Pipeline(num_microbatches=4, stages=(_stage((0, 2), node="n0", devices=(k,)),
                                                  _stage((2, 4), node="n1", devices=(k,)))) for k in range(2)]
    ev = evaluate_plan(_plan(pipes), cluster, MODEL, _profile(intra_latency=3 * MS))
    # each all-reduce is 2 x 3 ms of latency. Stage 1 finishes its backward b0 + link = 5.5 ms before stage 0 and
    # syncs then. Stage 0's last backward (4.5 ms: layers 1, 0, then the embedding) makes layers 0-1 final after
    # their share of the stage (6 of 7 ms of fwd+bwd): that bucket starts 4.5 * 6 / 7 ms into it, the embedding's
    # once it ends (and once the first bucket is done)
    assert ev.sync_time_s == pytest.approx(12 * MS, rel=1e-3)
    end = max(ev.pipeline_times_s)
    assert ev.iteration_time_s == pytest.approx(end - 4.5 * MS + 4.5 * MS * 6 / 7 + 12 * MS + ev.optimizer_time_s,
                                                rel=1e-3)
    # now the last stages sync across nodes (10 ms latency: 2 buckets x 20 ms) while the first stages still
    # cool down: stage 1 is done 4.5 ms (stage 0's last backward) + 10 ms (the link) before the pipeline ends.
    # Its head bucket starts after the head's share (2 of 8 ms) of its 5 ms last backward, the layers' at its end
    cluster3 = _cluster((("n0", 2), ("n1", 1), ("n2", 1)))
    late = _plan([Pipeline(num_microbatches=4, stages=(_stage((0, 2), node="n0", devices=(k,)),
                                                        _stage((2, 4), node=f"n{k + 1}", devices=(0,))))
                  for k in range(2)])
    ev2 = evaluate_plan(late, cluster3, MODEL, _profile(intra_latency=3 * MS, inter_latency=10 * MS))
    end = max(ev2.pipeline_times_s)
    assert ev2.sync_time_s == pytest.approx(40 * MS, rel=1e-3)
    stage1_done = end - 14.5 * MS
    head_sync_end = stage1_done - 5 * MS + 5 * MS * 2 / 8 + 20 * MS
    # (bytes over the shared NIC add ~0.2 ms to the 40 ms of latency)
    assert ev2.iteration_time_s == pytest.approx(max(head_sync_end, stage1_done) + 20 * MS + ev2.optimizer_time_s,
                                                 rel=5e-3)
    assert ev2.iteration_time_s < end + ev2.sync_time_s - 10 * MS


def test_time_breakdown_by_hand():
    """Pipeline 0: stages of 1 and 2 s per micro-batch, 2 micro-batches, ends at 5 s; pipeline 1: one 3 s stage,
    ends at 6 s; the iteration ends at 7 s (sync and optimizer)."""
    from autohet_ray.cost import Evaluation
    from autohet_ray.cost.breakdown import PARTS, breakdown_line, time_breakdown
    stage = lambda node, layers: Stage(layers=layers, tp=1, device_type="H800", node=node, devices=(0,))  # noqa: E731
    plan = Plan(model="tiny-gpt", global_batch=4, micro_batch=1, seq_len=16, pipelines=(
        Pipeline(num_microbatches=2, stages=(stage("a", (0, 2)), stage("b", (2, 4)))),
        Pipeline(num_microbatches=2, stages=(stage("c", (0, 4)),))))
    ev = Evaluation(feasible=True, reason="", iteration_time_s=7.0, samples_per_s=4 / 7,
                    pipeline_times_s=(5.0, 6.0), stage_times_s=((1.0, 2.0), (3.0,)), link_times_s=((0.0,), ()),
                    sync_time_s=0.5, optimizer_time_s=0.5)
    shares = time_breakdown(plan, ev)
    # GPU a: 2 + 2 + 1 + 1 + 1; GPU b: 4 + 0 + 1 + 1 + 1; GPU c: 6 + 0 + 0 + 0 + 1 (of 3 x 7 s)
    assert shares == pytest.approx({"compute": 12 / 21, "imbalance": 2 / 21, "fill_drain": 2 / 21,
                                    "other_pipes": 2 / 21, "tail": 3 / 21})
    assert sum(shares[p] for p in PARTS) == pytest.approx(1.0)
    assert "compute 57.1%" in breakdown_line(shares)
