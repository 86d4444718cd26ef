"""Spot availability traces: load a `seconds,instances` step function and scale it to a pool of nodes.

A trace file (e.g. the Bamboo project's AWS traces in shared/traces/) lists from which second on how many
instances of one requested pool ran; two rows with the same second mark a change. The hours before the first
instance was granted are dropped: a trace starts (t = 0) at its first non-zero row.

Scaling (documented in the replay's output): a pool of N nodes follows a trace requested at R instances by
keeping the same fraction alive, nodes(t) = round(N * instances(t) / R). R is the largest count in the trace
unless given (12 for the g4dn traces, 10 for p2: their requests).
"""
from __future__ import annotations

import bisect
import csv
import pathlib
from dataclasses import dataclass

from autohet_ray import ConfigError


@dataclass(frozen=True, kw_only=True)
class Trace:
    name: str
    times_s: tuple[float, ...]     # change times, seconds from the first grant; times_s[0] == 0
    counts: tuple[int, ...]        # instances alive from times_s[i] on
    duration_s: float              # length of the recording after the first grant
    requested: int                 # instances the pool asked for

    def count_at(self, t: float) -> int:
        """Instances alive at t (0 <= t); after the recording ends the last count holds."""
        assert t >= 0, t
        return self.counts[bisect.bisect_right(self.times_s, t) - 1]

    @property
    def num_changes(self) -> int:
        return len(self.counts) - 1


def trace_from_rows(name: str, rows: list[tuple[float, int]], requested: int | None = None) -> Trace:
    """A Trace from (second, instances) rows in time order, leading zero rows dropped."""
    if any(b[0] < a[0] for a, b in zip(rows, rows[1:])):
        raise ConfigError(f"trace {name}: seconds must not decrease")
    if any(c < 0 for _, c in rows):
        raise ConfigError(f"trace {name}: instance counts must be >= 0")
    first = next((i for i, (_, c) in enumerate(rows) if c > 0), None)
    if first is None:
        raise ConfigError(f"trace {name}: no row has a non-zero instance count")
    start = rows[first][0]
    times, counts = [], []
    for second, count in rows[first:]:
        t = second - start
        if times and times[-1] == t:
            counts[-1] = count               # two rows at one second: the later one is the new count
        elif not counts or counts[-1] != count:
            times.append(t)
            counts.append(count)
    top = max(counts)
    if requested is None:
        requested = top
    elif requested < top:
        raise ConfigError(f"trace {name}: requested {requested} is below its largest count {top}")
    return Trace(name=name, times_s=tuple(times), counts=tuple(counts), duration_s=rows[-1][0] - start,
                 requested=requested)


def load_trace(path: str | pathlib.Path, requested: int | None = None) -> Trace:
    path = pathlib.Path(path)
    if not path.is_file():
        raise ConfigError(f"trace file {path} does not exist")
    with path.open(newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header != ["seconds", "instances"]:
            raise ConfigError(f"{path}: the first line must be 'seconds,instances', not {header}")
        try:
            rows = [(float(s), int(c)) for s, c in reader]
        except ValueError as err:
            raise ConfigError(f"{path}: every row must be 'seconds,instances' numbers ({err})") from None
    return trace_from_rows(path.stem, rows, requested)


@dataclass(frozen=True, kw_only=True)
class PoolTrace:
    """One GPU-type pool following a trace, scaled to its nodes, optionally shifted by `offset_s` (for a trace
    reused by a second pool) and repeated when shorter than the replay (`cycle`)."""
    pool: str                      # device type of the pool
    nodes: int                     # nodes in the pool (all alive at the trace's requested count)
    trace: Trace | None            # None: on-demand, all nodes alive throughout
    offset_s: float = 0.0
    cycle: bool = True

    def nodes_at(self, t: float) -> int:
        if self.trace is None:
            return self.nodes
        return scaled_nodes(self.trace.count_at(self._trace_time(t)), self.trace.requested, self.nodes)

    def change_times(self, window_s: float) -> list[float]:
        """Replay times in [0, window_s) at which the trace's count changes."""
        if self.trace is None:
            return []
        period = self.trace.duration_s
        out, base = [], -self.offset_s
        if self.cycle and period > 0:
            base -= period * (self.offset_s // period + 1)     # start one period before the window
        while base < window_s:
            out += [base + t for t in self.trace.times_s if 0 < base + t < window_s]
            if not self.cycle or period <= 0:
                break
            base += period
        return sorted(set(out))

    def _trace_time(self, t: float) -> float:
        t += self.offset_s
        if self.cycle and self.trace.duration_s > 0:
            return t % self.trace.duration_s
        return t


def scaled_nodes(instances: int, requested: int, pool_nodes: int) -> int:
    """Nodes alive in a pool of `pool_nodes` when `instances` of `requested` run (same fraction, rounded)."""
    assert 0 <= instances <= requested and requested > 0, (instances, requested)
    return int(round(pool_nodes * instances / requested))
