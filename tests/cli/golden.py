"""Golden outputs: the text a command prints, kept under tests/golden/, with the figures that vary from run to run
(the solver's wall time) masked. AUTOHET_WRITE_GOLDEN=1 rewrites them (then read the diff before committing)."""
from __future__ import annotations

import os
import re

GOLDEN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "golden")
VARYING = [(re.compile(r"solved in [\d.]+ s, [\d.]+ s in all"), "solved in <s> s, <s> s in all")]


def masked(text: str) -> str:
    for pattern, mask in VARYING:
        text = pattern.sub(mask, text)
    return text


def check_golden(name: str, text: str) -> None:
    path = os.path.join(GOLDEN, name)
    if os.environ.get("AUTOHET_WRITE_GOLDEN"):
        with open(path, "w") as f:
            f.write(masked(text))
    with open(path) as f:
        expected = f.read()
    assert masked(text) == expected, f"{name} differs from {path} (AUTOHET_WRITE_GOLDEN=1 rewrites it)"
