"""The node's cache of s3:// datasets: concurrent downloads of one dataset (jobs starting together) each write
under a name of their own and rename, against a real S3 API (moto); the cache keeps to its size cap by evicting
the least recently used datasets that no running job holds."""
from __future__ import annotations

import os
import pathlib
import threading

import numpy as np
import pytest

from autohet_ray.checkpoint.node_store import STORE_ENV
from autohet_ray.data import Dataset
from autohet_ray.data.writer import DatasetWriter
from autohet_ray.storage.dataset_cache import dataset_cache_dir, held_dataset
from autohet_ray.storage.dataset_cache import DatasetHold, evict_to_cap
from autohet_ray.storage.datasets import download_dataset

from s3_server import CREDENTIALS, client, moto_endpoint, new_bucket  # noqa: E402

SHARDS = 12


@pytest.fixture(scope="module")
def s3():
    with moto_endpoint() as url:
        yield url


@pytest.fixture(autouse=True)
def _credentials(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", CREDENTIALS["aws_access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", CREDENTIALS["aws_secret_access_key"])
    monkeypatch.setenv("AWS_DEFAULT_REGION", CREDENTIALS["region_name"])


def upload_dataset(url: str, name: str, tokens_per_shard: int = 20_000) -> str:
    """A dataset of SHARDS shards written straight into a new bucket; its s3:// URL."""
    bucket, s3 = new_bucket(url), client(url)
    writer = DatasetWriter(lambda key, data: s3.put_object(Bucket=bucket, Key=f"{name}/{key}", Body=data),
                           tokenizer_json="{}", vocab_size=1000, eos_id=0, mask_id=None)
    rng = np.random.default_rng(len(name))
    for _ in range(SHARDS):
        writer.add_shard(rng.integers(0, 1000, tokens_per_shard).astype("<u2"), 1)
    writer.finish(val_fraction=0.0)
    return f"s3://{bucket}/{name}"


def test_concurrent_downloads_of_one_dataset_share_the_cache(s3, tmp_path):
    data = upload_dataset(s3, "corpus")
    cache = str(tmp_path / "cache")
    start, errors = threading.Barrier(4), []

    def download():
        start.wait(30)
        try:
            download_dataset(data, cache, endpoint_url=s3)
        except Exception as exc:                   # noqa: BLE001 - a collision is the finding
            errors.append(exc)
    threads = [threading.Thread(target=download) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert len(Dataset.open(cache).index.shards) == SHARDS
    assert not [f for f in os.listdir(cache) if f.endswith(".partial")]


def _fake_dataset(root: pathlib.Path, name: str, size: int, used: float) -> str:
    path = root / name
    path.mkdir(parents=True)
    (path / "shard-00000.bin").write_bytes(b"x" * size)
    (root / f"{name}.lock").touch()
    os.utime(root / f"{name}.lock", (used, used))
    return str(path)


def test_eviction_takes_the_least_recently_used_that_no_job_holds(tmp_path):
    oldest = _fake_dataset(tmp_path, "a", 1000, used=100)
    older = _fake_dataset(tmp_path, "b", 1000, used=200)
    newest = _fake_dataset(tmp_path, "c", 1000, used=300)
    hold = DatasetHold(oldest)                   # a running job trains on the oldest one (and touches it)
    os.utime(oldest + ".lock", (50, 50))
    try:
        assert evict_to_cap(str(tmp_path), cap_bytes=2000) == [older]
        assert os.path.isdir(oldest) and os.path.isdir(newest) and not os.path.exists(older)
        assert evict_to_cap(str(tmp_path), cap_bytes=1000) == [newest]   # over the cap, but `a` is held
        assert os.path.isdir(oldest)
    finally:
        hold.release()
    assert evict_to_cap(str(tmp_path), cap_bytes=0) == [oldest]         # released: it may go now
    assert os.listdir(tmp_path) == []


def test_a_jobs_dataset_evicts_an_unheld_one_over_the_cap(s3, tmp_path, monkeypatch):
    monkeypatch.setenv(STORE_ENV, str(tmp_path / "store"))
    first, second = upload_dataset(s3, "first", 5_000), upload_dataset(s3, "second", 5_000)
    cap_gb = 1.5 * SHARDS * 5_000 * 2 / 1e9      # room for one dataset, not two
    path, hold = held_dataset(first, s3, cache_gb=cap_gb)
    assert path == dataset_cache_dir(first, str(tmp_path / "store"))
    _, second_hold = held_dataset(second, s3, cache_gb=cap_gb)          # `first` is held: it stays
    assert os.path.isdir(path)
    hold.release()
    second_hold.release()
    again, third_hold = held_dataset(second, s3, cache_gb=cap_gb)       # nothing holds `first`: evicted
    third_hold.release()
    assert not os.path.exists(path) and os.path.isdir(again)
