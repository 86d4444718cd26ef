"""Pure helpers of the elastic controller: storage URLs, tier read order, one tiling writer set per tensor when
pipelines shard a tensor differently, cluster minus lost nodes, per-phase merge over ranks."""
from __future__ import annotations

import pytest

from autohet_ray import ConfigError
from autohet_ray.checkpoint import assign_writers, merge_records
from autohet_ray.checkpoint.manifest import ChunkRecord
from autohet_ray.cluster.spec import cluster_from_dict
from autohet_ray.layout import Chunk
from autohet_ray.cluster.live import without_nodes
from autohet_ray.checkpoint.holdings import tiling_holdings
from autohet_ray.checkpoint.restore_report import merge_restores, tier_order
from autohet_ray.elastic.tiers import build_tier
from autohet_ray.storage.spec import storage_spec


def test_storage_spec_parses_dirs_and_s3_and_rejects_others(tmp_path):
    assert storage_spec(str(tmp_path)) == {"kind": "dir", "name": "storage", "path": str(tmp_path)}
    spec = storage_spec("s3://bucket/run-7", endpoint_url="http://127.0.0.1:9", rate_bytes_per_s=5)
    assert spec == {"kind": "s3", "name": "storage", "bucket": "bucket", "prefix": "run-7/",
                    "endpoint_url": "http://127.0.0.1:9", "rate_bytes_per_s": 5.0}
    for bad in ("", "gs://bucket/x", "s3:///x"):
        with pytest.raises(ConfigError):
            storage_spec(bad)
    tier = build_tier(storage_spec(str(tmp_path)))
    tier.put_chunk("step-0000000001/w/s", b"abc")
    assert tier.get_chunk("step-0000000001/w/s") == b"abc" and tier.read_seconds() >= 0
    with pytest.raises(ConfigError, match="kind 'ftp'"):
        build_tier({"kind": "ftp", "name": "x"})


def test_tier_order_is_own_keeper_then_peers_then_cloud():
    keepers = {n: {"kind": "keeper", "name": f"keeper-{n}"} for n in "abc"}
    cloud = {"kind": "dir", "name": "cloud"}
    assert [t["name"] for t in tier_order("b", keepers, cloud, "local_first")] == \
        ["keeper-b", "keeper-a", "keeper-c", "cloud"]
    assert tier_order("b", keepers, cloud, "cloud_only") == [cloud]
    with pytest.raises(ConfigError, match="restore mode 'nearest'"):
        tier_order("b", keepers, cloud, "nearest")


def test_tiling_holdings_make_a_committable_step_when_pipelines_shard_differently():
    # pipeline 0 holds w as two TP halves (ranks 0, 1), pipeline 1 holds it whole (rank 2); all hold the step
    halves = [Chunk((0, 0), (2, 4)), Chunk((2, 0), (2, 4))]
    whole = Chunk((0, 0), (4, 4))
    step = Chunk((), ())
    holdings = {0: [("w", halves[0], 32), ("s", step, 8)], 1: [("w", halves[1], 32), ("s", step, 8)],
                2: [("w", whole, 64), ("s", step, 8)]}
    kept = tiling_holdings(holdings, {0: 0, 1: 0, 2: 1})
    assert kept[2] == [("s", step, 8)]   # pipeline 0 tiles w (two shards: more writers); s is the same chunk
    owned = assign_writers(kept)
    records = [ChunkRecord(step=1, name=n, global_shape=(4, 4) if n == "w" else (), chunk=c, dtype="float32",
                           digest=f"{n}{c.offsets}", nbytes=1) for rank in owned for n, c in owned[rank]]
    assert not merge_records(1, records).problems()


def test_without_nodes_and_merge_restores():
    cluster = cluster_from_dict({"name": "x", "nodes": [{"name": "a", "device": "H800", "count": 1},
                                                        {"name": "b", "device": "H20", "count": 2}]})
    assert [n.name for n in without_nodes(cluster, ["b"]).nodes] == ["a"]
    with pytest.raises(ConfigError, match="every node"):
        without_nodes(cluster, ["a", "b"])
    merged = merge_restores([
        {"fetch_s": 1.0, "load_s": 0.1, "bytes_by_tier": {"keeper-a": 10, "cloud": 0},
         "tier_read_s": {"keeper-a": 0.5, "cloud": 0.0}, "fallbacks": []},
        {"fetch_s": 2.0, "load_s": 0.3, "bytes_by_tier": {"keeper-a": 5, "cloud": 7},
         "tier_read_s": {"keeper-a": 0.2, "cloud": 1.5}, "fallbacks": ["x"]}],
        ["keeper-a", "keeper-b"], {"keeper-a", "keeper-b"})          # rank 1 (on b) read 5 bytes from a's store
    assert merged == {"fetch_s": 2.0, "load_s": 0.3, "bytes_by_tier": {"keeper-a": 15, "cloud": 7},
                      "bytes_from_other_nodes": 5, "fetch_s_by_tier": {"keeper-a": 0.5, "cloud": 1.5},
                      "fallbacks": ["x"]}


def _live_state_vs_state_dict(rank: int, world_size: int) -> bool:
    import torch

    from autohet_ray.model.spec import load_model
    from autohet_ray.data.synthetic import synthetic_batch
    from autohet_ray.runtime.optim import needs_of_layout
    from autohet_ray.plan.schema import plan_from_dict
    from autohet_ray.runtime.engine import Engine
    spec = load_model("tiny-gpt")
    plan = {"schema_version": 1, "model": "tiny-gpt", "global_batch": 2, "micro_batch": 1, "seq_len": 16,
            "pipelines": [{"num_microbatches": 2, "stages": [{"layers": [0, 4], "tp": 1, "device_type": "H800",
                                                              "node": "a", "devices": [0]}]}]}
    engine = Engine(plan=plan_from_dict(plan), model_spec=spec, rank=0)
    engine.train_step(synthetic_batch(vocab_size=spec.vocab_size, global_batch=2, seq_len=16, seed=0, step=0))
    live, copied = engine.live_state(), engine.state_dict()
    assert set(live) == set(copied) == set(needs_of_layout(engine.layout))
    for name, (tensor, shape, chunk) in copied.items():
        assert live[name][1:] == (shape, chunk) and torch.equal(live[name][0], tensor), name
    return True


def test_live_state_matches_engine_state_dict_without_copying():
    from autohet_ray.runtime.launch import run_world
    assert run_world(_live_state_vs_state_dict, 1, backend="gloo") == [True]
