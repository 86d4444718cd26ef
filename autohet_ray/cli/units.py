"""Figures for people: a time or a size in the unit that keeps it readable at every scale (µs to s, KB to GB),
and a count with its noun in the right number."""
from __future__ import annotations

TIME_UNITS = ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"))
SIZE_UNITS = ((1e9, "GB"), (1e6, "MB"), (1e3, "KB"))


def seconds(value: float) -> str:
    """`value` seconds in s, ms or µs, three significant digits: 2.41 s, 1.25 ms, 850 µs."""
    if value == 0:
        return "0 s"
    for scale, unit in TIME_UNITS:
        if abs(value) >= scale or unit == "µs":
            return f"{_digits(value / scale)} {unit}"
    raise AssertionError(value)


def size(num_bytes: float) -> str:
    """`num_bytes` in GB, MB or KB (decimal), three significant digits; below 1 KB in bytes."""
    for scale, unit in SIZE_UNITS:
        if abs(num_bytes) >= scale:
            return f"{_digits(num_bytes / scale)} {unit}"
    return f"{num_bytes:.0f} B"


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _digits(x: float) -> str:
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:.0f}"
