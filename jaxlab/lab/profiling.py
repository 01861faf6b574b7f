"""Helpers for notebook 07 (profiling and compilation): a profiler trace as a timeline, and its figures.

* :func:`op_timeline` reads the ``*.trace.json.gz`` that :func:`jaxlab.tools.profile.trace` writes and returns
  every operation of the compiled program that ran: its thread, start and duration (ms from the first op),
  and the kind of work (which weight it reads, from the program's HLO, or what it is when it reads none).
* :func:`weight_share` is the share of the ops' time spent in operations that read a weight; :func:`reads_share`
  the share of those reading one weight, to hold against :func:`time_output_head`, the output projection timed
  alone (does the trace put time where a stopwatch does?).
* :func:`plot_timeline` draws the ops as a Gantt chart, one row per thread (what Perfetto or TensorBoard's
  trace viewer show); :func:`plot_ttft` compares the time to first token of cold, warm and warmed-up runs.
"""

from __future__ import annotations

import gzip
import json
import os
import re
from pathlib import Path
from typing import Sequence

from jaxlab.tools.program_export import weights_read

__all__ = [
    "KINDS",
    "op_kind",
    "op_timeline",
    "weight_share",
    "reads_share",
    "time_output_head",
    "plot_timeline",
    "plot_ttft",
]

#: The kinds of work :func:`op_kind` tells apart, in the order the legend lists them, with their colours.
KINDS = {
    "embedding (lookup, output head)": "tab:red",
    "MLP matmuls": "tab:blue",
    "attention q, o": "tab:green",
    "attention k, v": "tab:olive",
    "copies (cache not donated)": "tab:purple",
    "other (attention, norms, RoPE)": "tab:gray",
}


def op_kind(op: str, reads: dict[str, list[str]]) -> str:
    """One of :data:`KINDS` for the HLO op ``op``, given :func:`jaxlab.tools.program_export.weights_read` of its program."""
    names = reads.get(op, [])
    if any(n == "embed" for n in names):
        return "embedding (lookup, output head)"
    if any(".mlp." in n for n in names):
        return "MLP matmuls"
    if any(n.endswith((".wq", ".wo")) for n in names):
        return "attention q, o"
    if any(n.endswith((".wk", ".wv")) for n in names):
        return "attention k, v"
    if re.match(r"copy(\.\d+)?$", op):
        return "copies (cache not donated)"
    return "other (attention, norms, RoPE)"


def op_timeline(trace_dir: str | os.PathLike, hlo: str | None = None) -> list[dict]:
    """The compiled program's operations in a ``jax.profiler`` trace folder, in time order.

    Rows: ``op`` (HLO name), ``thread`` (the trace's thread name), ``start_ms`` (from the first op),
    ``ms`` (duration), ``kind`` (:func:`op_kind`; needs the program's optimized ``hlo`` text, else all ops
    are "other") and ``reads`` (the weights it reads)."""
    files = sorted(Path(trace_dir).glob("**/*.trace.json.gz"))
    if not files:
        raise FileNotFoundError(f"no *.trace.json.gz under {trace_dir}: record one with jaxlab.tools.profile.trace")
    with gzip.open(files[-1]) as f:
        events = json.load(f).get("traceEvents", [])
    threads = {
        (e.get("pid"), e.get("tid")): e["args"]["name"]
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    reads = weights_read(hlo) if hlo else {}
    ops = [e for e in events if e.get("ph") == "X" and "hlo_op" in e.get("args", {})]
    if not ops:
        return []
    t0 = min(float(e["ts"]) for e in ops)
    rows = [
        {
            "op": e["args"]["hlo_op"],
            "thread": threads.get((e.get("pid"), e.get("tid")), str(e.get("tid"))),
            "start_ms": (float(e["ts"]) - t0) / 1e3,
            "ms": float(e.get("dur", 0.0)) / 1e3,
            "kind": op_kind(e["args"]["hlo_op"], reads),
            "reads": ", ".join(reads.get(e["args"]["hlo_op"], [])),
        }
        for e in ops
    ]
    return sorted(rows, key=lambda r: r["start_ms"])


def weight_share(timeline: Sequence[dict]) -> float:
    """Fraction of the ops' summed time spent in operations that read a weight (0 when there are none)."""
    total = sum(r["ms"] for r in timeline)
    return sum(r["ms"] for r in timeline if r["reads"]) / total if total else 0.0


def reads_share(timeline: Sequence[dict], weight: str) -> float:
    """Fraction of the ops' summed time spent in operations that read the weight named ``weight`` (e.g.
    ``"embed"``: the lookup and the tied output head)."""
    total = sum(r["ms"] for r in timeline)
    mine = sum(r["ms"] for r in timeline if weight in r["reads"].split(", "))
    return mine / total if total else 0.0


def time_output_head(params, batch: int = 1, repeats: int = 5) -> tuple[str, float]:
    """(the weight's name, seconds): the model's output projection alone, ``[B, D] @ W.T`` for the tied embedding
    (or ``lm_head``), jitted, best of ``repeats`` synchronized calls: a stopwatch for the operation a decode
    step's trace names."""
    import jax
    import jax.numpy as jnp

    from jaxlab.tools.profile import time_fn

    flat = params.flat()
    name = "lm_head" if "lm_head" in flat else "embed"
    w = jnp.asarray(flat[name])  # [V, D]
    h = jnp.ones((batch, w.shape[1]), w.dtype)  # [B, D]
    head = jax.jit(lambda h, w: jnp.einsum("bd,vd->bv", h, w, preferred_element_type=jnp.float32))
    return name, time_fn(head, h, w, repeats=repeats, warmup=1).min


def plot_timeline(timeline: Sequence[dict], title: str = "One decode step, as the profiler recorded it"):
    """A Gantt chart of the ops: one row per thread, one bar per op from its start for its duration,
    coloured by :func:`op_kind`; the right panel sums the time per kind."""
    import matplotlib.pyplot as plt

    threads = sorted({r["thread"] for r in timeline})
    fig, (ax, side) = plt.subplots(1, 2, figsize=(9, 3.4), gridspec_kw={"width_ratios": [3, 1]})
    for y, th in enumerate(threads):
        for kind, colour in KINDS.items():
            bars = [(r["start_ms"], max(r["ms"], 1e-3)) for r in timeline if r["thread"] == th and r["kind"] == kind]
            if bars:
                ax.broken_barh(bars, (y - 0.4, 0.8), facecolors=colour)
    ax.set_yticks(range(len(threads)), [t.split("/")[0] + f" #{i}" for i, t in enumerate(threads)], fontsize=8)
    ax.set_xlabel("ms since the step's first operation")
    ax.grid(False, axis="y")
    ax.set_title(title)
    totals = {k: sum(r["ms"] for r in timeline if r["kind"] == k) for k in KINDS}
    names = [k for k in KINDS if totals[k] > 0][::-1]
    side.barh(names, [totals[k] for k in names], color=[KINDS[k] for k in names])
    side.set_xlabel("ms in all")
    side.set_title("time per kind", fontsize=9)
    side.tick_params(axis="y", labelsize=8)
    fig.tight_layout()
    return fig


def plot_ttft(rows: dict[str, dict]):
    """Stacked bars per run (e.g. cold process, warm process, after warm-up): seconds compiling and the rest of
    the time to first token. ``rows`` maps a label to ``{"ttft_s", "compile_s"}``."""
    import matplotlib.pyplot as plt

    labels = list(rows)
    comp = [min(rows[k]["compile_s"], rows[k]["ttft_s"]) for k in labels]
    rest = [rows[k]["ttft_s"] - c for k, c in zip(labels, comp)]
    fig, ax = plt.subplots()
    ax.barh(labels, comp, color="tab:red", label="compiling (trace, lower, XLA or cache load)")
    ax.barh(labels, rest, left=comp, color="tab:green", label="the rest (prefill, sampling, small eager programs)")
    for i, k in enumerate(labels):
        ax.text(rows[k]["ttft_s"], i, f" {rows[k]['ttft_s']:.2f} s", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, max(rows[k]["ttft_s"] for k in labels) * 1.3)
    ax.set_xlabel("seconds from the request to its first token")
    ax.set_title("Time to first token: what compilation adds")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig
