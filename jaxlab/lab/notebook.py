"""Small helpers that keep the notebooks thin: set-up, printed tables, claims and verdicts.

Tables and verdicts are printed as plain text, so they read the same in JupyterLab, on GitHub and in
nbval's comparison. Numbers that vary from machine to machine go in cells tagged
``nbval-ignore-output``; verdict lines carry no raw floats, so they can be checked.
"""

from __future__ import annotations

import json
from typing import Iterable, Sequence


def setup(compile_cache: bool = True, quiet: bool = False) -> dict:
    """Turn on the persistent compilation cache and quiet matplotlib; print one line about the setup."""
    import jax

    from jaxlab import __version__
    from jaxlab.tools import compile_cache as cc

    if compile_cache:
        cc.enable()
    try:
        import matplotlib

        matplotlib.rcParams.update({"figure.figsize": (7, 3.5), "figure.dpi": 90, "axes.grid": True})
    except ImportError:
        pass
    info = {
        "jaxlab": __version__,
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "device_count": jax.device_count(),
    }
    if not quiet:
        print(
            f"jaxlab {info['jaxlab']} | jax {info['jax']} | backend {info['backend']} "
            f"({info['device_count']} device{'s' if info['device_count'] != 1 else ''})"
        )
    return info


def _fmt(v) -> str:
    if isinstance(v, float):
        if v != v:
            return "-"
        if abs(v) >= 100:
            return f"{v:,.0f}"
        if abs(v) >= 1:
            return f"{v:.2f}"
        return f"{v:.3g}"
    return str(v)


def table(
    rows: Sequence[dict] | Iterable[Sequence], headers: Sequence[str] | None = None, title: str | None = None
) -> str:
    """Print (and return) an aligned plain-text table; rows are dicts or sequences."""
    rows = list(rows)
    if rows and isinstance(rows[0], dict):
        headers = headers or list(rows[0])
        rows = [[r.get(h, "") for h in headers] for r in rows]
    headers = list(headers or [])
    cells = [[_fmt(v) for v in r] for r in rows]
    widths = [max([len(str(h))] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    lines = []
    if title:
        lines.append(title)
    lines.append("  ".join(str(h).ljust(w) for h, w in zip(headers, widths)))
    lines.append("  ".join("-" * w for w in widths))
    for r in cells:
        lines.append("  ".join(v.rjust(w) if _numeric(v) else v.ljust(w) for v, w in zip(r, widths)))
    text = "\n".join(lines)
    print(text)
    return text


def _numeric(s: str) -> bool:
    return s.replace(",", "").replace(".", "", 1).replace("-", "", 1).replace("e", "", 1).isdigit()


def verdict(claim: str, holds: bool | None, because: str = "") -> str:
    """Print a claim and its verdict on this machine: holds / does not hold / not measurable here."""
    word = {True: "HOLDS", False: "DOES NOT HOLD", None: "NOT MEASURABLE HERE"}[holds]
    text = f"Claim: {claim}\nVerdict on this machine: {word}" + (f" - {because}" if because else "")
    print(text)
    return text


def check(name: str, ok: bool, detail: str = "") -> bool:
    """Print a pass/fail line for a correctness check (no raw floats in ``detail``)."""
    print(f"{'PASS' if ok else 'FAIL'}: {name}" + (f" ({detail})" if detail else ""))
    return ok


def stored(name: str) -> dict:
    """A bench run stored with the lab (``data/bench/<name>.json``), with ``label``: its host and date."""
    from jaxlab.io.assets import data_file

    data = json.loads(data_file("bench", f"{name}.json").read_text(encoding="utf-8"))
    meta = data.get("meta", {})
    data["label"] = f"stored run: {meta.get('cpu', '?')}, {meta.get('cpus', '?')} CPUs, {meta.get('date', '?')}"
    return data
