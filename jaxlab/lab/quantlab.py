"""What notebook 09 (quantization) measures and draws, as tested functions.

* **One matrix, every format** (:func:`matrix_formats`): bits per weight (scales and offsets included),
  bytes and reconstruction error of one real matrix in int8 and in int4 at several group sizes (W8A8's
  weights are int8's); :func:`nibbles` shows two 4-bit codes sharing a byte.
* **Activations** (:func:`activation_rows`): how far each matrix's input channels spread (largest
  channel against the median one, from the calibration statistics), before and after SmoothQuant's
  factors, and how many int8 levels that leaves a typical channel when one scale serves a whole token.
* **Per-layer error** (:func:`layer_errors`, :func:`plot_layer_errors`): ``|W_q - W| / |W|`` of every
  quantized matrix of the model, per format, in model order.
* **The backend decides** (:data:`FORMULATIONS`, :func:`time_formulations`): one matrix product written
  several ways, timed side by side, so the cost of each lowering is visible on its own.
* **Speed and memory** (:func:`decode_step_times`, :func:`memory_rows`, :func:`plot_speed_memory`): the
  greedy decode step of each variant (weight format x KV-cache format) timed side by side at one batch
  size; the bytes of weights and KV cache.
* **Quality** (:func:`quality_rows`): the teacher-forced scores of :func:`jaxlab.quant.quality.score_windows`
  as table rows, with the perplexity increase over float32.
* **The stored bench run** (:func:`stored_decode_rows`, :func:`stored_quality_rows`, :func:`plot_stored_decode`):
  ``jaxlab bench --quant-only --quality --targets`` on a quiet machine (``data/bench/quant-cpu.json``, read with
  :func:`jaxlab.lab.notebook.stored`, which labels it with its host and date), as table rows and a figure.

Timings interleave the variants round by round (A, B, C, A, B, C, ...) and report medians, so load
from other processes on the machine hits every variant alike. Nothing here changes the model.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab import quant
from jaxlab.engine.kvcache import init_cache
from jaxlab.engine.model import Params
from jaxlab.engine.programs import Programs
from jaxlab.engine.steps import GREEDY, jit_decode
from jaxlab.quant import QuantizedMatrix

HI = jax.lax.Precision.HIGHEST


# --------------------------------------------------------------------------------------------------
# One matrix, every format
# --------------------------------------------------------------------------------------------------


def bits_per_weight(m: QuantizedMatrix) -> float:
    """Storage bits per weight of a quantized matrix, its scales and offsets included."""
    o, i = m.shape
    return 8.0 * m.nbytes / (o * i)


def relative_error(approx, exact) -> float:
    """Relative Frobenius error ``|approx - exact| / |exact|`` (what :func:`jaxlab.quant.layer_errors` reports)."""
    approx, exact = np.asarray(approx, np.float64), np.asarray(exact, np.float64)
    return float(np.linalg.norm(approx - exact) / max(np.linalg.norm(exact), 1e-30))


def matrix_formats(
    w_oi: np.ndarray, specs: Sequence[tuple[str, int]] = (("int8", 0), ("int4", 32), ("int4", 64), ("int4", 192))
) -> list[dict]:
    """Quantize one float matrix ``w [out, in]`` in each ``(format, group)`` of ``specs`` (group: int4
    only) -> rows: format, bits per weight, bytes, relative error, worst error over the largest weight."""
    w = np.asarray(w_oi, np.float32)
    rows = [
        {
            "format": "float32",
            "bits/weight": 32.0,
            "kB": w.nbytes / 1e3,
            "relative error": 0.0,
            "worst error / max |w|": 0.0,
        }
    ]
    for fmt, group in specs:
        m = quant.quantize_matrix(w, fmt, group or quant.DEFAULT_GROUP)
        d = np.asarray(m.dequantize())
        rows.append(
            {
                "format": f"{fmt} g{group}" if fmt == "int4" else fmt,
                "bits/weight": bits_per_weight(m),
                "kB": m.nbytes / 1e3,
                "relative error": relative_error(d, w),
                "worst error / max |w|": float(np.abs(d - w).max() / np.abs(w).max()),
            }
        )
    return rows


def nibbles(m: QuantizedMatrix, row: int = 0, n: int = 4) -> list[dict]:
    """The first ``n`` bytes of one row of an int4 matrix: each byte and the two 4-bit codes it holds
    (input ``2j`` in the low nibble, input ``2j + 1`` in the high one)."""
    if m.fmt != "int4":
        raise ValueError(f"nibbles: an int4 matrix, got {m.fmt}")
    packed = np.asarray(m.q[row, :n])
    return [
        {
            "byte": j,
            "value": int(b),
            "bits (high|low)": f"{int(b) >> 4:04b}|{int(b) & 15:04b}",
            "inputs": f"{2 * j}, {2 * j + 1}",
            "codes (low, high)": f"{int(b) & 15}, {int(b) >> 4}",
        }
        for j, b in enumerate(packed)
    ]


# --------------------------------------------------------------------------------------------------
# Activations: what W8A8 must represent with one scale per token
# --------------------------------------------------------------------------------------------------


def channel_spread(act_max: np.ndarray) -> float:
    """Largest input channel's ``max |x|`` over the median channel's: how much wider than a typical
    channel the range is that one per-token scale must cover."""
    a = np.asarray(act_max, np.float64)
    return float(a.max() / max(np.median(a), 1e-30))


def widest(stats: dict, n: int = 3) -> list[str]:
    """The ``n`` matrices whose inputs spread widest (:func:`channel_spread`), widest first."""
    return sorted(stats, key=lambda name: -channel_spread(stats[name]))[:n]


def activation_rows(stats: dict, smoothed: Params | None = None, names: Sequence[str] | None = None) -> list[dict]:
    """Per matrix (``names``, default all of ``stats``): the spread of its input channels
    (:func:`channel_spread`) and the int8 levels a median channel keeps when a token's scale is set by
    the largest channel (``127 / spread``); with ``smoothed`` (calibrated W8A8 parameters), the same
    after dividing the activations by SmoothQuant's factors."""
    flat = smoothed.flat() if smoothed is not None else {}
    rows = []
    for name in names or list(stats):
        a = np.asarray(stats[name], np.float64)
        row = {
            "matrix": name,
            "largest channel": float(a.max()),
            "spread": channel_spread(a),
            "levels for a median channel": 127.0 / channel_spread(a),
        }
        m = flat.get(name)
        if isinstance(m, QuantizedMatrix) and m.smooth is not None:
            s = a / np.asarray(m.smooth, np.float64)
            row.update({"spread, smoothed": channel_spread(s), "levels, smoothed": 127.0 / channel_spread(s)})
        rows.append(row)
    return rows


# --------------------------------------------------------------------------------------------------
# Per-layer error
# --------------------------------------------------------------------------------------------------


def layer_errors(ref: Params, quantized: dict) -> dict[str, list[tuple[str, float]]]:
    """``{format: [(matrix name, relative error), ...]}`` in model order (:func:`jaxlab.quant.layer_errors`)."""
    return {fmt: quant.layer_errors(ref, params) for fmt, params in quantized.items()}


def exact_count(errors: Sequence[tuple[str, float]], tol: float = 1e-6, layers_only: bool = True) -> tuple[int, int]:
    """(matrices reproduced to within ``tol`` relative error, matrices counted); ``layers_only`` leaves
    out the embedding."""
    errs = [e for name, e in errors if not (layers_only and name == "embed")]
    return sum(e <= tol for e in errs), len(errs)


def plot_layer_errors(errors: dict, floor: float = 1e-4, ax=None):
    """Relative error of every matrix per format, model order, log scale. Errors below ``floor``
    (matrices a format reproduces exactly) are drawn on the floor, as hollow markers."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(9, 3.8))
    markers = {"int8": "o", "int4": "s", "w8a8": "^"}
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    names = None
    for k, (fmt, rows) in enumerate(errors.items()):
        names = [n for n, _ in rows]
        e = np.array([v for _, v in rows])
        x = np.arange(len(e))
        low = e < floor
        mk, color = markers.get(fmt.split()[0], "o"), colors[k % len(colors)]
        ax.scatter(x[~low], e[~low], s=12, marker=mk, color=color, label=fmt)
        if low.any():
            ax.scatter(
                x[low],
                np.full(low.sum(), floor),
                s=12,
                marker=mk,
                facecolors="none",
                edgecolors=color,
                label=f"{fmt}: exact (drawn at {floor:.0e})",
            )
    ax.set_yscale("log")
    ax.set_ylabel("|W_q - W| / |W|")
    if names:
        ticks = {
            i: f"layer {n.split('.')[1]}"
            for i, n in enumerate(names)
            if n.endswith(".attn.wq") and int(n.split(".")[1]) % 5 == 0
        }
        for i, n in enumerate(names):  # the embedding (and an untied head): labelled, crowding out a layer tick
            if not n.startswith("layers."):
                ticks = {j: t for j, t in ticks.items() if abs(j - i) > len(names) // 40}
                ticks[i] = n
        ax.set_xticks(sorted(ticks))
        ax.set_xticklabels([ticks[i] for i in sorted(ticks)], fontsize=8)
    ax.set_title("Per-matrix weight error (7 matrices per layer, in parameter-tree order)")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    ax.figure.tight_layout()
    return ax


# --------------------------------------------------------------------------------------------------
# The backend decides: one matrix product, written several ways
# --------------------------------------------------------------------------------------------------


def _dot_f32(x, w):  # x [R, I], w [O, I] -> [R, O]; contraction over the weight's minor axis
    return jax.lax.dot_general(x, w, (((1,), (1,)), ((), ())), precision=HI)


def _dot_convert(x, m):  # the obvious int8: convert the weights to float32, then a float32 dot
    return _dot_f32(x, m.q.astype(jnp.float32)) * m.scale


def _dot_w8a8_one_row(x, m):  # W8A8 as written in the papers: one int8 row per token, int32 accumulation
    xq, s = quant.quantize_activations(x)
    acc = jax.lax.dot_general(xq, m.q, (((1,), (1,)), ((), ())), preferred_element_type=jnp.int32)
    return acc.astype(jnp.float32) * s * m.scale


def _dot_jaxlab(x, m):  # what jaxlab.quant runs for the matrix's format (QuantizedMatrix.dot)
    return m.dot(x)


# label -> (weight format, matmul); the float32 row is the baseline every other row is compared with
FORMULATIONS: dict[str, tuple[str, Callable]] = {
    "float32": ("float32", _dot_f32),
    "int8, convert then float dot": ("int8", _dot_convert),
    "int8, two int8 rows (jaxlab)": ("int8", _dot_jaxlab),
    "w8a8, one int8 row": ("w8a8", _dot_w8a8_one_row),
    "w8a8, padded to two rows (jaxlab)": ("w8a8", _dot_jaxlab),
    "int4, per-group int8 dots (jaxlab)": ("int4", _dot_jaxlab),
}


def interleaved_medians(fns: dict, args: dict, reps: int) -> dict[str, float]:
    """Median seconds of each ``fns[name](*args[name])`` (already compiled), run round-robin ``reps``
    times after one untimed call each."""
    for name, f in fns.items():
        jax.block_until_ready(f(*args[name]))
    times = {n: [] for n in fns}
    for _ in range(reps):
        for name, f in fns.items():
            t = time.perf_counter()
            jax.block_until_ready(f(*args[name]))
            times[name].append(time.perf_counter() - t)
    return {n: float(np.median(t)) for n, t in times.items()}


def time_formulations(
    w_oi: np.ndarray, batch: int = 1, reps: int = 7, names: Sequence[str] | None = None, seed: int = 0
) -> list[dict]:
    """``x [batch, in] . w^T`` in each formulation of :data:`FORMULATIONS` (``names``, default all),
    timed side by side -> rows: formulation, ms (median), speed against float32, the relative error of
    its result against the float32 product (the price of the weight format), and its relative difference
    from the first formulation of the same format (the price of the formulation: ~0, they compute the
    same thing)."""
    names = list(names or FORMULATIONS)
    if "float32" not in names:
        names = ["float32"] + names
    w = np.asarray(w_oi, np.float32)
    weights = {"float32": jnp.asarray(w)}
    for fmt in {FORMULATIONS[n][0] for n in names} - {"float32"}:
        weights[fmt] = quant.quantize_matrix(w, fmt)
    x = jnp.asarray(np.random.default_rng(seed).standard_normal((batch, w.shape[1]), np.float32))
    fns = {n: jax.jit(FORMULATIONS[n][1]) for n in names}
    args = {n: (x, weights[FORMULATIONS[n][0]]) for n in names}
    out = {n: np.asarray(fns[n](*args[n])) for n in names}
    first = {}  # the first formulation listed for each weight format: the others must agree with it
    for n in names:
        first.setdefault(FORMULATIONS[n][0], n)
    med = interleaved_medians(fns, args, reps)
    return [
        {
            "formulation": n,
            "weights": FORMULATIONS[n][0],
            "ms": med[n] * 1e3,
            "vs float32": med["float32"] / med[n],
            "error vs float32": relative_error(out[n], out["float32"]),
            "differs from its format's first row": relative_error(out[n], out[first[FORMULATIONS[n][0]]]),
        }
        for n in names
    ]


# --------------------------------------------------------------------------------------------------
# Speed and memory of the whole decode step
# --------------------------------------------------------------------------------------------------


def decode_step_times(variants: dict, batch: int, slots: int = 256, steps: int = 4, reps: int = 3) -> list[dict]:
    """The greedy decode step (the engine's :func:`jaxlab.engine.steps.decode_step`, cache donated as
    :class:`jaxlab.Generator` and a server run it) of each variant ``{label: (params, kv_dtype)}``, at
    ``batch`` rows and a ``slots``-slot cache.

    Each variant is compiled first (``compile s``), then ``reps`` rounds run ``steps`` steps of every
    variant in turn; ``ms/step`` is the median over all timed steps, ``vs <first label>`` the first
    variant's median over this one's (the first variant is the baseline)."""
    programs, state, compile_s = Programs(), {}, {}
    for label, (params, kv) in variants.items():
        cache = init_cache(params.config, batch, slots, kv)
        tok, pos = jnp.zeros((batch,), jnp.int32), jnp.zeros((batch,), jnp.int32)
        step, compile_s[label] = programs.get("decode", jit_decode, (params, tok, pos, cache, None, GREEDY))
        tok, _, cache = step(params, tok, pos, cache, None, GREEDY)  # first run: touches every buffer once
        jax.block_until_ready(tok)
        state[label] = [step, params, tok, pos + 1, cache]
    times = {label: [] for label in variants}
    for _ in range(reps):
        for label, st in state.items():
            step, params, tok, pos, cache = st
            for _ in range(steps):
                t = time.perf_counter()
                tok, _, cache = step(params, tok, pos, cache, None, GREEDY)
                jax.block_until_ready(tok)
                times[label].append(time.perf_counter() - t)
                pos = jnp.minimum(pos + 1, slots - 1)
            st[2:] = [tok, pos, cache]
    base = next(iter(variants))
    med = {label: float(np.median(t)) for label, t in times.items()}
    return [
        {
            "variant": label,
            "batch": batch,
            "ms/step": med[label] * 1e3,
            f"vs {base}": med[base] / med[label],
            "compile s": compile_s[label],
        }
        for label in variants
    ]


def memory_rows(params_by_format: dict, cfg, kv_batch: int = 32, kv_len: int = 256) -> list[dict]:
    """Bytes of the weights per format (``{label: Params}``, float32 first) and of a ``kv_batch`` x
    ``kv_len`` KV cache in float32 and int8 (computed from shapes, nothing allocated)."""
    from jaxlab.engine.kvcache import cache_bytes
    from jaxlab.quant.quality import kv_format

    base = None
    rows = []
    for label, params in params_by_format.items():
        b = params.nbytes()
        base = base or b
        rows.append({"what": f"weights, {label}", "MB": b / 1e6, "vs float32": base / b})
    kv_base = None
    for kv in quant.KV_FORMATS:
        b = cache_bytes(cfg, kv_batch, kv_len, kv_format(kv))
        kv_base = kv_base or b
        rows.append({"what": f"KV cache {kv_batch} x {kv_len}, {kv}", "MB": b / 1e6, "vs float32": kv_base / b})
    return rows


def plot_speed_memory(memory: Sequence[dict], speed: Sequence[dict]):
    """Two panels: weight memory per format (``memory``: rows of :func:`memory_rows`), and each variant's
    decode-step speed against the baseline of its batch (``speed``: rows of :func:`decode_step_times`,
    one call per batch size), its milliseconds written on the bar."""
    import matplotlib.pyplot as plt

    fig, (a0, a1) = plt.subplots(1, 2, figsize=(10, 3.6), gridspec_kw={"width_ratios": [1, 1.4]})
    w = [r for r in memory if r["what"].startswith("weights")]
    a0.bar([r["what"].split(", ", 1)[1] for r in w], [r["MB"] for r in w], color="tab:blue")
    a0.set_ylabel("MB")
    a0.set_title("Weights")
    for i, r in enumerate(w):
        a0.text(i, r["MB"], f"{r['MB']:.0f}", ha="center", va="bottom", fontsize=8)
    batches = list(dict.fromkeys(r["batch"] for r in speed))
    labels = list(dict.fromkeys(r["variant"] for r in speed))
    width = 0.8 / len(labels)
    colors = dict(zip(labels, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    seen = set()
    for i, b in enumerate(batches):
        rows = [r for r in speed if r["batch"] == b]
        for j, r in enumerate(rows):
            x = i + (j - (len(rows) - 1) / 2) * width
            ratio = next(v for k, v in r.items() if k.startswith("vs "))
            a1.bar(x, ratio, width, color=colors[r["variant"]], label=None if r["variant"] in seen else r["variant"])
            seen.add(r["variant"])
            a1.text(x, ratio, f"{r['ms/step']:.0f} ms", ha="center", va="bottom", fontsize=7)
    a1.axhline(1.0, color="k", lw=0.8)
    a1.set_xticks(range(len(batches)))
    a1.set_xticklabels([f"batch {b}" for b in batches])
    a1.set_ylabel("speed vs float32 (x)")
    a1.set_title("Decode step, measured here")
    a1.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------------------------------
# Quality
# --------------------------------------------------------------------------------------------------


def quality_rows(scores: dict, labels: Sequence[str] | None = None) -> list[dict]:
    """Rows from :func:`jaxlab.quant.quality.score_windows`'s result: perplexity, its increase over the
    reference in %, mean KL(float32 || variant) and top-1 agreement (fraction of positions where both
    pick the same next token)."""
    ref = scores["reference"]
    rows = [
        {
            "variant": "float32",
            "perplexity": ref["perplexity"],
            "ppl increase %": 0.0,
            "KL": 0.0,
            "top-1 agreement": 1.0,
        }
    ]
    for label in labels or [k for k in scores if k != "reference"]:
        s = scores[label]
        rows.append(
            {
                "variant": label,
                "perplexity": s["perplexity"],
                "ppl increase %": 100.0 * (s["perplexity"] / ref["perplexity"] - 1.0),
                "KL": s["kl"],
                "top-1 agreement": s["top1_agreement"],
            }
        )
    return rows


# --------------------------------------------------------------------------------------------------
# The stored bench run (data/bench/quant-cpu.json)
# --------------------------------------------------------------------------------------------------


def stored_decode_rows(bench: dict) -> list[dict]:
    """One row per variant of a stored ``jaxlab bench --quant`` run: the decode step's speed against float32 at
    each batch size (> 1 is faster), and the quality verdict of the same run (perplexity within +1 %, greedy
    agreement at least 90 %)."""
    quality = {r["label"]: r for r in bench.get("quality", {}).get("rows", [])}
    rows: dict[str, dict] = {}
    for r in bench["quant"]["rows"]:
        row = rows.setdefault(r["label"], {"variant": r["label"]})
        row[f"batch {r['batch']}"] = (
            f"{r['vs_float32']:.2f}x" if r["label"] != "float32" else f"{1e3 * r['step_s']['median']:.1f} ms"
        )
    for label, row in rows.items():
        q = quality.get(label)
        row["quality"] = q["status"] if q else "-"
    return list(rows.values())


def stored_quality_rows(bench: dict) -> list[dict]:
    """The stored run's quality rows: perplexity increase over float32, mean KL, top-1 agreement (teacher-forced)
    and greedy agreement (32 prompts)."""
    return [
        {
            "variant": r["label"],
            "ppl increase %": r["ppl_increase_pct"],
            "KL": r["kl"],
            "top-1 agreement": r["top1_agreement"],
            "greedy agreement": r["greedy_agreement"],
            "quality": r["status"],
        }
        for r in bench["quality"]["rows"]
    ]


def plot_stored_decode(bench: dict, label: str = ""):
    """The stored run's decode-step speed against float32, one group of bars per batch size, one bar per
    variant (float32 weights with the int8 cache included). Returns the figure."""
    import matplotlib.pyplot as plt

    rows = [r for r in bench["quant"]["rows"] if r["label"] != "float32"]
    batches = sorted({r["batch"] for r in rows})
    labels = list(dict.fromkeys(r["label"] for r in rows))
    ratio = {(r["label"], r["batch"]): r["vs_float32"] for r in rows}
    fig, ax = plt.subplots(figsize=(9, 3.6))
    width = 0.8 / len(labels)
    for j, name in enumerate(labels):
        xs = [i + (j - (len(labels) - 1) / 2) * width for i in range(len(batches))]
        ax.bar(xs, [ratio.get((name, b), float("nan")) for b in batches], width, label=name)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(batches)))
    ax.set_xticklabels([f"batch {b}" for b in batches])
    ax.set_ylabel("decode step speed vs float32 (x)")
    ax.set_xlabel("batch size (256 cache slots)")
    ax.set_title(f"Decode step by format, {label or 'stored run'}", fontsize=10)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    return fig
