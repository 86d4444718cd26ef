"""Device catalog: published dense BF16, FP32 (non-tensor) and, where published, TF32 tensor figures per GPU type.

Units: TFLOPS dense (no sparsity), memory in GB (10^9 bytes, as vendors publish), HBM bandwidth in GB/s,
GPU-to-GPU link in GB/s as published (NVLink figures are the bidirectional aggregate per GPU; the cost
model uses half of it per direction), NIC in Gb/s per node.
Sources are the tables collected in shared/reference/gpu-specs.md: NVIDIA datasheets for V100, A10, A100,
H100, H200, L40S; philisun / aiwiki.ai for H800; willitrunai.com / zangshuxian.com for H20; topcpu.net and
1cnz.cn for L20; waredb.com for RTX 4090 (BF16 with FP32 accumulate). TF32 (dense) only where gpu-specs.md
lists it: A100 156, H100 495 (philisun), H20 74 (willitrunai.com), L40S 183 (mullet.se); the cost model prices
fp32 training at the non-tensor FP32 figure (PyTorch leaves TF32 matmuls off by default), see
profile/precision.py.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from autohet_ray import ConfigError


@dataclass(frozen=True, kw_only=True)
class DeviceType:
    name: str
    bf16_tflops: float      # dense tensor-core BF16 (V100: FP16) TFLOPS
    fp32_tflops: float      # non-tensor FP32 TFLOPS
    memory_gb: float        # device memory, GB (10^9 bytes)
    hbm_gbps: float         # memory bandwidth, GB/s
    link_gbps: float        # GPU-to-GPU inside a node, GB/s bidirectional aggregate (as published)
    link_kind: str          # "nvlink" or "pcie"
    nic_gbps: float         # typical inter-node NIC per node, Gb/s
    source: str = ""
    tf32_tflops: float | None = None   # dense TF32 tensor TFLOPS, where published (None: not in the sources)

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gb * 1e9)

    def to_dict(self) -> dict:
        return asdict(self)


def _dev(name, bf16, fp32, mem, hbm, link, kind, nic, source, tf32=None) -> DeviceType:
    return DeviceType(name=name, bf16_tflops=bf16, fp32_tflops=fp32, memory_gb=mem, hbm_gbps=hbm,
                      link_gbps=link, link_kind=kind, nic_gbps=nic, source=source, tf32_tflops=tf32)


CATALOG: dict[str, DeviceType] = {d.name: d for d in [
    _dev("V100", 125, 15.7, 32, 900, 300, "nvlink", 100, "NVIDIA V100 datasheet (FP16 tensor; no BF16)"),
    _dev("V100-16GB", 125, 15.7, 16, 900, 300, "nvlink", 100,
         "NVIDIA V100 datasheet, 16 GB SXM2 (gpu-specs.md V100 row: 16/32 GB HBM2; FP16 tensor, no BF16)"),
    _dev("A10", 125, 31.2, 24, 600, 64, "pcie", 100, "NVIDIA A10 datasheet; baseten.co"),
    _dev("A100-40GB", 312, 19.5, 40, 1555, 600, "nvlink", 200, "NVIDIA A100 datasheet", tf32=156),
    _dev("A100-80GB", 312, 19.5, 80, 2039, 600, "nvlink", 200, "NVIDIA A100 datasheet", tf32=156),
    _dev("H100", 989, 67, 80, 3350, 900, "nvlink", 400, "NVIDIA H100 SXM datasheet", tf32=495),
    _dev("H800", 989, 67, 80, 3350, 400, "nvlink", 400, "philisun H800 vs H100; aiwiki.ai nvidia_h800"),
    _dev("H20", 148, 44, 96, 4000, 900, "nvlink", 400, "willitrunai.com; zangshuxian.com", tf32=74),
    _dev("H200", 989, 67, 141, 4800, 900, "nvlink", 400, "NVIDIA H200 SXM datasheet (dense = sparse/2)"),
    _dev("L40S", 362, 91.6, 48, 864, 64, "pcie", 200, "NVIDIA L40S datasheet; mullet.se", tf32=183),
    _dev("L20", 119.5, 59.8, 48, 864, 64, "pcie", 200, "topcpu.net A40 vs L20; 1cnz.cn"),
    _dev("RTX-4090", 165.2, 82.6, 24, 1008, 32, "pcie", 100,
         "waredb.com (BF16 w/ FP32 accumulate); no P2P: PCIe through host"),
]}

DEVICE_FIELDS = tuple(f.name for f in fields(DeviceType))


def device_from_dict(name: str, raw: dict) -> DeviceType:
    """A custom device type from YAML/JSON with the catalog's fields."""
    required = [f for f in DEVICE_FIELDS if f not in ("name", "source", "tf32_tflops")]
    missing = [f for f in required if f not in raw]
    if missing:
        raise ConfigError(f"custom device {name!r} is missing fields {missing}; required: {required}")
    unknown = sorted(set(raw) - set(DEVICE_FIELDS))
    if unknown:
        raise ConfigError(f"custom device {name!r} has unknown fields {unknown}; valid: {list(DEVICE_FIELDS)}")
    values = {k: raw[k] for k in DEVICE_FIELDS if k in raw and k != "name"}
    for key in required:
        if key != "link_kind" and not (isinstance(values[key], (int, float)) and values[key] > 0):
            raise ConfigError(f"custom device {name!r}: {key}={values[key]!r} must be a positive number")
    if values["link_kind"] not in ("nvlink", "pcie"):
        raise ConfigError(f"custom device {name!r}: link_kind={values['link_kind']!r}; valid: nvlink, pcie")
    return DeviceType(name=name, **values)


def lookup(name: str, custom: dict[str, DeviceType] | None = None) -> DeviceType:
    table = {**CATALOG, **(custom or {})}
    if name not in table:
        raise ConfigError(f"unknown device {name!r}; known devices: {', '.join(sorted(table))}")
    return table[name]
