"""The testbed file: a heterogeneous cluster made of CPU shares and shaped links on one machine.

    name: paper-mix
    reserve_cores: 0.3          # left to Ray's own processes, the driver and the S3 server (default 0.3)
    classes:                    # device class (a catalog GPU it stands for) -> CPU share of one core per device
      H800: {share: 0.90}
      A100-80GB: {share: 0.284}
    nodes:
      - {name: h800, class: H800, count: 1, nic_mbit: 400}
      - {name: a100, class: A100-80GB, count: 2, nic_mbit: 400}
    storage: {mbit: 200}        # the link of the S3 server's namespace
    cpu_weight: 1024            # cpu.shares of the whole testbed against this host's other processes

A quota caps a device at its share; it cannot give a device CPU that other processes of the host take. On a
loaded host, `cpu_weight` above the default 1024 (one ordinary process's) lets the testbed's processes take
their shares first.
A share is the fraction of one core a device's worker may use (its cgroup's quota over a short period); the
shares of all devices must fit this machine's cores with `reserve_cores` left over. Rates are Mbit/s.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from autohet_ray import ConfigError
from autohet_ray.cluster.catalog import CATALOG
from autohet_ray.config_io import finite_number, mapping, read_structured, text_field, whole_number

CFS_PERIOD_US = 10_000          # 10 ms: a throttled op waits at most ~10 ms at a time, not 100 ms (the default)
CFS_MIN_QUOTA_US = 1_000        # the kernel's smallest quota
MIN_SHARE = CFS_MIN_QUOTA_US / CFS_PERIOD_US
DEFAULT_RESERVE_CORES = 0.3


@dataclass(frozen=True)
class TestbedNode:
    name: str
    device: str                 # the device class (a catalog device name)
    count: int
    share: float                # of one core, per device
    nic_mbit: float


@dataclass(frozen=True)
class Testbed:
    name: str
    nodes: tuple[TestbedNode, ...]
    storage_mbit: float
    reserve_cores: float
    cores: int                  # this machine's
    cpu_weight: int = 1024      # cpu.shares of the testbed's cgroup against the host's other processes

    @property
    def total_share(self) -> float:
        return sum(n.share * n.count for n in self.nodes)

    def node(self, name: str) -> TestbedNode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise ConfigError(f"testbed {self.name!r} has no node {name!r}; its nodes: {[n.name for n in self.nodes]}")

    def cluster_dict(self) -> dict:
        """The product's cluster file for this testbed: one node per testbed node, its NIC rate in Gb/s."""
        return {"name": f"testbed-{self.name}",
                "nodes": [{"name": n.name, "device": n.device, "count": n.count, "nic_gbps": n.nic_mbit / 1000}
                          for n in self.nodes],
                "network": {"inter_node_gbps": max(n.nic_mbit for n in self.nodes) / 1000}}

    def to_dict(self) -> dict:
        classes = {n.device: {"share": n.share} for n in self.nodes}
        return {"name": self.name, "reserve_cores": self.reserve_cores, "cpu_weight": self.cpu_weight,
                "classes": classes,
                "nodes": [{"name": n.name, "class": n.device, "count": n.count, "nic_mbit": n.nic_mbit}
                          for n in self.nodes],
                "storage": {"mbit": self.storage_mbit}}


def _rate(value, what: str) -> float:
    return finite_number(value, what, above=0)


def _node_name(raw, where: str) -> str:
    name = text_field(raw, where)
    if not name or not all(c.isalnum() or c == "-" for c in name) or len(name) > 8:
        raise ConfigError(f"{where}={name!r} must be 1-8 letters, digits or '-' (it names a network namespace)")
    return name


def parse_testbed(raw, source: str = "<testbed>", cores: int | None = None) -> Testbed:
    raw = mapping(raw, source)
    unknown = sorted(set(raw) - {"name", "reserve_cores", "cpu_weight", "classes", "nodes", "storage"})
    if unknown:
        raise ConfigError(f"{source}: unknown keys {unknown}; valid: name, reserve_cores, cpu_weight, classes, "
                          f"nodes, storage")
    weight = whole_number(raw.get("cpu_weight", 1024), f"{source}: cpu_weight", minimum=2)
    if weight > 262144:
        raise ConfigError(f"{source}: cpu_weight={weight} must lie in [2, 262144] (cgroup v1 cpu.shares)")
    cores = cores or os.cpu_count() or 1
    reserve = finite_number(raw.get("reserve_cores", DEFAULT_RESERVE_CORES), f"{source}: reserve_cores", minimum=0)
    shares = {}
    for name, cls in mapping(raw.get("classes"), f"{source}: classes").items():
        if name not in CATALOG:
            raise ConfigError(f"{source}: unknown class {name!r}; a class is named after the catalog device it "
                              f"stands for: {', '.join(sorted(CATALOG))}")
        cls = mapping(cls, f"{source}: classes.{name}")
        if set(cls) != {"share"}:
            raise ConfigError(f"{source}: classes.{name} must have exactly one key, share (of one core)")
        share = finite_number(cls["share"], f"{source}: classes.{name}.share", above=0)
        if share > 1:
            raise ConfigError(f"{source}: classes.{name}.share={share} is over one core; a device is one "
                              f"single-threaded worker: give a share in [{MIN_SHARE}, 1]")
        if share < MIN_SHARE:
            raise ConfigError(f"{source}: classes.{name}.share={share} is under {MIN_SHARE} (the smallest CPU "
                              f"quota, {CFS_MIN_QUOTA_US} us per {CFS_PERIOD_US} us period)")
        shares[name] = share
    nodes_raw = raw.get("nodes")
    if not isinstance(nodes_raw, list) or not nodes_raw:
        raise ConfigError(f"{source}: nodes must be a non-empty list")
    nodes = []
    for i, n in enumerate(nodes_raw):
        n = mapping(n, f"{source}: nodes[{i}]")
        bad = sorted(set(n) - {"name", "class", "count", "nic_mbit"})
        if bad or not {"name", "class", "nic_mbit"} <= set(n):
            raise ConfigError(f"{source}: nodes[{i}] needs name, class, nic_mbit (and count); unknown keys {bad}")
        device = text_field(n["class"], f"{source}: nodes[{i}].class")
        if device not in shares:
            raise ConfigError(f"{source}: nodes[{i}].class={device!r} is an unknown class; the file's classes: "
                              f"{sorted(shares)}")
        nodes.append(TestbedNode(name=_node_name(n["name"], f"{source}: nodes[{i}].name"), device=device,
                                 count=whole_number(n.get("count", 1), f"{source}: nodes[{i}].count", minimum=1),
                                 share=shares[device], nic_mbit=_rate(n["nic_mbit"], f"{source}: nodes[{i}].nic_mbit")))
    names = [n.name for n in nodes]
    if len(set(names)) != len(names):
        raise ConfigError(f"{source}: node names must be unique, got {names}")
    if len(nodes) > 200:
        raise ConfigError(f"{source}: {len(nodes)} nodes; at most 200 (one address each in 198.18.0.0/24)")
    storage = mapping(raw.get("storage"), f"{source}: storage")
    if set(storage) != {"mbit"}:
        raise ConfigError(f"{source}: storage must be {{mbit: RATE}} (the S3 server's link, Mbit/s)")
    bed = Testbed(name=_node_name(raw.get("name", "testbed"), f"{source}: name"), nodes=tuple(nodes),
                  storage_mbit=_rate(storage["mbit"], f"{source}: storage.mbit"), reserve_cores=reserve, cores=cores, cpu_weight=weight)
    if bed.total_share > cores - reserve + 1e-9:
        raise ConfigError(f"{source}: the devices' shares sum to {bed.total_share:.3f} cores, over the budget of "
                          f"{cores - reserve:.3f} ({cores} cores minus reserve_cores={reserve} for Ray itself)")
    return bed


def load_testbed(path: str, cores: int | None = None) -> Testbed:
    return parse_testbed(read_structured(path, "testbed"), f"testbed file {path!r}", cores)
