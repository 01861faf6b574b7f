"""Notebook 16's helpers: asking libtpu, the TPU compiler, about a chip that is not here.

The compiling itself is :mod:`jaxlab.bench.chip_compile` (``jaxlab compile --chip``); this module picks the
programs a lesson needs, compiles independent ones side by side, and turns the compiler's answers into the rows,
figures and formulas the notebook shows:

* :func:`decode_reports`: the decode step of several models/shapes for one chip, two compiles at a time;
* :func:`fit_rows` / :func:`plot_fit`: "does it fit" (weights, KV cache, the program's bytes, the chip's HBM,
  or the compiler's refusal in its own words);
* :func:`parameter_layouts`: the tiled layouts of a compiled program's parameters (``T(8,128)(2,1)``);
* :func:`refused_block`: a Pallas block shape Mosaic refuses, with its message;
* the scaling questions as formulas to check the compiler against: :func:`kv_bytes`,
  :func:`decode_floor_s`, :func:`critical_batch`, :func:`max_intensity`;
* :func:`plot_predicted_vs_measured`: a roofline prediction beside the time this CPU measured.
"""

from __future__ import annotations

import concurrent.futures
import re

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxlab.bench import chip_compile as cc
from jaxlab.engine.kvcache import cache_bytes
from jaxlab.io.config import LlamaConfig
from jaxlab.tools import hardware


def is_decode(name: str) -> bool:
    return name.startswith("decode step [")


def decode_reports(cases: dict[str, cc.Settings], chip: str = "v5e-1") -> dict[str, cc.Report]:
    """``{label: Report}`` with one program each, the decode step of that model and shape compiled for ``chip``;
    two compile at a time (XLA compiles outside Python's lock), the largest models first so that the longest
    compile does not start last (notebook 16's three models: 24 -> 20 s on 2 cores); returned in the given order."""
    largest_first = sorted(cases, key=lambda k: -cases[k].config.n_params())
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = {k: pool.submit(cc.compile_all, cases[k], chip, only=is_decode, workers=1) for k in largest_first}
        return {k: futures[k].result() for k in cases}


def _gb(n: float) -> float:
    return n / 1e9


def fit_rows(reports: dict[str, cc.Report]) -> list[dict]:
    """One row per report: the weights and KV cache (logical bytes), what the compiled program holds on the chip,
    the chip's HBM, and whether it fits (or the compiler's refusal)."""
    rows = []
    for label, r in reports.items():
        p = r.programs[0]
        rows.append(
            {
                "model, shape": label,
                "weights GB": _gb(r.weights_bytes),
                "KV cache GB": _gb(r.cache_bytes),
                "program GB": _gb(p.device_bytes) if p.ok else float("nan"),
                "HBM GB": _gb(r.hbm_bytes),
                "compiler": "fits"
                if p.ok and r.fits
                else (p.message.split(": ", 1)[-1][:80] if not p.ok else "too big"),
                "predicted ms": p.predicted_s * 1e3 if p.ok else float("nan"),
            }
        )
    return rows


def required_bytes(message: str) -> float | None:
    """The bytes an out-of-memory refusal says the program needed ("... required for HLO temporaries (19.00G)")."""
    m = re.search(r"\(([\d.]+)G\) exceeds", message)
    return float(m.group(1)) * 2**30 if m else None


def plot_fit(reports: dict[str, cc.Report], title: str):
    """Horizontal bars: weights, KV cache and the rest of what the program holds, against the chip's HBM; a
    refused program is drawn at the size the compiler said it needed, hatched."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 0.6 + 0.55 * len(reports)))
    labels = list(reports)
    for i, label in enumerate(labels):
        r = reports[label]
        p = r.programs[0]
        w, kv = _gb(r.weights_bytes), _gb(r.cache_bytes)
        total = _gb(p.device_bytes) if p.ok else _gb(required_bytes(p.message) or r.weights_bytes + r.cache_bytes)
        ax.barh(i, w, color="#4c72b0", label="weights" if i == 0 else None)
        ax.barh(i, kv, left=w, color="#dd8452", label="KV cache" if i == 0 else None)
        rest = max(total - w - kv, 0.0)
        ax.barh(
            i, rest, left=w + kv, color="#bbbbbb", hatch=None if p.ok else "//", label="the rest" if i == 0 else None
        )
        ax.text(total + 0.2, i, f"{total:.1f} GB" + ("" if p.ok else " refused"), va="center", fontsize=8)
    hbm = _gb(next(iter(reports.values())).hbm_bytes)
    ax.axvline(hbm, color="crimson", ls="--", label=f"HBM {hbm:.1f} GB")
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("GB on one chip (the compiler's memory analysis)")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


LAYOUT = re.compile(r"(?:bf16|f32|s8|s32|u32)\[[0-9,]*\]\{[^}]*\}")


def parameter_layouts(hlo: str, n: int = 6) -> list[str]:
    """The first ``n`` distinct parameter shapes of the compiled entry computation, with their layouts."""
    entry = hlo[hlo.find("ENTRY") :]
    seen = []
    for line in entry.splitlines():
        if " parameter(" not in line:
            continue
        m = LAYOUT.search(line.split("=", 1)[-1])
        if m and m.group(0) not in seen:
            seen.append(m.group(0))
        if len(seen) == n:
            break
    return seen


def refused_block(chip: str = "v5e-1", block: tuple[int, int] = (3, 100), shape: tuple[int, int] = (6, 300)):
    """A Pallas copy kernel with ``block``-shaped blocks over a ``shape`` array, compiled for ``chip`` through
    Mosaic: a :class:`~jaxlab.bench.chip_compile.Compiled`, refused with Mosaic's first line when the block
    breaks the TPU's (8, 128) tiling."""
    from jax.experimental import pallas as pl

    tgt = cc.target(chip)
    one = NamedSharding(tgt.mesh(1), P())

    def copy(x_ref, o_ref):
        o_ref[...] = x_ref[...]

    def f(x):
        spec = pl.BlockSpec(block, lambda i: (i, 0))
        return pl.pallas_call(copy, grid=(shape[0] // block[0],), in_specs=[spec], out_specs=spec, out_shape=x)(x)

    return cc.compile_one(f"copy in {block} blocks", jax.jit(f), (jax.ShapeDtypeStruct(shape, jnp.float32, sharding=one),), None, tgt)  # fmt: skip


# -- the scaling questions, as formulas the compiler's figures are checked against -----------------------------


def kv_bytes(cfg: LlamaConfig, batch: int, context: int, dtype=jnp.bfloat16) -> int:
    """KV-cache bytes: 2 (K and V) x layers x batch x context x KV heads x head_dim x bytes per number."""
    return cache_bytes(cfg, batch, context, dtype)


def decode_floor_s(weights_bytes: float, cache_bytes_: float, chip: str = "TPU v5e") -> float:
    """The least time one decode step can take on ``chip``: every weight and every cached K/V read once, at the
    chip's published HBM bandwidth."""
    return (weights_bytes + cache_bytes_) / hardware.CHIPS[chip].hbm_bandwidth


def ridge(chip: str = "TPU v5e") -> float:
    """FLOP per byte where the chip's compute and bandwidth ceilings meet (bfloat16 peak / HBM bandwidth)."""
    c = hardware.CHIPS[chip]
    return c.peak_flops / c.hbm_bandwidth


def critical_batch(chip: str = "TPU v5e", bytes_per_param: float = 2.0) -> float:
    """The batch at which decode turns compute-bound when only the weights are read: B tokens do 2 FLOPs per
    parameter over ``bytes_per_param`` bytes, so the intensity is 2 B / bytes_per_param; it meets the ridge at
    B = ridge x bytes_per_param / 2."""
    return ridge(chip) * bytes_per_param / 2


def max_intensity(cfg: LlamaConfig, context: int, dtype=jnp.bfloat16) -> float:
    """The FLOP per byte a decode step approaches as the batch grows, when each row also reads its own KV cache of
    ``context`` tokens: 2 x parameters per row over that row's cache bytes (the weights, read once, vanish)."""
    return 2 * cfg.n_params() / kv_bytes(cfg, 1, context, dtype)


def plot_predicted_vs_measured(report: cc.Report, title: str):
    """Each measured program: the roofline prediction (this CPU's ceilings) against the time measured, log-log,
    with the line where they would be equal."""
    import matplotlib.pyplot as plt

    rows = [p for p in report.programs if p.measured_s is not None]
    pred = np.array([p.predicted_s for p in rows]) * 1e3
    meas = np.array([p.measured_s for p in rows]) * 1e3
    fig, ax = plt.subplots(figsize=(5.5, 4))
    ax.scatter(pred, meas, color="#4c72b0")
    for p, x, y in zip(rows, pred, meas):
        ax.annotate(
            p.name.split(" [")[0].split(" width")[0], (x, y), fontsize=7, xytext=(4, 2), textcoords="offset points"
        )
    lo, hi = min(pred.min(), meas.min()) / 1.5, max(pred.max(), meas.max()) * 1.5
    ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="measured = predicted")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("predicted ms (roofline, this CPU's ceilings)")
    ax.set_ylabel("measured ms (best of 5)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
