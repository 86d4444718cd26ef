"""What a replay's fleet cost: every node is one instance, billed whole (cost/money.py), spot pools at the spot
price and the others on demand."""
from __future__ import annotations

from autohet_ray.cost.money import Prices, load_prices, prices_from_dict  # noqa: F401  (re-exported)
from autohet_ray.replay.timeline import Timeline


def node_usd_per_s(prices: Prices, pools: tuple[str, ...], gpus_per_node: tuple[int, ...],
                   spot_pools: tuple[bool, ...]) -> list[float]:
    """$ per second of one node of each pool (its whole instance); ConfigError when a pool cannot be billed."""
    return [prices.rental(pool, gpus, spot).usd_per_hour / 3600
            for pool, gpus, spot in zip(pools, gpus_per_node, spot_pools)]


def fleet_cost_usd(timeline: Timeline, gpus_per_node: tuple[int, ...], spot_pools: tuple[bool, ...],
                   prices: Prices) -> float:
    """What the alive nodes cost over the replay. Every system of a replay pays this: the nodes are held
    whether or not the job uses them."""
    per_node_s = node_usd_per_s(prices, timeline.pools, gpus_per_node, spot_pools)
    return sum((end - start) * sum(n * c for n, c in zip(state, per_node_s))
               for start, end, state in timeline.segments())


def on_demand_cost_usd(timeline: Timeline, gpus_per_node: tuple[int, ...], prices: Prices) -> float:
    """Every node of every pool, alive for the whole replay, at the on-demand price."""
    per_node_s = node_usd_per_s(prices, timeline.pools, gpus_per_node, (False,) * len(timeline.pools))
    return sum(n * c for n, c in zip(timeline.pool_nodes, per_node_s)) * timeline.window_s


def usd_per_million_tokens(usd: float, samples: float, seq_len: int) -> float | None:
    return round(usd / (samples * seq_len) * 1e6, 4) if samples > 0 else None


def held_cost_usd(held, pools: tuple[str, ...], gpus_per_node: tuple[int, ...], spot_pools: tuple[bool, ...],
                  prices: Prices) -> float:
    """What the nodes a job held cost ((start, end, nodes per pool) pieces; the fleet's other nodes released)."""
    per_node_s = node_usd_per_s(prices, pools, gpus_per_node, spot_pools)
    return sum((end - start) * sum(n * c for n, c in zip(nodes, per_node_s)) for start, end, nodes in held)
