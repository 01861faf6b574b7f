"""jaxlab.lab.quantlab (what notebook 09 measures and draws) and notebook 09's exercise checkers.

Hermetic: small random matrices and the 3-layer ``tiny`` config; nothing loads the embedded model."""

from __future__ import annotations

import jax.numpy as jnp
import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

from conftest import load_solution  # noqa: E402

from jaxlab import init_params, quant, tiny
from jaxlab.lab import quantlab  # noqa: E402
from jaxlab.lab.exercises import nb09  # noqa: E402

RNG = np.random.default_rng(0)


def _q4_grid(o=6, i=64, g=32):
    """A matrix that already lies on a Q4_1 grid (step and minimum per group of ``g``)."""
    d = RNG.uniform(0.01, 0.1, (o, i // g, 1))
    mn = RNG.uniform(-1, 0, (o, i // g, 1))
    codes = RNG.integers(0, 16, (o, i // g, g))
    codes[..., 0], codes[..., 1] = 0, 15
    return (d * codes + mn).reshape(o, i).astype(np.float32)


# -- one matrix, every format ----------------------------------------------------------------------


def test_matrix_formats_bits_bytes_and_errors():
    w = RNG.standard_normal((12, 64)).astype(np.float32)
    rows = {r["format"]: r for r in quantlab.matrix_formats(w, (("int8", 0), ("int4", 32), ("int4", 64)))}
    assert list(rows) == ["float32", "int8", "int4 g32", "int4 g64"]
    # int8: 8 bits + a float32 scale per row of 64; int4: 4 bits + float32 step and offset per group
    assert rows["int8"]["bits/weight"] == pytest.approx(8 + 32 / 64)
    assert rows["int4 g32"]["bits/weight"] == pytest.approx(4 + 64 / 32)
    assert rows["int4 g64"]["bits/weight"] == pytest.approx(4 + 64 / 64)
    assert rows["int8"]["kB"] == pytest.approx((12 * 64 + 12 * 4) / 1e3)
    assert 0 < rows["int8"]["relative error"] < rows["int4 g32"]["relative error"] < rows["int4 g64"]["relative error"]
    m = quant.quantize_matrix(w, "int8")
    assert rows["int8"]["relative error"] == pytest.approx(quantlab.relative_error(m.dequantize(), w))
    assert rows["int8"]["worst error / max |w|"] <= 0.5 / 127 + 1e-6  # half a step, at most


def test_int4_g32_reproduces_a_q4_1_grid_and_g64_does_not():
    w = _q4_grid()
    rows = {r["format"]: r for r in quantlab.matrix_formats(w, (("int4", 32), ("int4", 64)))}
    assert rows["int4 g32"]["relative error"] < 1e-6
    assert rows["int4 g64"]["relative error"] > 1e-3


def test_nibbles_show_the_packed_layout():
    w = np.array([[0.0, 15.0, 3.0, 7.0, 1.0, 2.0, 0.0, 15.0]], np.float32)  # groups of 4: step 1, min 0
    m = quant.quantize_matrix(w, "int4", group=4)
    rows = quantlab.nibbles(m, n=2)
    assert [r["value"] for r in rows] == [0 | 15 << 4, 3 | 7 << 4]
    assert rows[0]["bits (high|low)"] == "1111|0000" and rows[1]["codes (low, high)"] == "3, 7"
    assert rows[1]["inputs"] == "2, 3"
    with pytest.raises(ValueError, match="int4"):
        quantlab.nibbles(quant.quantize_matrix(w, "int8"))


# -- activations -----------------------------------------------------------------------------------


def test_channel_spread_and_widest():
    stats = {"a": np.array([1.0, 1.0, 1.0, 50.0]), "b": np.array([1.0, 2.0, 2.0, 3.0]), "c": np.ones(4)}
    assert quantlab.channel_spread(stats["a"]) == pytest.approx(50.0)
    assert quantlab.channel_spread(stats["c"]) == pytest.approx(1.0)
    assert quantlab.widest(stats, 2) == ["a", "b"]


def test_activation_rows_before_and_after_smoothing():
    cfg = tiny()
    p = init_params(cfg, 3)
    names = quant.quantized_names(p)
    w_in = {n: (p.flat()[n].shape[1] if n == "embed" else p.flat()[n].shape[0]) for n in names}
    stats = {n: np.abs(RNG.standard_normal(k)) + 0.1 for n, k in w_in.items()}
    stats["layers.1.mlp.w_down"][7] = 300.0  # an outlier channel
    smoothed = quant.quantize_params(p, "w8a8", calibration=stats, alpha=0.5)
    rows = quantlab.activation_rows(stats, smoothed, ["layers.1.mlp.w_down", "embed"])
    r = rows[0]
    assert r["largest channel"] == pytest.approx(300.0)
    assert r["levels for a median channel"] == pytest.approx(127 / r["spread"])
    assert r["spread, smoothed"] < r["spread"] / 5  # the square root of the outlier's range stays behind
    assert set(quantlab.activation_rows(stats, None, ["embed"])[0]) == {
        "matrix",
        "largest channel",
        "spread",
        "levels for a median channel",
    }


# -- per-layer error -------------------------------------------------------------------------------


def test_layer_errors_and_exact_count():
    p = init_params(tiny(), 0)
    errs = quantlab.layer_errors(p, {"int8": quant.quantize_params(p, "int8")})
    assert errs["int8"] == quant.layer_errors(p, quant.quantize_params(p, "int8"))
    assert quantlab.exact_count(errs["int8"]) == (0, len(errs["int8"]) - 1)  # the embedding left out
    synthetic = [("layers.0.attn.wq", 0.0), ("layers.0.attn.wk", 1e-3), ("embed", 0.0)]
    assert quantlab.exact_count(synthetic) == (1, 2)
    assert quantlab.exact_count(synthetic, layers_only=False) == (2, 3)


def test_plot_layer_errors_draws_exact_matrices_on_the_floor():
    errs = {
        "int8": [("layers.0.attn.wq", 0.01), ("embed", 0.012)],
        "int4 g32": [("layers.0.attn.wq", 0.0), ("embed", 0.08)],
        "w8a8": [("layers.0.attn.wq", 0.0), ("embed", 0.0)],
    }  # all exact: no filled points at all
    ax = quantlab.plot_layer_errors(errs, floor=1e-4)
    assert ax.get_yscale() == "log"
    labels = ax.get_legend_handles_labels()[1]
    assert "int4 g32: exact (drawn at 1e-04)" in labels and "w8a8: exact (drawn at 1e-04)" in labels
    matplotlib.pyplot.close(ax.figure)


# -- formulations and the decode step ---------------------------------------------------------------


def test_time_formulations_agree_within_a_format():
    w = RNG.standard_normal((40, 64)).astype(np.float32)
    rows = {r["formulation"]: r for r in quantlab.time_formulations(w, batch=1, reps=1)}
    assert set(rows) == set(quantlab.FORMULATIONS)
    assert rows["float32"]["vs float32"] == 1.0 and rows["float32"]["error vs float32"] == 0.0
    for r in rows.values():
        assert r["ms"] > 0
        assert r["differs from its format's first row"] < 1e-4  # same weights, same product
    assert rows["w8a8, one int8 row"]["differs from its format's first row"] == 0.0
    assert rows["w8a8, padded to two rows (jaxlab)"]["error vs float32"] == pytest.approx(
        rows["w8a8, one int8 row"]["error vs float32"]
    )
    assert 0 < rows["int8, two int8 rows (jaxlab)"]["error vs float32"] < 0.05
    # a subset still gets the float32 baseline
    subset = quantlab.time_formulations(w, batch=2, reps=1, names=["int8, convert then float dot"])
    assert [r["formulation"] for r in subset] == ["float32", "int8, convert then float dot"]


def test_decode_step_times_rows():
    cfg = tiny()
    p = init_params(cfg, 0)
    q = quant.quantize_params(p, "int8")
    rows = quantlab.decode_step_times(
        {"float32": (p, jnp.float32), "int8 + int8 KV": (q, jnp.int8)}, batch=2, slots=4, steps=3, reps=2
    )  # 7 steps: positions clamp at 3
    assert [r["variant"] for r in rows] == ["float32", "int8 + int8 KV"]
    assert rows[0]["vs float32"] == 1.0 and rows[1]["vs float32"] > 0
    assert all(r["batch"] == 2 and r["ms/step"] > 0 and r["compile s"] > 0 for r in rows)


def test_memory_rows_are_the_bytes():
    from jaxlab.engine.kvcache import cache_bytes

    cfg = tiny()
    p = init_params(cfg, 0)
    q = quant.quantize_params(p, "int8")
    rows = quantlab.memory_rows({"float32": p, "int8": q}, cfg, kv_batch=3, kv_len=16)
    assert [r["what"] for r in rows] == [
        "weights, float32",
        "weights, int8",
        "KV cache 3 x 16, float32",
        "KV cache 3 x 16, int8",
    ]
    assert rows[1]["MB"] == pytest.approx(q.nbytes() / 1e6)
    assert rows[1]["vs float32"] == pytest.approx(p.nbytes() / q.nbytes())
    assert rows[3]["MB"] == pytest.approx(cache_bytes(cfg, 3, 16, "int8") / 1e6)
    assert rows[0]["vs float32"] == rows[2]["vs float32"] == 1.0


def test_plot_speed_memory():
    mem = [
        {"what": "weights, float32", "MB": 538.0, "vs float32": 1.0},
        {"what": "weights, int8", "MB": 135.0, "vs float32": 4.0},
    ]
    speed = [
        {"variant": "float32", "batch": 1, "ms/step": 24.0, "vs float32": 1.0},
        {"variant": "int8", "batch": 1, "ms/step": 13.0, "vs float32": 1.85},
        {"variant": "float32", "batch": 32, "ms/step": 87.0, "vs float32": 1.0},
        {"variant": "w8a8 + int8 KV", "batch": 32, "ms/step": 60.0, "vs float32": 1.45},
    ]
    fig = quantlab.plot_speed_memory(mem, speed)
    a0, a1 = fig.axes
    assert len(a0.patches) == 2 and len(a1.patches) == 4
    assert sorted(a1.get_legend_handles_labels()[1]) == ["float32", "int8", "w8a8 + int8 KV"]  # float32 once
    matplotlib.pyplot.close(fig)


def test_quality_rows():
    scores = {
        "reference": {"perplexity": 20.0, "tokens": 10},
        "int8": {"perplexity": 20.2, "kl": 0.005, "top1_agreement": 0.95, "tokens": 10},
    }
    rows = quantlab.quality_rows(scores)
    assert rows[0] == {
        "variant": "float32",
        "perplexity": 20.0,
        "ppl increase %": 0.0,
        "KL": 0.0,
        "top-1 agreement": 1.0,
    }
    assert rows[1]["ppl increase %"] == pytest.approx(1.0) and rows[1]["KL"] == 0.005


# -- the exercises ---------------------------------------------------------------------------------


def test_exercise_checkers():
    sol = load_solution("09_quantization")
    assert nb09.check_quantize_int8(sol.my_quantize_int8)
    assert nb09.check_pack_int4(sol.my_pack_int4, sol.my_unpack_int4)
    assert nb09.check_w8a8_matmul(sol.my_w8a8_matmul)

    def per_tensor(w):  # one scale for the whole matrix
        s = np.abs(w).max() / 127
        return np.round(w / s).astype(np.int8), np.full(w.shape[0], s, np.float32)

    def truncating(w):
        q, s = sol.my_quantize_int8(w)
        return np.trunc(w / s[:, None]).astype(np.int8), s

    assert not nb09.check_quantize_int8(per_tensor)
    assert not nb09.check_quantize_int8(truncating)
    assert not nb09.check_quantize_int8(
        lambda w: (
            sol.my_quantize_int8(w)[0].astype(np.int32),  # wrong dtype
            sol.my_quantize_int8(w)[1],
        )
    )
    high_first = lambda c: (c[:, 1::2] | (c[:, 0::2] << 4)).astype(np.uint8)  # noqa: E731
    assert not nb09.check_pack_int4(high_first, sol.my_unpack_int4)
    assert not nb09.check_pack_int4(sol.my_pack_int4, lambda p: np.stack([p >> 4, p & 15], -1).reshape(len(p), -1))

    def weight_only(x, q, w_scale):  # forgot to quantize the activations
        return x @ (q.astype(np.float32) * w_scale[:, None]).T

    def one_scale(x, q, w_scale):  # one activation scale for all rows instead of one per token
        s = np.abs(x).max() / 127
        return (np.round(x / s) @ q.astype(np.float32).T) * s * w_scale

    assert not nb09.check_w8a8_matmul(weight_only)
    assert not nb09.check_w8a8_matmul(one_scale)


def test_exercise_references_match_jaxlab():
    """The pack/unpack references are jaxlab's own int4 layout."""
    w = RNG.standard_normal((5, 64)).astype(np.float32)
    m = quant.quantize_matrix(w, "int4", group=32)
    codes = nb09.reference_unpack_int4(np.asarray(m.q))
    np.testing.assert_array_equal(codes, np.asarray(quant.unpack_int4(m.q)))
    np.testing.assert_array_equal(nb09.reference_pack_int4(codes), np.asarray(m.q))


def test_the_stored_bench_run_as_rows_and_a_figure():
    from jaxlab.lab.notebook import stored

    bench = stored("quant-cpu")
    assert "2026" in bench["label"] and "CPUs" in bench["label"]
    decode = {r["variant"]: r for r in quantlab.stored_decode_rows(bench)}
    assert decode["float32"]["batch 1"].endswith(" ms") and decode["int8"]["batch 1"].endswith("x")
    assert decode["int8"]["quality"] == "PASS" and {"batch 1", "batch 8", "batch 32"} <= set(decode["int4"])
    quality = {r["variant"]: r for r in quantlab.stored_quality_rows(bench)}
    assert quality["float32"]["KL"] == 0.0 and quality["w8a8"]["KL"] > quality["int8"]["KL"]
    fig = quantlab.plot_stored_decode(bench, bench["label"])
    ax = fig.axes[0]
    assert bench["label"] in ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
    assert len(ax.patches) == 3 * (len(decode) - 1)  # one bar per variant (float32 is the baseline) and batch
