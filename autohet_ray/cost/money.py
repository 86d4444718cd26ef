"""Money: what instances cost ($ per instance-hour, on-demand and spot), what a plan costs per hour and per
million tokens, and the goal a plan is chosen for (throughput, $ per token, throughput under a budget, or cost
above a throughput floor).

Billing is per instance: each node of a cluster is one instance, rented whole, at its spot or on-demand price
(the node's `spot` flag picks). A plan pays for every node it uses a GPU of, whatever share of the node's GPUs
it uses (6 of 8 pay for 8); nodes it leaves out are not rented (or are released).

A prices file has either form, or both (a device priced per instance uses its instance types):
- per instance: `instances: {TYPE: {device, gpus, on_demand, spot}}`, $ per instance-hour for `gpus` GPUs of
  `device`. A node of `device` is billed as the instance type with exactly its GPU count, else the smallest
  that holds its GPUs (the cloud rents no fraction of one); no type large enough is a ConfigError.
- per GPU: `prices: {DEVICE: {on_demand, spot}}`, $ per GPU-hour. Assumption: a node is an instance of its
  own GPU count, billed at that count times the GPU's price."""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from autohet_ray import ConfigError
from autohet_ray.cluster.spec import Cluster, Node
from autohet_ray.config_io import read_structured
from autohet_ray.plan.schema import Plan

OBJECTIVES = ("throughput", "cost")
_INSTANCE_KEYS = {"device", "gpus", "on_demand", "spot", "source"}


@dataclass(frozen=True, kw_only=True)
class Price:
    """USD per hour, on-demand and spot: of one instance (Instance), or of one GPU (the per-GPU form)."""
    on_demand: float
    spot: float
    source: str = ""

    def of(self, spot: bool) -> float:
        return self.spot if spot else self.on_demand


@dataclass(frozen=True, kw_only=True)
class Instance:
    """An instance type: `gpus` GPUs of `device` at `price` per instance-hour."""
    name: str
    device: str
    gpus: int
    price: Price


@dataclass(frozen=True, kw_only=True)
class Rental:
    """What one node is billed as: one instance of `gpus` GPUs at `usd_per_hour`."""
    instance: str        # its instance type ("" in the per-GPU form: an instance of the node's own GPUs)
    gpus: int
    usd_per_hour: float


@dataclass(frozen=True)
class Prices:
    """A prices file's contents: instance types, and per-GPU prices (per device) for devices without any."""
    instances: tuple[Instance, ...] = ()
    per_gpu: tuple[tuple[str, Price], ...] = ()

    @staticmethod
    def of_gpus(per_gpu: dict[str, Price]) -> "Prices":
        return Prices(per_gpu=tuple(per_gpu.items()))

    def devices(self) -> list[str]:
        return list(dict.fromkeys([i.device for i in self.instances] + [d for d, _ in self.per_gpu]))

    @functools.cache          # the planner asks for every candidate plan; Prices are immutable
    def rental(self, device: str, gpus: int, spot: bool) -> Rental:
        """How a node of `gpus` GPUs of `device` is billed (module docstring); ConfigError when it cannot be."""
        types = [i for i in self.instances if i.device == device]
        if types:
            fits = [i for i in types if i.gpus >= gpus]
            if not fits:
                raise ConfigError(f"a node of {gpus} {device} GPUs fits no {device} instance type of the prices "
                                  f"file (the largest: {max(types, key=lambda i: i.gpus).name}, "
                                  f"{max(i.gpus for i in types)} GPUs)")
            best = min(fits, key=lambda i: (i.gpus, i.price.of(spot), i.name))
            return Rental(instance=best.name, gpus=best.gpus, usd_per_hour=best.price.of(spot))
        per_gpu = dict(self.per_gpu)
        if device not in per_gpu:
            raise ConfigError(f"the prices file has no price for {device}; priced: "
                              f"{', '.join(sorted(self.devices())) or 'none'}")
        return Rental(instance="", gpus=gpus, usd_per_hour=gpus * per_gpu[device].of(spot))


def _price(row: dict, where: str, unit: str) -> Price:
    if not {"on_demand", "spot"} <= set(row):
        raise ConfigError(f"{where} needs on_demand and spot (USD per {unit}-hour)")
    values = [row["on_demand"], row["spot"]]
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < math.inf for v in values):
        raise ConfigError(f"{where} on_demand/spot must be finite numbers >= 0, got {values}")
    return Price(on_demand=float(row["on_demand"]), spot=float(row["spot"]), source=str(row.get("source", "")))


def _instance(name, row, source: str) -> Instance:
    where = f"{source}: instances.{name}"
    if not isinstance(row, dict):
        raise ConfigError(f"{where} must be a mapping like {{device: H100, gpus: 8, on_demand: 98.32, spot: 39.33}}")
    unknown = sorted(set(row) - _INSTANCE_KEYS)
    if unknown:
        raise ConfigError(f"{where} has unknown keys {unknown}; valid: {sorted(_INSTANCE_KEYS)}")
    if "gpus" not in row:
        raise ConfigError(f"{where} needs gpus (GPUs per instance), e.g. gpus: 8")
    gpus = row["gpus"]
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ConfigError(f"{where}.gpus={gpus!r} must be a positive integer (GPUs per instance)")
    if not isinstance(row.get("device"), str) or not row["device"]:
        raise ConfigError(f"{where} needs device (its GPU type, e.g. device: H100)")
    return Instance(name=str(name), device=row["device"], gpus=gpus, price=_price(row, where, "instance"))


def prices_from_dict(raw, source: str = "<prices>") -> Prices:
    """Prices from a prices file's contents (module docstring: `instances`, `prices`, or both)."""
    if not isinstance(raw, dict) or not (isinstance(raw.get("instances"), dict) or isinstance(raw.get("prices"),
                                                                                               dict)):
        raise ConfigError(f"{source}: a prices file needs 'instances: {{TYPE: {{device: .., gpus: .., on_demand: "
                          f"..., spot: ..}}}}' ($ per instance-hour) or 'prices: {{GPU type: {{on_demand: .., spot: "
                          f"..}}}}' ($ per GPU-hour)")
    instances = tuple(_instance(name, row, source) for name, row in (raw.get("instances") or {}).items())
    per_gpu = []
    for device, row in (raw.get("prices") or {}).items():
        if not isinstance(row, dict):
            raise ConfigError(f"{source}: prices.{device} needs on_demand and spot (USD per GPU-hour)")
        per_gpu.append((str(device), _price(row, f"{source}: prices.{device}", "GPU")))
    return Prices(instances=instances, per_gpu=tuple(per_gpu))


def load_prices(path: str) -> Prices:
    return prices_from_dict(read_structured(path, "prices"), source=path)


def check_priced(cluster: Cluster, prices: Prices) -> None:
    """ConfigError naming the first node of the cluster the prices cannot bill (module docstring)."""
    missing = [d for d in cluster.device_types() if d not in prices.devices()]
    if missing:
        raise ConfigError(f"the prices file has no price for {', '.join(missing)} (cluster {cluster.name!r}); "
                          f"priced: {', '.join(sorted(prices.devices())) or 'none'}")
    for n in cluster.nodes:
        try:
            node_rental(n, prices)
        except ConfigError as err:
            raise ConfigError(f"node {n.name} of cluster {cluster.name!r}: {err}") from None


def node_rental(node: Node, prices: Prices) -> Rental:
    return prices.rental(node.device, node.count, node.spot)


def node_usd_per_hour(cluster: Cluster, prices: Prices, node: str) -> float:
    """$ per hour of `node`'s whole instance (spot or on-demand, as the node is marked)."""
    return node_rental(cluster.node(node), prices).usd_per_hour


def plan_nodes(plan: Plan) -> list[str]:
    """The nodes a plan uses a GPU of, in order of first use."""
    return list(dict.fromkeys(s.node for p in plan.pipelines for s in p.stages))


def plan_usd_per_hour(plan: Plan, cluster: Cluster, prices: Prices) -> float:
    """What the instances a plan uses cost per hour: each node it uses a GPU of, whole."""
    return sum(node_usd_per_hour(cluster, prices, n) for n in plan_nodes(plan))


def cluster_usd_per_hour(cluster: Cluster, prices: Prices) -> float:
    return sum(node_usd_per_hour(cluster, prices, n.name) for n in cluster.nodes)


def usd_per_million_tokens(usd_per_hour: float, samples_per_s: float, seq_len: int) -> float:
    return usd_per_hour / 3600 / (samples_per_s * seq_len) * 1e6 if samples_per_s > 0 else math.inf


@dataclass(frozen=True, kw_only=True)
class Goal:
    """What the planner optimizes. `objective` "throughput" maximizes samples/s, "cost" minimizes $ per token;
    `max_usd_per_hour` (a budget: then the most samples/s within it) and `min_samples_per_s` (a floor: then the
    least $ per token above it) constrain either. Every goal but plain throughput needs `prices`."""
    objective: str = "throughput"
    prices: Prices | None = None
    max_usd_per_hour: float | None = None
    min_samples_per_s: float | None = None

    def __post_init__(self):
        if self.objective not in OBJECTIVES:
            raise ConfigError(f"objective {self.objective!r}; valid: {', '.join(OBJECTIVES)}")
        for name in ("max_usd_per_hour", "min_samples_per_s"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not 0 < value < math.inf):
                raise ConfigError(f"{name}={value!r} must be a positive number")
        if self.needs_prices and self.prices is None:
            raise ConfigError("--objective cost and --max-cost-per-hour need a prices file (--prices FILE, e.g. "
                              "jobs/clusters/prices.yaml)")

    @property
    def needs_prices(self) -> bool:
        return self.objective == "cost" or self.max_usd_per_hour is not None or self.min_samples_per_s is not None

    @property
    def plain(self) -> bool:
        """Plain throughput: the planner's original objective."""
        return not self.needs_prices

    @property
    def minimizes_cost(self) -> bool:
        """$ per token is the objective (cost, or a throughput floor)."""
        return self.objective == "cost" or (self.min_samples_per_s is not None and self.max_usd_per_hour is None)

    def usd_per_hour(self, plan: Plan, cluster: Cluster) -> float:
        return plan_usd_per_hour(plan, cluster, self.prices) if self.prices is not None else 0.0

    def key(self, plan: Plan, cluster: Cluster, iteration_s: float) -> float:
        """What the planner minimizes for a plan that takes `iteration_s` per iteration (or at least that long:
        a floor gives a lower bound on the key): seconds per iteration, or $ per iteration; math.inf when the
        plan breaks the budget or the floor."""
        if self.plain:
            return iteration_s
        rate = self.usd_per_hour(plan, cluster)
        if self.max_usd_per_hour is not None and rate > self.max_usd_per_hour * (1 + 1e-9):
            return math.inf
        if self.min_samples_per_s is not None and plan.global_batch / iteration_s < self.min_samples_per_s:
            return math.inf
        return rate * iteration_s if self.minimizes_cost else iteration_s


THROUGHPUT = Goal()


def goal_from(objective: str = "throughput", prices: str | dict | None = None, max_usd_per_hour=None,
              min_samples_per_s=None, cluster: Cluster | None = None) -> Goal:
    """A Goal from plain settings (a prices file path, its contents or Prices), checked against `cluster`'s
    nodes."""
    table = None
    if isinstance(prices, str):
        table = load_prices(prices)
    elif isinstance(prices, Prices):
        table = prices
    elif prices is not None:
        table = prices_from_dict(prices)
    goal = Goal(objective=objective, prices=table, max_usd_per_hour=max_usd_per_hour,
                min_samples_per_s=min_samples_per_s)
    if table is not None and cluster is not None:
        check_priced(cluster, table)
    return goal
