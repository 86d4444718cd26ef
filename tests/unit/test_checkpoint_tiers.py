"""Every tier behaves the same behind the Tier interface; S3 runs against a real S3 API (moto server)."""

import pytest

from autohet_ray import ConfigError
from autohet_ray.checkpoint import ChunkMissingError, LocalDirTier, ManifestExistsError, MemoryTier, Tier
from autohet_ray.checkpoint.tiers import ThrottledTier, TokenBucket
from autohet_ray.checkpoint.tiers.s3 import MiB, S3Config, S3Tier

from s3_server import client, moto_endpoint, new_bucket  # noqa: E402


@pytest.fixture(scope="module")
def s3_url():
    with moto_endpoint() as url:
        yield url


def s3_tier(url, **overrides):
    config = S3Config(bucket=new_bucket(url), prefix="job-1/", endpoint_url=url,
                      multipart_threshold=5 * MiB, part_size=5 * MiB, **overrides)
    return S3Tier(config, client=client(url))


@pytest.fixture(params=["memory", "memory-spill", "localdir", "s3", "throttled-localdir"])
def tier(request, tmp_path, s3_url):
    kind = request.param
    if kind == "memory":
        return MemoryTier("node-a")
    if kind == "memory-spill":
        return MemoryTier("node-a", max_bytes=10, spill_dir=tmp_path / "spill")
    if kind == "localdir":
        return LocalDirTier(tmp_path / "cloud", name="cloud")
    if kind == "s3":
        return s3_tier(s3_url)
    return ThrottledTier(LocalDirTier(tmp_path / "cloud"), rate_bytes_per_s=100 * MiB)


def test_chunks_put_get_has_list_delete(tier):
    assert isinstance(tier, Tier)
    keys = ["step-0000000001/a/0-4", "step-0000000001/b/s", "step-0000000002/a/0-4"]
    for i, key in enumerate(keys):
        tier.put_chunk(key, bytes([i]) * (8 + i))
    assert tier.get_chunk(keys[1]) == bytes([1]) * 9
    assert tier.has(keys[0]) and not tier.has("step-0000000001/zz/0-1")
    assert tier.list("step-0000000001/") == keys[:2]
    assert tier.list() == keys
    tier.put_chunk(keys[0], b"replaced")
    assert tier.get_chunk(keys[0]) == b"replaced"
    tier.delete(keys[0])
    tier.delete(keys[0])                                   # idempotent
    assert not tier.has(keys[0])
    with pytest.raises(ChunkMissingError, match="step-0000000001/a/0-4"):
        tier.get_chunk(keys[0])



def test_delete_many_removes_exactly_the_keys_named(tier):
    keys = [f"step-0000000003/t{i}/0-4" for i in range(7)] + ["step-0000000004/t0/0-4"]
    for key in keys:
        tier.put_chunk(key, b"x" * 16)
    tier.delete_many(keys[:7] + ["step-0000000003/never-written/0-1"])    # absent keys are fine
    tier.delete_many([])
    assert tier.list() == keys[7:]
    assert tier.get_chunk(keys[7]) == b"x" * 16


def test_s3_delete_many_batches_past_the_request_limit(s3_url, monkeypatch):
    import autohet_ray.checkpoint.tiers.s3 as s3
    monkeypatch.setattr(s3, "S3_DELETE_BATCH", 3)          # 8 keys: three DeleteObjects requests
    tier = s3_tier(s3_url)
    calls = []
    real = tier.client.delete_objects
    tier.client.delete_objects = lambda **kw: calls.append(len(kw["Delete"]["Objects"])) or real(**kw)
    keys = [f"step-0000000005/t{i}/0-4" for i in range(8)]
    for key in keys:
        tier.put_chunk(key, b"y")
    tier.delete_many(keys)
    assert calls == [3, 3, 2] and tier.list() == []

def test_manifest_is_created_once(tier):
    assert tier.list_manifests() == []
    tier.put_manifest(5, b'{"m": 1}')
    tier.put_manifest(5, b'{"m": 1}')                      # the same body again: a no-op
    with pytest.raises(ManifestExistsError, match="step 5"):
        tier.put_manifest(5, b'{"m": 2}')
    assert tier.get_manifest(5) == b'{"m": 1}'
    tier.put_manifest(3, b"x")
    assert tier.list_manifests() == [3, 5]
    assert tier.list() == []                               # manifests are not chunks
    tier.delete_manifest(3)
    assert tier.list_manifests() == [5]
    with pytest.raises(ChunkMissingError):
        tier.get_manifest(3)


def test_memory_tier_spills_oldest_chunks_and_still_serves_them(tmp_path):
    tier = MemoryTier("node-a", max_bytes=100, spill_dir=tmp_path)
    for i in range(5):
        tier.put_chunk(f"step-0000000001/t{i}/s", bytes([i]) * 40)
    usage = tier.usage()
    assert usage["resident_bytes"] <= 100 and usage["spilled_chunks"] == 3
    assert [tier.get_chunk(f"step-0000000001/t{i}/s") for i in range(5)] == [bytes([i]) * 40 for i in range(5)]
    with pytest.raises(ConfigError, match="max_bytes and spill_dir"):
        MemoryTier("x", max_bytes=5)


def test_localdir_leaves_no_temporaries_and_sweeps_abandoned_ones(tmp_path):
    tier = LocalDirTier(tmp_path)
    tier.put_chunk("step-0000000001/a/s", b"abc")
    tier.put_manifest(1, b"m")
    assert not [p for p in tmp_path.rglob(".*")]
    abandoned = tmp_path / "step-0000000002" / "a" / ".s.tmp-dead"      # a writer died before its rename
    abandoned.parent.mkdir(parents=True)
    abandoned.write_bytes(b"partial")
    assert tier.list() == ["step-0000000001/a/s"]
    assert tier.sweep_temporaries(older_than_s=3600) == []
    assert tier.sweep_temporaries(older_than_s=-1) == ["step-0000000002/a/.s.tmp-dead"]


def test_s3_multipart_round_trip_and_config_errors(s3_url):
    tier = s3_tier(s3_url, num_upload_threads=3)
    big = bytes(range(256)) * (11 * MiB // 256 + 7)          # 3 parts, the last one short
    tier.put_chunk("step-0000000001/big/0-1", big)
    assert tier.get_chunk("step-0000000001/big/0-1") == big
    assert tier.pending_multipart() == []
    tier.put_chunk("step-0000000001/empty/s", b"")
    assert tier.get_chunk("step-0000000001/empty/s") == b""
    with pytest.raises(ConfigError, match="part_size must be >= 5 MiB"):
        S3Config(bucket="b", part_size=MiB)
    with pytest.raises(ConfigError, match="prefix must be empty or end with '/'"):
        S3Config(bucket="b", prefix="jobs")


def test_token_bucket_caps_the_rate():
    now = [0.0]

    def sleep(seconds):
        now[0] += seconds

    bucket = TokenBucket(20 * MiB, burst_bytes=MiB, clock=lambda: now[0], sleep=sleep)
    for _ in range(8):
        bucket.consume(5 * MiB)                               # 40 MiB at 20 MiB/s
    assert 1.9 <= now[0] <= 2.0 and bucket.total_bytes == 40 * MiB
    with pytest.raises(ConfigError, match="rate must be > 0"):
        TokenBucket(0)


def test_throttled_tier_really_waits(tmp_path):
    import time
    tier = ThrottledTier(LocalDirTier(tmp_path), rate_bytes_per_s=4 * MiB, burst_bytes=256 * 1024)
    start = time.perf_counter()
    tier.put_chunk("step-0000000001/a/s", bytes(MiB))
    assert tier.get_chunk("step-0000000001/a/s") == bytes(MiB)
    assert 0.35 <= time.perf_counter() - start <= 5.0        # ~2 MiB at 4 MiB/s, minus the burst (slack: shared CPUs)
