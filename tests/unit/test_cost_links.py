"""Inter-stage messages priced as runtime/bridge.py moves them: 1/t per TP rank plus an all-gather between equal
TP degrees, a leader funnel plus a broadcast between different ones."""
import pytest

from autohet_ray.cost import evaluate_plan
from autohet_ray.cost.evaluate import stage_link_times
from autohet_ray.plan import Pipeline, Plan, Stage
from autohet_ray.profile import LayerProfile, LinkProfile, ProfileDB
from test_cost import MODEL, MS, _cluster

INTRA_BW, INTER_BW = 1e9, 1e8             # bytes/s: the synthetic profile's links
INTRA_LAT, INTER_LAT = 1 * MS, 3 * MS
MSG = 1 * 16 * MODEL.hidden * 2           # one micro-batch of hidden states, bf16 (the profile records no dtype)


def _profile() -> ProfileDB:
    layers = {k: LayerProfile(fwd_s=1 * MS, bwd_s=2 * MS, param_bytes=0, activation_bytes=1000)
              for k in ("embedding", "layer", "head")}
    return ProfileDB(kind="measured", model=MODEL.name, seq_len=16, entries={("X", t, 1): layers for t in (1, 2)},
                     links={"intra:X": LinkProfile(bandwidth_Bps=INTRA_BW, latency_s=INTRA_LAT),
                            "inter": LinkProfile(bandwidth_Bps=INTER_BW, latency_s=INTER_LAT)})


def _stage(layers, node, devices):
    return Stage(layers=layers, tp=len(devices), device_type="X", node=node, devices=tuple(devices))


def _links(a, b):
    plan = Plan(model=MODEL.name, global_batch=1, micro_batch=1, seq_len=16,
                pipelines=(Pipeline(num_microbatches=1, stages=(a, b)),))
    return stage_link_times(plan, _cluster((("n0", 4), ("n1", 4))), _profile(), MODEL, a, b)


def test_equal_tp_across_nodes_sends_the_message_once_and_all_gathers():
    fwd, bwd = _links(_stage((0, 2), "n0", (0, 1)), _stage((2, 4), "n1", (0, 1)))
    # two ranks send half each through the shared NIC (the whole message once), then a 2-way all-gather
    gather = 0.5 * MSG / INTRA_BW + INTRA_LAT
    assert fwd == bwd == pytest.approx(MSG / INTER_BW + INTER_LAT + gather)


def test_equal_tp_inside_a_node_sends_a_slice_per_link():
    fwd, _ = _links(_stage((0, 2), "n0", (0, 1)), _stage((2, 4), "n0", (2, 3)))
    assert fwd == pytest.approx(MSG / 2 / INTRA_BW + INTRA_LAT + 0.5 * MSG / INTRA_BW + INTRA_LAT)


def test_different_tp_funnels_through_the_leaders_and_broadcasts():
    fwd, bwd = _links(_stage((0, 2), "n0", (0, 1)), _stage((2, 4), "n1", (0,)))
    assert fwd == pytest.approx(MSG / INTER_BW + INTER_LAT)                                # into TP1: no broadcast
    assert bwd == pytest.approx(MSG / INTER_BW + INTER_LAT + MSG / INTRA_BW + INTRA_LAT)   # gradient into TP2


def test_tp1_is_a_plain_message():
    fwd, bwd = _links(_stage((0, 2), "n0", (0,)), _stage((2, 4), "n1", (0,)))
    assert fwd == bwd == pytest.approx(MSG / INTER_BW + INTER_LAT)


def test_the_timeline_uses_each_direction():
    a, b = _stage((0, 2), "n0", (0, 1)), _stage((2, 4), "n1", (0,))
    plan = Plan(model=MODEL.name, global_batch=1, micro_batch=1, seq_len=16,
                pipelines=(Pipeline(num_microbatches=1, stages=(a, b)),))
    ev = evaluate_plan(plan, _cluster((("n0", 4), ("n1", 4))), MODEL, _profile())
    fwd, bwd = _links(a, b)
    assert ev.link_times_s == ((pytest.approx(fwd),),) and ev.back_link_times_s == ((pytest.approx(bwd),),)
    # one micro-batch: F0, link, F1 + B1, gradient link, B0 (each stage: 2 layers; embedding / head 1 + 2 ms),
    # plus 4 TP all-reduces per layer and one for the embedding on the TP2 stage
    stage0, stage1 = ev.stage_times_s[0]
    assert ev.pipeline_times_s[0] == pytest.approx(stage0 + fwd + stage1 + bwd)


def test_a_collective_pays_its_fixed_overhead_once():
    from autohet_ray.cost.terms import allreduce_time, inter_link
    plain = LinkProfile(bandwidth_Bps=1e9, latency_s=1e-5)
    slow = LinkProfile(bandwidth_Bps=1e9, latency_s=1e-5, collective_overhead_s=1e-3)
    for members in (2, 4):
        assert allreduce_time(1e6, members, slow) == pytest.approx(allreduce_time(1e6, members, plain) + 1e-3)
    assert allreduce_time(1e6, 1, slow) == 0.0
    profile = ProfileDB(kind="measured", model=MODEL.name, seq_len=16, links={"inter": slow})
    two_nodes = _cluster((("a", 1), ("b", 1)))
    assert inter_link(profile, two_nodes, "a", "b").collective_overhead_s == 1e-3


def test_an_all_reduce_moves_its_bytes_at_its_own_measured_rate():
    """gloo reduces on the host CPU: a link with a measured all-reduce rate prices all-reduces at it (and the
    NIC still bounds it between nodes); p2p messages keep the p2p rate."""
    from autohet_ray.cost.terms import allreduce_time, inter_link, p2p_time
    p2p = LinkProfile(bandwidth_Bps=4e9, latency_s=1e-5)
    reducing = LinkProfile(bandwidth_Bps=4e9, latency_s=1e-5, allreduce_bandwidth_Bps=1e9)
    assert allreduce_time(8e6, 2, reducing) == pytest.approx(8e6 / 1e9 + 2e-5)
    assert allreduce_time(8e6, 2, p2p) == pytest.approx(8e6 / 4e9 + 2e-5)
    assert p2p_time(8e6, reducing) == p2p_time(8e6, p2p)
    profile = ProfileDB(kind="measured", model=MODEL.name, seq_len=16, links={"inter": reducing})
    two_nodes = _cluster((("a", 1), ("b", 1)))
    between = inter_link(profile, two_nodes, "a", "b", share=2)
    nic = min(two_nodes.nic_bytes_per_s("a"), two_nodes.nic_bytes_per_s("b"))
    assert between.allreduce_bandwidth_Bps == pytest.approx(min(nic, 1e9) / 2)


def _probe(rank, world_size):
    from autohet_ray.profile.link_probe import probe_link
    return probe_link(rank, 1 << 20, reps=10)


@pytest.mark.dist
def test_the_link_probe_measures_a_real_gloo_link():
    """Two spawned ranks on loopback: both report rank 0's figures, all positive and finite."""
    from autohet_ray.runtime import run_world
    a, b = run_world(_probe, 2, backend="gloo")
    assert a == b
    assert 1e6 < a["bandwidth_Bps"] < 1e12 and 0 < a["latency_s"] < 0.1 and 0 <= a["collective_overhead_s"] < 0.1
    assert 1e6 < a["allreduce_bandwidth_Bps"] < 1e12


def test_collectives_measured_in_a_tp_group_replace_the_link_price(tmp_path):
    """An entry with its TP collectives measured (runtime/in_situ_cost.py) is priced with those seconds, per
    kind and per direction, and not from the link; one without them keeps the link's price. The fields survive
    a save and load."""
    from autohet_ray.cost.terms import GroupCostTable, allreduce_time
    from autohet_ray.profile.db import load_profile
    measured = _profile()
    comm = {"embedding": (0.5 * MS, 0.0), "layer": (3 * MS, 4 * MS), "head": (2 * MS, 1 * MS)}
    measured.entries[("X", 2, 1)] = {
        kind: LayerProfile(fwd_s=1 * MS, bwd_s=2 * MS, param_bytes=0, activation_bytes=1000,
                           tp_comm_fwd_s=comm[kind][0], tp_comm_bwd_s=comm[kind][1]) for kind in comm}
    measured.save(str(tmp_path / "p.json"))
    assert load_profile(str(tmp_path / "p.json")).entries == measured.entries
    cluster = _cluster((("n0", 4),))
    table = lambda db: GroupCostTable(cluster=cluster, model=MODEL, profile=db, micro_batch=1, seq_len=16)  # noqa: E731
    got = table(measured).get("X", 2)
    assert got.layer_s == pytest.approx(3 * MS + 7 * MS)
    assert got.layer_fwd_fraction == pytest.approx(4 / 10)
    assert got.embed_s == pytest.approx(3.5 * MS) and got.head_s == pytest.approx(6 * MS)
    priced = table(_profile()).get("X", 2)
    ar = allreduce_time(MSG, 2, LinkProfile(bandwidth_Bps=INTRA_BW, latency_s=INTRA_LAT))
    assert priced.layer_s == pytest.approx(3 * MS + 4 * ar)
