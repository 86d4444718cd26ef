"""Money: GPU prices ($ per GPU-hour, on-demand and spot, per device type), what a plan costs per hour and per
million tokens, and the goal a plan is chosen for (throughput, $ per token, throughput under a budget, or cost
above a throughput floor). Billing: a plan pays for the GPUs it uses, each at its node's price (the node's
`spot` flag picks the spot price); GPUs it leaves out are not rented (or are released)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from autohet_ray import ConfigError
from autohet_ray.cluster.spec import Cluster
from autohet_ray.config_io import read_structured
from autohet_ray.plan.schema import Plan

OBJECTIVES = ("throughput", "cost")


@dataclass(frozen=True, kw_only=True)
class Price:
    on_demand: float
    spot: float
    source: str = ""


def prices_from_dict(raw, source: str = "<prices>") -> dict[str, Price]:
    """{device type: Price} from a prices file's contents ({prices: {TYPE: {on_demand, spot}}})."""
    if not isinstance(raw, dict) or not isinstance(raw.get("prices"), dict):
        raise ConfigError(f"{source}: a prices file needs 'prices: {{GPU type: {{on_demand: .., spot: ..}}}}'")
    out = {}
    for device, row in raw["prices"].items():
        if not isinstance(row, dict) or not {"on_demand", "spot"} <= set(row):
            raise ConfigError(f"{source}: prices.{device} needs on_demand and spot (USD per GPU-hour)")
        values = [row["on_demand"], row["spot"]]
        if any(isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < math.inf for v in values):
            raise ConfigError(f"{source}: prices.{device} on_demand/spot must be finite numbers >= 0, got {values}")
        out[str(device)] = Price(on_demand=float(row["on_demand"]), spot=float(row["spot"]),
                                 source=str(row.get("source", "")))
    return out


def load_prices(path: str) -> dict[str, Price]:
    return prices_from_dict(read_structured(path, "prices"), source=path)


def check_priced(cluster: Cluster, prices: dict[str, Price]) -> None:
    """ConfigError naming the cluster's device types the price list lacks."""
    missing = [d for d in cluster.device_types() if d not in prices]
    if missing:
        raise ConfigError(f"the prices file has no price for {', '.join(missing)} (cluster {cluster.name!r}); "
                          f"priced: {', '.join(sorted(prices)) or 'none'}")


def node_gpu_price(cluster: Cluster, prices: dict[str, Price], node: str) -> float:
    """$ per GPU-hour on `node` (spot or on-demand, as the node is marked)."""
    n = cluster.node(node)
    price = prices[n.device]
    return price.spot if n.spot else price.on_demand


def plan_usd_per_hour(plan: Plan, cluster: Cluster, prices: dict[str, Price]) -> float:
    """What the GPUs a plan uses cost per hour."""
    return sum(s.tp * node_gpu_price(cluster, prices, s.node) for p in plan.pipelines for s in p.stages)


def cluster_usd_per_hour(cluster: Cluster, prices: dict[str, Price]) -> float:
    return sum(n.count * node_gpu_price(cluster, prices, n.name) for n in cluster.nodes)


def usd_per_million_tokens(usd_per_hour: float, samples_per_s: float, seq_len: int) -> float:
    return usd_per_hour / 3600 / (samples_per_s * seq_len) * 1e6 if samples_per_s > 0 else math.inf


@dataclass(frozen=True, kw_only=True)
class Goal:
    """What the planner optimizes. `objective` "throughput" maximizes samples/s, "cost" minimizes $ per token;
    `max_usd_per_hour` (a budget: then the most samples/s within it) and `min_samples_per_s` (a floor: then the
    least $ per token above it) constrain either. Every goal but plain throughput needs `prices`."""
    objective: str = "throughput"
    prices: dict[str, Price] | None = None
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
    """A Goal from plain settings (a prices file path or its contents), checked against `cluster`'s types."""
    table = None
    if isinstance(prices, str):
        table = load_prices(prices)
    elif prices is not None:
        table = prices_from_dict(prices)
    goal = Goal(objective=objective, prices=table, max_usd_per_hour=max_usd_per_hour,
                min_samples_per_s=min_samples_per_s)
    if table is not None and cluster is not None:
        check_priced(cluster, table)
    return goal
