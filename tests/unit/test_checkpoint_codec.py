"""Chunk serialization, hashing and keys."""
import pytest
import torch

from autohet_ray import ConfigError
from autohet_ray.checkpoint.codec import decode, digest, encode, verify
from autohet_ray.checkpoint.errors import CorruptChunkError
from autohet_ray.checkpoint.keys import chunk_key, manifest_key, step_of_key, step_of_manifest_key
from autohet_ray.layout import Chunk

TENSORS = [
    torch.arange(12, dtype=torch.float32).reshape(3, 4),
    torch.randn(5, 3).to(torch.bfloat16),
    torch.tensor([True, False, True]),
    torch.tensor(7, dtype=torch.int64),               # scalar, e.g. optim.step
    torch.empty(0, 4, dtype=torch.float16),           # an empty chunk of an uneven split
    torch.arange(24, dtype=torch.float64).reshape(2, 3, 4).transpose(0, 2),   # non-contiguous
]


@pytest.mark.parametrize("tensor", TENSORS, ids=lambda t: f"{t.dtype}{list(t.shape)}")
def test_round_trip_is_bit_exact(tensor):
    blob = encode(tensor)
    verify(blob, digest(blob), key="k", step=1, tier="t")
    back = decode(blob, key="k", step=1, tier="t")
    assert back.dtype == tensor.dtype and back.shape == tensor.shape
    assert encode(back) == blob                                   # bit-exact, whatever the dtype
    assert torch.equal(back, tensor.contiguous())
    back.zero_()                                                  # writable, owns its memory
    assert encode(back) != blob or tensor.numel() == 0 or not tensor.any()


def test_flipped_bit_and_truncation_are_detected_with_chunk_and_step_named():
    blob = encode(torch.randn(64))
    good = digest(blob)
    flipped = bytearray(blob)
    flipped[len(blob) // 2] ^= 0x10
    with pytest.raises(CorruptChunkError, match=r"chunk 'step-1/w/0-64' of step 7 from tier 'cloud'.*hash mismatch"):
        verify(bytes(flipped), good, key="step-1/w/0-64", step=7, tier="cloud")
    with pytest.raises(CorruptChunkError, match="hash mismatch"):
        verify(blob[:-3], good, key="k", step=7, tier="cloud")
    with pytest.raises(CorruptChunkError, match="payload has"):
        decode(blob[:-4], key="k", step=7, tier="cloud")
    with pytest.raises(CorruptChunkError, match="magic"):
        decode(blob[:5], key="k", step=7, tier="cloud")


def test_header_is_covered_by_the_hash():
    a, b = encode(torch.zeros(2, 3)), encode(torch.zeros(3, 2))
    assert a != b and digest(a) != digest(b)


def test_keys():
    key = chunk_key(12, "layers.3.mlp.fc1.weight", Chunk((0, 512), (512, 1024)))
    assert key == "step-0000000012/layers.3.mlp.fc1.weight/0_512-512_1024"
    assert step_of_key(key) == 12 and step_of_key("manifests/x") is None
    assert chunk_key(3, "optim.step", Chunk((), ())) == "step-0000000003/optim.step/s"
    assert step_of_manifest_key(manifest_key(42)) == 42
    with pytest.raises(ConfigError, match="tensor name '../etc'"):
        chunk_key(1, "../etc", Chunk((0,), (1,)))


def test_older_blake2b_digests_still_verify_and_unknown_algorithms_are_named():
    import hashlib
    blob = encode(torch.randn(16))
    old = "blake2b-256:" + hashlib.blake2b(blob, digest_size=32).hexdigest()
    verify(blob, old, key="k", step=1, tier="t")
    assert digest(blob).startswith("xxh3-128:")
    with pytest.raises(CorruptChunkError, match="unknown hash algorithm 'md4'"):
        verify(blob, "md4:00", key="k", step=1, tier="t")


def test_payload_is_aligned_and_big_chunks_decode_from_a_private_mapping(tmp_path):
    from autohet_ray.checkpoint.tiers.localdir import MMAP_MIN_BYTES, LocalDirTier
    tensor = torch.randn(MMAP_MIN_BYTES // 4 + 5)
    blob = encode(tensor)
    assert (len(blob) - tensor.numel() * 4) % 64 == 0                  # header padded: payload aligned
    tier = LocalDirTier(tmp_path, fsync=False)
    tier.put_chunk("step-0000000001/w/s", blob)
    mapped = tier.get_chunk("step-0000000001/w/s")
    assert isinstance(mapped, memoryview) and mapped == blob
    verify(mapped, digest(blob), key="k", step=1, tier="t")
    back = decode(mapped, key="k", step=1, tier="t")
    back.add_(1.0)                                                      # a private copy: the file is unchanged
    assert torch.equal(decode(tier.get_chunk("step-0000000001/w/s"), key="k", step=1, tier="t"), tensor)
    assert torch.equal(back, tensor + 1.0)
