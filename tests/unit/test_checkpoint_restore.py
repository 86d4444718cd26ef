"""Resharding restore: bit-exact across layouts, cheapest valid tier first, corruption falls through."""

import pytest

from autohet_ray.checkpoint import (ChunkUnavailableError, IncompleteStepError, LayoutMismatchError, LocalDirTier,
                                    TierUnavailableError, choose_restorable_step,
                                    find_manifest, latest_committed_step, merge_records, plan_reads, restore)
from autohet_ray.checkpoint.holdings import stage_in_copies
from autohet_ray.checkpoint.tiers.s3 import S3Config, S3Tier
from autohet_ray.layout import Chunk, shard_chunk
from checkpoint_helpers import SHAPES, MiniJob, assert_bit_exact, full_state, needs_of, rank_states

from s3_server import client, moto_endpoint, new_bucket  # noqa: E402

NODES = {"a": "H100", "b": "H20", "c": "H20"}


@pytest.fixture(scope="module")
def s3_url():
    with moto_endpoint() as url:
        yield url


@pytest.fixture
def s3_cloud(s3_url):
    return S3Tier(S3Config(bucket=new_bucket(s3_url), endpoint_url=s3_url), name="cloud", client=client(s3_url))


@pytest.fixture
def saved_tp2(s3_cloud):
    """Step 4 saved by two TP ranks on nodes a and b; keepers a, b, c and the S3 cloud."""
    job = MiniJob(NODES, ["a", "b"], s3_cloud)
    full = full_state(4)
    job.save(4, rank_states(full, 2))
    yield job, full
    job.close()


@pytest.mark.parametrize("new_tp,split_dims", [
    (3, None),                                                         # TP2 rows -> 3-way rows (uneven 3/3/3 of 9, 3/2/2 of 7)
    (3, {name: 1 for name, (shape, _, _) in SHAPES.items() if len(shape) == 2}),   # -> 3-way, other dim
    (1, None),                                                         # -> one rank holds everything
    (4, {"layers.0.mlp.fc2.weight": 0, "layers.0.mlp.fc2.bias": 0}),   # row-parallel -> split rows, bias split
])
def test_reshard_from_cloud_only_is_bit_exact(saved_tp2, new_tp, split_dims):
    job, full = saved_tp2
    step = latest_committed_step([job.cloud])
    assert step == 4
    manifest = find_manifest([job.cloud], step)
    for needs in needs_of(rank_states(full, new_tp, split_dims=split_dims)):
        state, report = restore(manifest, needs, [job.cloud])
        assert_bit_exact(state, full)
        assert report.tiers["cloud"].bytes_read > 0 and not report.fallbacks


def test_reads_come_from_the_cheapest_tier_and_only_needed_chunks(saved_tp2):
    job, full = saved_tp2
    manifest = find_manifest(job.all_tiers(), 4)
    first = plan_reads(manifest, needs_of(rank_states(full, 3))[0])      # rank 0 of 3: rows 0..2 of 9
    assert [p.record.chunk for p in first["layers.0.attn.qkv.weight"]] == [Chunk((0, 0), (5, 5))]
    needs = needs_of(rank_states(full, 3))[1]                     # rank 1 of 3: rows/columns 3..5 of 9
    plan = plan_reads(manifest, needs)
    assert [p.region for p in plan["layers.0.mlp.fc2.weight"]] == [Chunk((0, 3), (5, 2)), Chunk((0, 5), (5, 1))]
    tiers = [job.keepers["a"], job.keepers["c"], job.keepers["b"], job.cloud]
    state, report = restore(manifest, needs, tiers)
    assert_bit_exact(state, full)
    # keeper a holds its own rank's chunks; rank b's came from its peer copy on a (a's peer is b, b's is a
    # or c: another GPU type first) or from keeper c/b; the cloud is never touched.
    assert report.tiers["cloud"].bytes_read == 0
    assert sum(report.bytes_by_tier().values()) == sum(r.nbytes for r in {p.record for ps in plan.values() for p in ps})


def corrupt(tier, key, how):
    blob = tier.get_chunk(key)
    if how == "flip":
        damaged = bytearray(blob)
        damaged[-1] ^= 0x01
        tier.put_chunk(key, bytes(damaged))
    else:
        tier.put_chunk(key, blob[: len(blob) // 2])


@pytest.mark.parametrize("how", ["flip", "truncate"])
def test_corrupt_copies_fall_through_to_the_next_tier_and_are_reported(saved_tp2, how):
    job, full = saved_tp2
    manifest = find_manifest(job.all_tiers(), 4)
    record = next(r for r in manifest.records if r.name == "layers.0.attn.qkv.weight" and r.chunk.offsets[0] == 0)
    keepers = [t for t in job.keepers.values() if t.has(record.key)]
    assert len(keepers) == 2                                      # node copy + peer copy
    for tier in keepers:
        corrupt(tier, record.key, how)
    needs = {"layers.0.attn.qkv.weight": ((9, 5), Chunk((0, 0), (9, 5)))}
    state, report = restore(manifest, needs, [*keepers, job.cloud])
    assert_bit_exact(state, full)
    assert [report.tiers[t.name].corrupt for t in keepers] == [1, 1]
    assert report.tiers["cloud"].chunks_read == 1 and report.tiers["cloud"].bytes_read == record.nbytes
    assert all(record.key in line and "corrupt" in line for line in report.fallbacks)


def test_no_valid_copy_anywhere_names_the_chunk_and_the_step(saved_tp2):
    job, full = saved_tp2
    manifest = find_manifest(job.all_tiers(), 4)
    record = next(r for r in manifest.records if r.name == "embedding.tok.weight" and r.chunk.offsets[0] > 0)
    for tier in job.keepers.values():
        tier.delete(record.key)
    corrupt(job.cloud, record.key, "flip")
    needs = {"embedding.tok.weight": ((7, 4), Chunk((0, 0), (7, 4)))}
    with pytest.raises(ChunkUnavailableError) as info:
        restore(manifest, needs, job.all_tiers())
    message = str(info.value)
    assert "step-0000000004/embedding.tok.weight/4_0-3_4" in message and "of step 4" in message
    assert "keeper-a: missing" in message and "cloud: corrupt" in message


def test_layout_mismatch_is_reported(saved_tp2):
    job, _ = saved_tp2
    manifest = find_manifest(job.all_tiers(), 4)
    with pytest.raises(LayoutMismatchError, match="holds no tensor 'layers.9.x'"):
        plan_reads(manifest, {"layers.9.x": ((2,), Chunk((0,), (2,)))})
    with pytest.raises(LayoutMismatchError, match=r"saved global shape \[7, 4\]"):
        plan_reads(manifest, {"embedding.tok.weight": ((8, 4), Chunk((0, 0), (8, 4)))})


def test_gaps_and_diverged_replicas_are_not_committable(tmp_path):
    full = full_state(1)
    job = MiniJob(NODES, ["a", "b"], LocalDirTier(tmp_path))
    job.save(1, rank_states(full, 2))
    records = list(find_manifest(job.all_tiers(), 1).records)
    gap = [r for r in records if not (r.name == "layers.0.mlp.fc2.weight" and r.chunk.offsets[1] == 0)]
    with pytest.raises(IncompleteStepError, match="layers.0.mlp.fc2.weight: chunks .* do not tile"):
        merge_records(1, gap)
    diverged = records + [r.__class__(**{**r.__dict__, "digest": "blake2b-256:00"}) for r in records[:1]]
    with pytest.raises(IncompleteStepError, match="two different hashes"):
        merge_records(1, diverged)
    mixed = records + [r.__class__(**{**r.__dict__, "step": 0}) for r in records[:1]]
    with pytest.raises(IncompleteStepError, match="mixed steps"):
        merge_records(1, mixed)
    job.close()


def test_dp_copies_of_one_chunk_merge_their_replicas(tmp_path):
    full = full_state(2)
    job = MiniJob(NODES, ["a", "b", "c"], LocalDirTier(tmp_path, name="cloud"))
    # three data-parallel ranks each holding the whole model: one writer per tensor, all merged
    whole = rank_states(full, 1)[0]
    job.save(2, [whole, whole, whole])                               # one writer per chunk
    manifest = find_manifest([job.cloud], 2)
    assert len(manifest.records) == len(SHAPES)
    assert all(len(r.replicas) == 3 and r.replicas[-1] == "cloud" for r in manifest.records)
    job.save(3, [whole, whole, whole], dedupe=False)                 # every rank writes: replicas merge
    manifest = find_manifest([job.cloud], 3)
    assert len(manifest.records) == len(SHAPES)
    assert all(set(r.replicas) == {"keeper-a", "keeper-b", "keeper-c", "cloud"} for r in manifest.records)
    state, _ = restore(manifest, needs_of([whole])[0], [job.cloud])
    assert_bit_exact(state, full)
    job.close()


def test_tp_shard_of_uneven_split_with_empty_chunks():
    shape = (2, 3)
    assert shard_chunk(shape, 0, 4, 3).sizes == (0, 3)             # TP4 of 2 rows: two empty chunks


class DeadTier:
    """A tier whose node is gone: every call fails as a whole."""

    def __init__(self, name):
        self.name, self.calls = name, 0

    def get_chunk(self, key):
        self.calls += 1
        raise TierUnavailableError(self.name, "node lost")

    def has(self, key):
        raise TierUnavailableError(self.name, "node lost")


def test_a_dead_tier_is_reported_and_asked_only_once(saved_tp2):
    job, full = saved_tp2
    manifest = find_manifest(job.all_tiers(), 4)
    dead = DeadTier("keeper-x")
    needs = needs_of(rank_states(full, 1))[0]
    state, report = restore(manifest, needs, [dead, job.keepers["b"], job.keepers["c"], job.cloud], num_threads=1)
    assert_bit_exact(state, full)
    assert dead.calls == 1 and report.tiers["keeper-x"].unavailable == report.saved_chunks_fetched


def test_choose_restorable_step_skips_a_step_whose_copies_are_all_lost(tmp_path):
    cloud = LocalDirTier(tmp_path, name="cloud")
    job = MiniJob(NODES, ["a", "b"], cloud, cloud_every=2)
    for step in (2, 3):                                   # step 2 reaches the cloud, step 3 only the keepers
        job.save(step, rank_states(full_state(step), 2))
    needs = needs_of(rank_states(full_state(3), 3))
    assert choose_restorable_step(job.all_tiers(), job.all_tiers(), needs) == (3, [])
    for key in job.keepers["a"].list():                   # nodes a and b lost: c holds only some replicas
        job.keepers["a"].delete(key)
    survivors = [job.keepers["c"], cloud]
    step, skipped = choose_restorable_step(survivors, survivors, needs)
    assert step == 2 and "step 3: no tier holds" in skipped[0]
    state, _ = restore(find_manifest(survivors, step), needs[1], survivors)
    assert_bit_exact(state, full_state(2))
    job.close()


class LookupTier:
    """A tier that looks keys up in one call (as a peer keeper does) and records what it was asked for."""

    def __init__(self, inner):
        self.inner, self.name, self.asked = inner, inner.name, []

    def prefetch(self, keys):
        self.asked += keys
        return {key for key in keys if self.inner.has(key)}

    def get_chunk(self, key):
        return self.inner.get_chunk(key)


def test_a_peer_is_asked_only_for_chunks_the_own_store_lacks(saved_tp2, tmp_path):
    """A survivor's own store answers first; a peer prefetch of the rest (which copies the chunks across
    nodes) leaves out what the own store holds, and a corrupt own copy still falls through to the peer."""
    job, full = saved_tp2
    manifest = find_manifest(job.all_tiers(), 4)
    needs = needs_of(rank_states(full, 1))[0]
    own = LocalDirTier(tmp_path, name="own", fsync=False)
    keys = sorted(r.key for r in manifest.records)
    for key in keys:
        own.put_chunk(key, job.cloud.get_chunk(key))
    absent, damaged = keys[0], keys[1]
    own.delete(absent)
    corrupt(own, damaged, "flip")
    peer = LookupTier(job.cloud)
    state, report = restore(manifest, needs, [own, peer])
    assert_bit_exact(state, full)
    assert peer.asked == [absent]                          # the damaged one is held: not prefetched, then read
    assert report.tiers["cloud"].chunks_read == 2 and report.tiers["own"].corrupt == 1


def test_staged_in_chunks_let_a_node_restore_from_its_own_store(saved_tp2):
    """Node b is lost; the next plan puts one rank holding everything on node c. The copies stage_in_copies
    names (from live holders, only what c's store lacks) make c's store alone enough for the restore."""
    job, full = saved_tp2
    manifest = find_manifest(job.all_tiers(), 4)
    needs = needs_of(rank_states(full, 1))[0]
    node_of = {"keeper-a": "a", "keeper-c": "c"}                 # b's store is gone
    copies = stage_in_copies(manifest, {"c": [needs]}, node_of)
    assert copies and set(copies) == {("a", "c")}
    with pytest.raises(ChunkUnavailableError):                   # before the copies, c's store is not enough
        restore(manifest, needs, [job.keepers["c"]])
    for (source, target), keys in copies.items():
        for key in keys:
            assert not job.keepers[target].has(key)              # only what the target lacks
            job.keepers[target].put_chunk(key, job.keepers[source].get_chunk(key))
    state, report = restore(manifest, needs, [job.keepers["c"]])
    assert_bit_exact(state, full)
    assert stage_in_copies(manifest, {"c": [needs]}, {"keeper-c": "c"}) == {}   # no live holder: left to the restore


def test_a_step_written_when_the_storage_tier_was_named_cloud_still_restores(tmp_path):
    """Jobs written before the storage tier was named "storage" list "cloud" among each chunk's replicas; the
    storage tier of today's spec (as `autohet resume` builds it) restores their steps, bit-exact."""
    from autohet_ray.checkpoint.tier_specs import direct_tier
    from autohet_ray.storage.spec import storage_spec
    full = full_state(5)
    old = MiniJob(NODES, ["a", "b"], LocalDirTier(tmp_path, name="cloud"))
    old.save(5, rank_states(full, 2))
    old.close()
    storage = direct_tier(storage_spec(str(tmp_path)))
    assert storage.name == "storage"
    manifest = find_manifest([storage], latest_committed_step([storage]))
    assert manifest.step == 5 and all("cloud" in r.replicas for r in manifest.records)
    for needs in needs_of(rank_states(full, 3)):
        state, report = restore(manifest, needs, [storage])
        assert_bit_exact(state, full)
        assert report.tiers["storage"].bytes_read > 0 and not report.fallbacks
