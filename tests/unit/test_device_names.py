"""CUDA device names (as torch.cuda.get_device_name reports them) -> catalog device types."""
from __future__ import annotations

import pytest

from autohet_ray import ConfigError
from autohet_ray.cluster.device_names import catalog_type, name_tokens

GIB = 1024 ** 3


@pytest.mark.parametrize("name, memory_gib, expected", [
    ("NVIDIA H800", 79.3, "H800"),
    ("NVIDIA H800 PCIe", None, "H800"),
    ("NVIDIA H100 80GB HBM3", 79.1, "H100"),
    ("NVIDIA H100 PCIe", None, "H100"),
    ("NVIDIA H20", 95.6, "H20"),
    ("NVIDIA H200", 139.8, "H200"),
    ("NVIDIA A100-SXM4-80GB", 79.3, "A100-80GB"),
    ("NVIDIA A100-SXM4-80GB", None, "A100-80GB"),
    ("NVIDIA A100-SXM4-40GB", 39.4, "A100-40GB"),
    ("NVIDIA A100-PCIE-40GB", None, "A100-40GB"),
    ("NVIDIA A100 80GB PCIe", None, "A100-80GB"),
    ("NVIDIA A100-SXM4", 39.4, "A100-40GB"),           # no size in the name: memory decides
    ("Tesla V100-SXM2-32GB", 31.7, "V100"),
    ("NVIDIA A10", 22.1, "A10"),
    ("NVIDIA L40S", 44.5, "L40S"),
    ("NVIDIA L20", 44.5, "L20"),
    ("NVIDIA GeForce RTX 4090", 23.6, "RTX-4090"),
])
def test_real_names_map_to_catalog_types(name, memory_gib, expected):
    memory = None if memory_gib is None else int(memory_gib * GIB)
    assert catalog_type(name, memory) == expected


def test_h20_and_h200_and_a10_and_a100_are_not_confused():
    assert [catalog_type(n) for n in ("NVIDIA H20", "NVIDIA H200", "NVIDIA A10")] == ["H20", "H200", "A10"]
    with pytest.raises(ConfigError, match="memory size is needed to tell A100-40GB from A100-80GB"):
        catalog_type("NVIDIA A100-SXM4")


@pytest.mark.parametrize("name, memory_gib, message", [
    ("NVIDIA A800-SXM4-80GB", None, "unknown model 'A800'"),
    ("NVIDIA GeForce RTX 4090 D", None, r"unrecognised variant tokens \['D'\]"),
    ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", None, r"unrecognised variant tokens \['MIG', '1G.5GB'\]"),
    ("NVIDIA A10G", None, "unknown model 'A10G'"),
    ("Tesla V100-SXM2-16GB", None, r"16.0 GiB of memory does not fit catalog type V100 \(32 GB\)"),
    ("Tesla V100-PCIE-16GB", 15.8, "15.8 GiB of memory does not fit catalog type V100"),
    ("", None, "empty name"),
])
def test_unknown_or_ambiguous_names_are_refused(name, memory_gib, message):
    memory = None if memory_gib is None else int(memory_gib * GIB)
    with pytest.raises(ConfigError, match=message) as info:
        catalog_type(name, memory)
    assert "known CUDA models" in str(info.value) and "custom devices" in str(info.value)


def test_tokens_drop_vendor_words():
    assert name_tokens("NVIDIA GeForce RTX 4090") == ["RTX", "4090"]
    assert name_tokens("Tesla V100-SXM2-32GB") == ["V100", "SXM2", "32GB"]
