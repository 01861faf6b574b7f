"""Small helpers that keep the notebooks thin: set-up, printed tables, claims and verdicts.

Tables and verdicts are printed as plain text, so they read the same in JupyterLab, on GitHub and in
nbval's comparison. Numbers that vary from machine to machine go in cells tagged
``nbval-ignore-output``; verdict lines carry no raw floats, so they can be checked.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np


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
    import datetime
    import os

    from jaxlab.engine.model import PROXY_ENV, proxy_backend
    from jaxlab.tools.hardware import cpu_name

    info = {
        "jaxlab": __version__,
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "device_count": jax.device_count(),
        "proxy": proxy_backend(),
    }
    # Where and when this run happened: `jaxlab verdicts` reads it back from the saved notebook to tell a run on
    # the student's machine from the lab's stored outputs (nbval_sanitize.cfg masks it for the comparison).
    chip = "" if info["backend"] == "cpu" else f", {jax.devices()[0].device_kind}"
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    info["run_on"] = f"{cpu_name()}, {os.cpu_count()} CPUs{chip}, {when}"
    if not quiet:
        print(
            f"jaxlab {info['jaxlab']} | jax {info['jax']} | backend {info['backend']} "
            f"({info['device_count']} device{'s' if info['device_count'] != 1 else ''}) | run on {info['run_on']}"
        )
        if info["proxy"]:
            print(
                f"accelerator proxy ({PROXY_ENV}={info['proxy']}): this notebook takes the {info['proxy'].upper()}'s "
                "numerics and criteria (bfloat16) while XLA:CPU computes; its timings are the CPU's"
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


@dataclass(frozen=True)
class Verdict:
    """What :func:`verdict` printed: the claim's key, its word and the whole text."""

    key: str
    word: str
    text: str

    def __str__(self) -> str:
        return self.text


WORDS = ("HOLDS", "HOLDS ONLY WHEN", "DOES NOT HOLD", "NOT MEASURABLE HERE")


def _value(name: str, v) -> float:
    if isinstance(v, (bool, np.bool_)):
        raise TypeError(
            f"verdict({name!r}): got a bool; pass what was measured (a ratio, a count, a fraction) and let the "
            "claim's threshold in jaxlab/lab/claims.py decide"
        )
    try:
        out = float(np.asarray(v))
    except (TypeError, ValueError):
        raise TypeError(f"verdict({name!r}): the measured value must be a number, not {type(v).__name__}") from None
    if out != out:
        raise ValueError(f"verdict({name!r}): the measured value is NaN; measure again")
    return out


def verdict(key: str, measured, because: str = "", source: str = "") -> Verdict:
    """Print a claim, what was measured and its verdict, and where the numbers come from.

    ``measured`` is a number, or a mapping ``{setting: number}`` when the claim was measured in several settings.
    The claim's threshold (``jaxlab.lab.claims``) grades it: every value meets it -> HOLDS; some do ->
    HOLDS ONLY WHEN <the claim's condition>; none does -> DOES NOT HOLD.

    ``source`` says where the numbers come from when some were not measured by this run: a stored run's label
    (:func:`stored`'s ``label``: host and date), or "measured now and <label>" for a mix. Without it the verdict
    reads "on this machine", which only numbers measured now may claim (tests/house/test_teaching.py checks that
    a verdict fed from a stored run names it).
    """
    from jaxlab.lab.claims import claim, number, unit_suffix

    if not isinstance(source, str):
        raise TypeError(f"verdict({key!r}): source is a label (str), e.g. stored('...')['label']")
    c = claim(key)
    unit = unit_suffix(c.unit)
    if isinstance(measured, dict):
        if not measured:
            raise ValueError(f"verdict({key!r}): no settings measured")
        values = {str(k): _value(key, v) for k, v in measured.items()}
        width = max(map(len, values))
        lines = [f"Measured: {c.measure} (needs {c.needs})"]
        shown = {k: f"{number(v)}{unit}" for k, v in values.items()}
        vw = max(map(len, shown.values()))
        lines += [f"  {k.ljust(width)}  {shown[k].rjust(vw)}  {c.margin(v)}" for k, v in values.items()]
        met = [c.meets(v) for v in values.values()]
        if all(met):
            word = "HOLDS"
        elif any(met):
            if not c.condition:
                raise ValueError(f"claim {key!r} holds in some settings only: give it a condition in claims.py")
            word = "HOLDS ONLY WHEN"
        else:
            word = "DOES NOT HOLD"
    else:
        v = _value(key, measured)
        lines = [f"Measured: {c.measure}: {number(v)}{unit} (needs {c.needs}: {c.margin(v)})"]
        word = "HOLDS" if c.meets(v) else "DOES NOT HOLD"
    # The condition is the claim's, in general words; which settings met it is what this run found, so the verdict
    # names them (on other hardware other settings meet it, and a fixed string would name the wrong ones).
    shown = (
        f"{word} {c.condition} (met by: {'; '.join(k for k, v in values.items() if c.meets(v))})"
        if word == "HOLDS ONLY WHEN"
        else word
    )
    text = "\n".join(
        [
            f'Claim: "{c.quote}" ({c.source})',
            *lines,
            f"Threshold {c.needs}: {c.reason}",
            f"Verdict {f'({source})' if source else 'on this machine'}: {shown}",
        ]
        + ([f"  because {because}"] if because else [])
    )
    print(text)
    return Verdict(key, word, text)


def unmeasured(key: str, because: str) -> Verdict:
    """Print a claim this machine cannot measure (one device for a multi-device claim), and why."""
    from jaxlab.lab.claims import claim

    c = claim(key)
    text = f'Claim: "{c.quote}" ({c.source})\nVerdict on this machine: NOT MEASURABLE HERE\n  because {because}'
    print(text)
    return Verdict(key, "NOT MEASURABLE HERE", text)


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


def show_source(obj, max_lines: int | None = None, skip_docstring: bool = False) -> str:
    """Print (and return) the source of a function or class a notebook uses, headed by the file it lives in.

    Notebooks call the package's code for what they teach (the loop, the step, the mask); this puts that code in
    view where it is used. ``max_lines`` cuts it; ``skip_docstring`` drops the docstring.
    """
    import inspect
    import re
    from pathlib import Path

    obj = inspect.unwrap(obj)  # a jitted function: the Python function it wraps
    src = inspect.getsource(obj)
    if skip_docstring:
        src = re.sub(r'\n(\s+)"""(.|\n)*?"""\n', "\n", src, count=1)
    lines = src.rstrip("\n").splitlines()
    if max_lines is not None and len(lines) > max_lines:
        lines = lines[:max_lines] + [f"    # ... ({len(lines) - max_lines} more lines)"]
    parts = Path(inspect.getsourcefile(obj)).parts
    where = "/".join(parts[len(parts) - 1 - parts[::-1].index("jaxlab") :]) if "jaxlab" in parts else parts[-1]
    text = f"# {where}, line {inspect.getsourcelines(obj)[1]}\n" + "\n".join(lines)
    print(text)
    return text
