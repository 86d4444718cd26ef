"""Commit protocol under injected faults, latest committed step, and garbage collection.

The cloud tier is a real S3 API (moto server); one tensor is big enough for a multipart upload so that the
`upload_part` point is exercised too.
"""
import threading

import pytest
import torch

from autohet_ray.checkpoint import (POINTS, Faults, InjectedFault, LocalDirTier, ManifestExistsError, collect_garbage,
                                    find_manifest, latest_committed_step, restore, scan_manifests)
from autohet_ray.checkpoint.tiers.s3 import MiB, S3Config, S3Tier
from checkpoint_helpers import SHAPES, MiniJob, assert_bit_exact, full_state, needs_of, rank_states

from s3_server import client, moto_endpoint, new_bucket  # noqa: E402

NODES = {"a": "H100", "b": "H20", "c": "A100"}
BIG = {**SHAPES, "layers.1.big.weight": ((1280, 1024), torch.float32, None)}     # 5 MiB: 2 parts


@pytest.fixture(scope="module")
def s3_url():
    with moto_endpoint() as url:
        yield url


def s3_cloud(url, faults=None):
    config = S3Config(bucket=new_bucket(url), endpoint_url=url, multipart_threshold=5 * MiB, part_size=5 * MiB)
    return S3Tier(config, name="cloud", client=client(url), **({"faults": faults} if faults else {}))


def assert_restores(tiers, step, shapes=BIG):
    full = full_state(step, shapes)
    manifest = find_manifest(tiers, step)
    for needs in needs_of(rank_states(full, 3, shapes)):       # always into a new layout
        state, _ = restore(manifest, needs, tiers)
        assert_bit_exact(state, full)


# which tiers committed step 2 when the fault hit at each point (keepers first, then the cloud)
EXPECTED = {"snapshot_copy": (1, 1), "snapshot_write": (1, 1), "replicate": (1, 1), "upload": (2, 1),
            "upload_part": (2, 1), "before_manifest_commit": (1, 1), "after_manifest_commit": (2, 1)}


@pytest.mark.parametrize("point", POINTS)
def test_a_fault_never_yields_a_partial_step_nor_loses_a_committed_one(s3_url, point):
    assert set(EXPECTED) == set(POINTS)
    faults = Faults()
    job = MiniJob(NODES, ["a", "b"], s3_cloud(s3_url, faults), faults=faults)
    job.save(1, rank_states(full_state(1, BIG), 2, BIG))
    job.faults.arm_next(point)
    with pytest.raises(InjectedFault, match=point):
        job.save(2, rank_states(full_state(2, BIG), 2, BIG))
    keepers = list(job.keepers.values())
    assert (latest_committed_step(keepers), latest_committed_step([job.cloud])) == EXPECTED[point]
    assert_restores(keepers, EXPECTED[point][0])
    assert_restores([job.cloud], 1)                             # the committed step is intact
    # the job retries the step; then old steps may go, and only then
    job.save(2, rank_states(full_state(2, BIG), 2, BIG))
    for tier in job.all_tiers():
        report = collect_garbage(tier, keep_last=1)
        assert report.kept_steps == [2] and report.deleted_steps == [1]
    assert latest_committed_step(job.all_tiers()) == 2 and job.cloud.pending_multipart() == []
    assert_restores([job.cloud], 2)
    job.close()


def test_latest_committed_step_ignores_partial_steps_and_damaged_manifests(tmp_path):
    cloud = LocalDirTier(tmp_path, name="cloud")
    job = MiniJob(NODES, ["a", "b"], cloud)
    for step in (1, 2):
        job.save(step, rank_states(full_state(step), 2))
    cloud.put_chunk("step-0000000003/layers.0.mlp.fc2.bias/0-5", b"partial: no manifest")
    assert latest_committed_step([cloud]) == 2
    damaged = bytearray(cloud.get_manifest(2))
    damaged[len(damaged) // 2] ^= 0x04
    (tmp_path / "manifests" / "step-0000000002.json").write_bytes(bytes(damaged))
    scan = scan_manifests([cloud])
    assert sorted(scan.steps) == [1] and "cloud step 2" in scan.rejected[0]
    assert latest_committed_step([cloud]) == 1
    assert latest_committed_step(job.all_tiers()) == 2           # the keepers still hold a valid one
    assert_restores(job.all_tiers(), 2, SHAPES)
    job.close()


def test_collect_garbage_never_touches_the_newest_committed_or_newer_steps(tmp_path):
    cloud = LocalDirTier(tmp_path, name="cloud")
    job = MiniJob(NODES, ["a", "b"], cloud)
    for step in (1, 2, 4):
        job.save(step, rank_states(full_state(step), 2))
    cloud.put_chunk("step-0000000003/x/s", b"abandoned")           # older than the newest committed
    cloud.put_chunk("step-0000000005/x/s", b"being written")       # newer: must stay
    report = collect_garbage(cloud, keep_last=2)
    assert report.kept_steps == [2, 4] and report.deleted_steps == [1] and report.deleted_partial_steps == [3]
    assert cloud.list_manifests() == [2, 4] and cloud.has("step-0000000005/x/s")
    assert not cloud.list("step-0000000001/") and not cloud.list("step-0000000003/")
    assert_restores([cloud], 2, SHAPES)
    assert collect_garbage(LocalDirTier(tmp_path / "empty"), keep_last=1).deleted_chunks == 0
    job.close()


def test_collect_garbage_keeps_a_step_still_being_copied_from_the_tier(tmp_path):
    store = LocalDirTier(tmp_path, name="node-store")
    job = MiniJob(NODES, ["a", "b"], store)
    for step in (1, 2, 3, 4):
        job.save(step, rank_states(full_state(step), 2))
    report = collect_garbage(store, keep_last=2, in_use=frozenset({1}))   # step 1's upload still reads it here
    assert report.deleted_steps == [2] and store.list_manifests() == [1, 3, 4]
    assert_restores([store], 1, SHAPES)
    assert collect_garbage(store, keep_last=2).deleted_steps == [1]        # once the upload is done
    job.close()


def test_concurrent_commits_of_one_step_on_s3_have_one_winner(s3_url):
    cloud = s3_cloud(s3_url)
    outcomes = []

    def commit(body):
        try:
            cloud.put_manifest(9, body)
            outcomes.append("won")
        except ManifestExistsError:
            outcomes.append("lost")

    threads = [threading.Thread(target=commit, args=(f"manifest {i}".encode(),)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["lost", "lost", "lost", "won"]
    assert cloud.get_manifest(9).startswith(b"manifest ")


class _Unreachable(LocalDirTier):
    def put_manifest(self, step, body):
        from autohet_ray.checkpoint.errors import TierUnavailableError
        raise TierUnavailableError(self.name, "keeper died")


def test_commit_reaches_every_reachable_tier_and_reports_the_rest(tmp_path):
    from autohet_ray.checkpoint import commit_step
    from autohet_ray.checkpoint.errors import TierUnavailableError
    from autohet_ray.checkpoint.manifest import ChunkRecord
    from autohet_ray.layout import Chunk
    record = ChunkRecord(step=3, name="w", global_shape=(2,), chunk=Chunk.whole((2,)), dtype="float32",
                         digest="xxh3-128:00", nbytes=72, replicas=("a",))
    good, dead, later = LocalDirTier(tmp_path / "a", name="a"), _Unreachable(tmp_path / "b", name="b"), \
        LocalDirTier(tmp_path / "c", name="c")
    with pytest.raises(TierUnavailableError, match="keeper died"):
        commit_step(3, [record], [dead, good])
    missed = []
    commit_step(3, [record], [good, dead, later], on_unavailable=lambda tier, err: missed.append(tier.name))
    assert missed == ["b"] and good.list_manifests() == [3] and later.list_manifests() == [3]
