"""The availability timeline of a replay: the pools' scaled traces merged into events.

A state is the number of nodes alive per pool, in the pools' order. An event is a time at which the state
changes; pools changing at the same second make one event.
"""
from __future__ import annotations

from dataclasses import dataclass

from autohet_ray import ConfigError
from autohet_ray.replay.traces import PoolTrace

State = tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class Event:
    index: int
    time_s: float
    before: State
    after: State

    @property
    def removed(self) -> tuple[int, ...]:
        """Nodes lost per pool (0 where none)."""
        return tuple(max(0, b - a) for b, a in zip(self.before, self.after))

    @property
    def added(self) -> tuple[int, ...]:
        return tuple(max(0, a - b) for b, a in zip(self.before, self.after))


@dataclass(frozen=True, kw_only=True)
class Timeline:
    pools: tuple[str, ...]          # device type of each pool
    pool_nodes: tuple[int, ...]     # nodes of each pool when all are alive
    window_s: float
    initial: State
    events: tuple[Event, ...]

    def segments(self) -> list[tuple[float, float, State]]:
        """(start, end, state) pieces covering [0, window_s)."""
        times = [0.0] + [e.time_s for e in self.events] + [self.window_s]
        states = [self.initial] + [e.after for e in self.events]
        return [(a, b, s) for a, b, s in zip(times, times[1:], states)]

    def distinct_states(self) -> list[State]:
        return list(dict.fromkeys([self.initial] + [e.after for e in self.events]))


def build_timeline(pools: list[PoolTrace], window_s: float) -> Timeline:
    if not pools:
        raise ConfigError("a replay needs at least one pool")
    if len({p.pool for p in pools}) != len(pools):
        raise ConfigError(f"each GPU type may have one pool only; got {[p.pool for p in pools]}")
    if window_s <= 0:
        raise ConfigError(f"the replay window {window_s} s must be positive")
    state_at = lambda t: tuple(p.nodes_at(t) for p in pools)  # noqa: E731
    initial = state_at(0.0)
    if not any(initial):
        raise ConfigError("no node of any pool is alive at the start of the replay")
    times = sorted({t for p in pools for t in p.change_times(window_s)})
    events, current = [], initial
    for t in times:
        after = state_at(t)
        if after != current:               # a trace change can round to the same node count
            events.append(Event(index=len(events), time_s=t, before=current, after=after))
            current = after
    return Timeline(pools=tuple(p.pool for p in pools), pool_nodes=tuple(p.nodes for p in pools),
                    window_s=window_s, initial=initial, events=tuple(events))
