"""A chunk copied between stores counts only when its bytes hash to the manifest's digest: a node store's
upload to the storage and a replica it receives refuse a corrupted chunk, report it as one line (step,
tensor, tier, reason) and do not write it."""
import pytest
import torch

from autohet_ray.checkpoint.codec import digest, encode
from autohet_ray.checkpoint.copy_check import refusal_line, report_refused
from autohet_ray.checkpoint.node_store import STORE_ENV, NodeStore
from autohet_ray.checkpoint.tier_specs import direct_tier
from autohet_ray.storage.spec import storage_spec

GOOD, BAD = "step-0000000004/layers.0.w/0_0-2_2", "step-0000000004/layers.1.w/0_0-2_2"


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv(STORE_ENV, str(tmp_path / "shm"))
    node = NodeStore("job-copy", "node-a", "keeper-a")
    blobs = {key: bytes(encode(torch.full((2, 2), float(i)))) for i, key in enumerate((GOOD, BAD))}
    node.put_many(list(blobs.items()))
    yield node, {key: digest(blob) for key, blob in blobs.items()}, blobs
    node.close()


def _flip_a_byte(node, key):
    path = node.root / key
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF
    path.write_bytes(raw)


def test_an_upload_refuses_a_chunk_that_fails_its_hash(store, tmp_path, capsys):
    node, digests, blobs = store
    _flip_a_byte(node, BAD)
    storage = direct_tier(storage_spec(str(tmp_path / "storage"), name="cloud"))
    out = node.upload_checked(digests, storage)
    assert out["copied"] == [GOOD] and out["bytes"] == len(blobs[GOOD])
    assert storage.get_chunk(GOOD) == blobs[GOOD] and not storage.has(BAD)       # not written, not counted
    [refused] = out["refused"]
    assert (refused["step"], refused["tensor"], refused["source"], refused["target"]) == \
           (4, "layers.1.w", "keeper-a", "cloud")
    assert refused["reason"].startswith("hash mismatch over")
    report_refused(out["refused"])
    line = capsys.readouterr().err
    assert line.count("\n") == 1 and line.startswith("autohet: copy refused: step 4, tensor layers.1.w")
    assert "keeper-a -> cloud: hash mismatch" in line


def test_an_upload_of_a_missing_chunk_is_refused(store, tmp_path):
    node, digests, _ = store
    node.delete(GOOD)
    out = node.upload_checked({GOOD: digests[GOOD]}, direct_tier(storage_spec(str(tmp_path / "s"))))
    assert out["copied"] == [] and out["refused"][0]["reason"] == "missing in the source store"


def test_a_replica_received_with_other_bytes_is_refused(store, tmp_path, monkeypatch):
    node, digests, blobs = store
    peer = NodeStore("job-copy", "node-b", "keeper-b")
    try:
        damaged = bytes(blobs[BAD][:-1]) + b"\x00"
        out = peer.put_checked([(GOOD, blobs[GOOD]), (BAD, damaged)], digests, "keeper-a")
        assert out["bytes"] == len(blobs[GOOD]) and peer.has(GOOD) and not peer.has(BAD)
        assert [r["key"] for r in out["refused"]] == [BAD]
        assert "keeper-a -> keeper-b" in refusal_line(out["refused"][0])
    finally:
        peer.close()
