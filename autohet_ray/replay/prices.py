"""GPU prices (USD per GPU-hour, spot and on-demand) and what a replay's fleet cost."""
from __future__ import annotations

from autohet_ray import ConfigError
from autohet_ray.cost.money import Price, load_prices, prices_from_dict  # noqa: F401  (re-exported)
from autohet_ray.replay.timeline import Timeline


def fleet_cost_usd(timeline: Timeline, gpus_per_node: tuple[int, ...], spot_pools: tuple[bool, ...],
                   prices: dict[str, Price]) -> float:
    """What the alive nodes cost over the replay: spot pools at the spot price, the others on demand.
    Every system of a replay pays this: the nodes are held whether or not the job uses them."""
    missing = sorted(set(timeline.pools) - set(prices))
    if missing:
        raise ConfigError(f"no price for GPU type(s) {missing}; priced: {sorted(prices)}")
    total = 0.0
    for start, end, state in timeline.segments():
        for pool, nodes, gpus, spot in zip(timeline.pools, state, gpus_per_node, spot_pools):
            price = prices[pool].spot if spot else prices[pool].on_demand
            total += nodes * gpus * price * (end - start) / 3600
    return total


def on_demand_cost_usd(timeline: Timeline, gpus_per_node: tuple[int, ...], prices: dict[str, Price]) -> float:
    """Every node of every pool, alive for the whole replay, at the on-demand price."""
    return sum(nodes * gpus * prices[pool].on_demand * timeline.window_s / 3600
               for pool, nodes, gpus in zip(timeline.pools, timeline.pool_nodes, gpus_per_node))


def usd_per_million_tokens(usd: float, samples: float, seq_len: int) -> float | None:
    return round(usd / (samples * seq_len) * 1e6, 4) if samples > 0 else None


def held_cost_usd(held, pools: tuple[str, ...], gpus_per_node: tuple[int, ...], spot_pools: tuple[bool, ...],
                  prices: dict[str, Price]) -> float:
    """What the nodes a job held cost ((start, end, nodes per pool) pieces; the fleet's other nodes released)."""
    per_node_s = [gpus * (prices[p].spot if spot else prices[p].on_demand) / 3600
                  for p, gpus, spot in zip(pools, gpus_per_node, spot_pools)]
    return sum((end - start) * sum(n * c for n, c in zip(nodes, per_node_s)) for start, end, nodes in held)
