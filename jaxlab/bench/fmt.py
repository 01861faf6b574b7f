"""The report's cells and tables: numbers, summaries, ratios, percentages and bytes as text, and the
aligned plain-text table every part of the report is printed as."""

from __future__ import annotations

import math


def num(x: float | None) -> str:
    """A number in 3-4 significant figures for a table cell ("-" when missing)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    a = abs(x)
    if a >= 100:
        return f"{x:,.0f}"
    if a >= 10:
        return f"{x:.1f}"
    if a >= 1:
        return f"{x:.2f}"
    return f"{x:.3g}"


def fmt_summary(s: dict | None, scale: float = 1.0) -> str:
    """'median (min–max)' of a summary, each value times ``scale``; just the median for one value."""
    if not s or s.get("median") is None:
        return "-"
    med = num(s["median"] * scale)
    if s["n"] <= 1:
        return med
    return f"{med} ({num(s['min'] * scale)}–{num(s['max'] * scale)})"


def fmt_ratio(r: float | None) -> str:
    """1.5 -> "1.50x"."""
    return "-" if r is None else f"{r:.2f}x"


def fmt_pct(p: float | None) -> str:
    """12.34 -> "12.3 %"."""
    return "-" if p is None else f"{p:.1f} %"


def fmt_bytes(n: float | None) -> str:
    """Bytes in GiB, MiB, KiB or B, one decimal."""
    if n is None:
        return "-"
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n:.0f} B"


def table(rows: list[list[str]], headers: list[str], title: str) -> str:
    """An aligned plain-text table: title, header, a rule, one line per row."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = [title, "  ".join(h.ljust(w) for h, w in zip(headers, widths)), "  ".join("-" * w for w in widths)]
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    return "\n".join(lines)
