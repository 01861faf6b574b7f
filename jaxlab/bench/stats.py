"""Numbers from repeated measurements (median and spread, ratios) and token-by-token comparisons."""

from __future__ import annotations

import math
import statistics
from typing import Sequence


def summarize(values: Sequence[float]) -> dict:
    """Median and spread of repeated measurements: {median, min, max, n, values}."""
    vals = [float(v) for v in values]
    if not vals:
        return {"median": None, "min": None, "max": None, "n": 0, "values": []}
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals), "values": vals}


def summary_map(s: dict, fn) -> dict:
    """The summary of ``fn(value)`` for each value (fn monotone: min/max are mapped and re-sorted)."""
    return summarize([fn(v) for v in s["values"]])


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None when either is missing or NaN or b is 0."""
    if (
        a is None
        or b is None
        or not b
        or (isinstance(a, float) and math.isnan(a))
        or (isinstance(b, float) and math.isnan(b))
    ):
        return None
    return a / b


def first_divergence(ours: Sequence[Sequence[int]], peer: Sequence[Sequence[int]]) -> tuple[int, int] | None:
    """(row, token index) of the first differing token (scanning rows in order), or None if identical."""
    for r, (a, b) in enumerate(zip(ours, peer)):
        a, b = list(a), list(b)
        for t in range(max(len(a), len(b))):
            if t >= len(a) or t >= len(b) or a[t] != b[t]:
                return r, t
    if len(ours) != len(peer):
        return min(len(ours), len(peer)), 0
    return None


def divergence_text(div: tuple[int, int] | None, rows: int) -> str:
    """The report's words for :func:`first_divergence`'s answer."""
    if div is None:
        return f"identical ({rows} row{'s' if rows != 1 else ''})"
    return f"first divergence at row {div[0]}, token {div[1]}"
