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
