"""jaxlab.quant: formats, the matmuls, the model hook, the int8 KV cache and the on-disk cache.

Small odd-sized matrices and the 3-layer ``tiny`` config carry most tests; two tests use the embedded
model for claims about its real weights (int4 g32 lands on its Q4_1 grid; int8 costs little)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab import ConfigError, ModelFileError, forward, init_cache, init_params, quant, tiny
from jaxlab.engine.generate import Generator
from jaxlab.engine.kvcache import left_pad, quantize_kv, rollback
from jaxlab.engine.model import Params, params_from_flat
from jaxlab.engine.programs import signature
from jaxlab.quant import QuantizedMatrix, calibrate

RNG = np.random.default_rng(0)


def _w(o=37, i=64):
    return RNG.standard_normal((o, i)).astype(np.float32)


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


# -- formats ---------------------------------------------------------------------------------------


def test_int8_per_channel_rounding_is_within_half_a_step():
    w = _w()
    m = quant.quantize_matrix(w, "int8")
    assert m.q.dtype == jnp.int8 and m.q.shape == w.shape and m.scale.shape == (w.shape[0],)
    step = np.abs(w).max(axis=1) / 127
    err = np.abs(np.asarray(m.dequantize()) - w)
    assert np.all(err <= step[:, None] / 2 + 1e-7)
    assert np.abs(np.asarray(m.q)).max() == 127  # the largest weight of each row uses the full range


def test_int4_packs_two_per_byte_low_nibble_first():
    w = np.zeros((1, 4), np.float32)
    w[0] = [0.0, 15.0, 3.0, 7.0]  # one group of 4: min 0, step 1 -> codes 0, 15, 3, 7
    m = quant.quantize_matrix(w, "int4", group=4)
    assert m.q.dtype == jnp.uint8 and m.q.shape == (1, 2)
    assert np.asarray(m.q).tolist() == [[0 | (15 << 4), 3 | (7 << 4)]]
    np.testing.assert_allclose(np.asarray(m.dequantize()), w, atol=1e-6)


def test_int4_lands_exactly_on_a_q4_1_grid():
    # weights that already are d * q + m per group of 32 (what a Q4_1 file holds) come back unchanged
    o, i, g = 9, 96, 32
    d = RNG.uniform(0.01, 0.1, (o, i // g, 1)).astype(np.float32)
    mn = RNG.uniform(-1, 0, (o, i // g, 1)).astype(np.float32)
    codes = RNG.integers(0, 16, (o, i // g, g))
    codes[..., 0], codes[..., 1] = 0, 15  # each group uses its whole range, as Q4_1's quantizer does
    w = (d * codes + mn).reshape(o, i).astype(np.float32)
    m = quant.quantize_matrix(w, "int4", group=g)
    assert _rel(m.dequantize(), w) < 1e-6
    # ... and a generic matrix does not
    assert _rel(quant.quantize_matrix(_w(9, 96), "int4", group=g).dequantize(), _w(9, 96)) > 1e-2


@pytest.mark.parametrize("fmt,tol", [("int8", 1e-4), ("int4", 1e-4), ("w8a8", 2e-2)])
def test_dot_matches_the_dequantized_matrix(fmt, tol):
    w, x = _w(37, 64), RNG.standard_normal((2, 3, 64)).astype(np.float32)
    m = quant.quantize_matrix(w, fmt, group=16)
    y = np.asarray(jax.jit(m.dot)(jnp.asarray(x)))
    assert y.shape == (2, 3, 37)
    assert _rel(y, x @ np.asarray(m.dequantize()).T) < tol


def test_w8a8_is_the_integer_formula_and_one_row_equals_two():
    w, x = _w(21, 48), RNG.standard_normal((3, 48)).astype(np.float32)
    m = quant.quantize_matrix(w, "w8a8")
    sx = np.abs(x).max(1, keepdims=True) / 127
    xq = np.clip(np.rint(x / sx), -127, 127).astype(np.int64)
    want = (xq @ np.asarray(m.q, np.int64).T) * sx * np.asarray(m.scale)
    np.testing.assert_allclose(np.asarray(m.dot(jnp.asarray(x))), want, rtol=1e-5, atol=1e-5)
    # a single row is padded to two for XLA:CPU's fast kernel; the answer must not change
    np.testing.assert_allclose(np.asarray(m.dot(jnp.asarray(x[:1]))), want[:1], rtol=1e-5, atol=1e-5)


def test_split_activations_carry_about_15_bits():
    x = RNG.standard_normal((5, 100)).astype(np.float32) * 3
    rows, s = quant.split_activations(jnp.asarray(x))
    assert rows.dtype == jnp.int8 and rows.shape == (10, 100)
    back = np.asarray(quant.join_split(rows.astype(jnp.float32), 5) * s)
    assert np.abs(back - x).max() <= np.abs(x).max() / (127 * 254 * 2) * 1.01


def test_bad_formats_and_groups_say_what_to_do():
    with pytest.raises(ConfigError, match="unknown quantization format 'int3'.*int8, int4, w8a8"):
        quant.quantize_matrix(_w(), "int3")
    with pytest.raises(ConfigError, match="even integer"):
        quant.quantize_matrix(_w(), "int4", group=7)
    with pytest.raises(ConfigError, match="not a multiple of the int4 group size 48"):
        quant.quantize_matrix(_w(4, 64), "int4", group=48, name="layers.0.attn.wq")
    p = init_params(tiny(), 0)
    q = quant.quantize_params(p, "int8")
    with pytest.raises(ConfigError, match="already quantized"):
        quant.quantize_params(q, "int8")


# -- the model hook --------------------------------------------------------------------------------


def _dequantized(qparams: Params, like: Params) -> Params:
    """The float model whose weights are exactly what the quantized matrices stand for."""
    flat = {}
    for name, value in qparams.flat().items():
        if isinstance(value, QuantizedMatrix):
            d = np.asarray(value.dequantize())
            value = d if name == "embed" else d.T
        flat[name] = np.asarray(value)
    return params_from_flat(like.config, flat, like.policy)


def _tokens(cfg, b=2, t=11):
    toks = RNG.integers(3, cfg.vocab_size, (b, t)).astype(np.int32)
    return jnp.asarray(toks), jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))


@pytest.mark.parametrize("fmt,tol", [("int8", 1e-4), ("int4", 1e-4), ("w8a8", 5e-2)])
@pytest.mark.parametrize("tie", [True, False])
def test_quantized_model_equals_float_model_on_dequantized_weights(fmt, tol, tie):
    cfg = dataclasses.replace(tiny(), tie_embeddings=tie)
    p = init_params(cfg, 0)
    q = quant.quantize_params(p, fmt, group=4)
    kinds = {n: type(v).__name__ for n, v in q.flat().items()}
    assert kinds["embed"] == "QuantizedMatrix" and kinds["layers.2.mlp.w_down"] == "QuantizedMatrix"
    assert kinds["layers.0.attn_norm.weight"] == "ArrayImpl"  # norms stay float
    if not tie:
        assert kinds["lm_head"] == "QuantizedMatrix"
    tokens, positions = _tokens(cfg)
    got, _ = jax.jit(forward)(q, tokens, positions)
    want, _ = jax.jit(forward)(_dequantized(q, p), tokens, positions)
    assert _rel(got, want) < tol
    assert q.quant == fmt and p.quant is None
    # float32 scales (and int4 offsets) cost 4 bytes per row, or 8 per group of 4 in this tiny model
    assert q.nbytes() < p.nbytes() / (3 if fmt != "int4" else 1.5)


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_quantized_cached_decode_equals_uncached_forward(fmt):
    cfg = tiny()
    q = quant.quantize_params(init_params(cfg, 1), fmt, group=4)
    # [2, 11]: the uncached pass has the shapes of test_quantized_model_equals_float_model_on_dequantized_weights
    # (tied, group 4), so it reuses that compiled program instead of compiling its own
    tokens, positions = _tokens(cfg, 2, 11)
    full, _ = jax.jit(forward)(q, tokens, positions)
    cache = init_cache(cfg, 2, 16)
    step = jax.jit(forward)
    outs = []
    for i in range(11):
        lg, cache = step(q, tokens[:, i : i + 1], positions[:, i : i + 1], cache)
        outs.append(lg)
    assert _rel(jnp.concatenate(outs, 1), full) < 1e-4


# -- the int8 KV cache -----------------------------------------------------------------------------


def test_int8_kv_cache_layout_and_memory():
    cfg = tiny()
    c8, c32 = init_cache(cfg, 3, 20, "int8"), init_cache(cfg, 3, 20)
    assert c8.quantized and not c32.quantized
    assert c8.k[0].dtype == jnp.int8 and c8.k_scale[0].shape == (3 * cfg.n_kv_heads, 20)
    # int8 K and V plus one float32 scale per stored vector: (Hd + 4) / (4 Hd) of float32
    assert c8.nbytes() == c32.nbytes() * (cfg.head_dim + 4) // (4 * cfg.head_dim)
    r = rollback(c8, 5)
    assert r.k_scale is c8.k_scale and int(r.index) == 5
    with pytest.raises(ValueError, match="float type or int8"):
        init_cache(cfg, 1, 4, jnp.int16)


def test_quantize_kv_per_vector():
    k = RNG.standard_normal((4, 6, 10)).astype(np.float32)  # [N, T, Hd]
    q, s = quantize_kv(jnp.asarray(k), axis=2)
    assert q.dtype == jnp.int8 and s.shape == (4, 6)
    assert np.abs(np.asarray(q, np.float32) * np.asarray(s)[..., None] - k).max() <= np.asarray(s).max() / 2 + 1e-7


def test_int8_kv_cache_decode_is_close_to_float_cache():
    cfg = tiny()
    p = init_params(cfg, 2)
    tokens, positions = _tokens(cfg, 2, 12)
    step = jax.jit(forward)
    res = {}
    for dtype in ("float32", "int8"):
        cache = init_cache(cfg, 2, 16, dtype)
        lg, cache = step(p, tokens[:, :8], positions[:, :8], cache)  # prefill 8
        outs = [lg[:, -1:]]
        for i in range(8, 12):
            lg, cache = step(p, tokens[:, i : i + 1], positions[:, i : i + 1], cache)
            outs.append(lg)
        res[dtype] = jnp.concatenate(outs, 1)
    err = _rel(res["int8"], res["float32"])
    assert 0 < err < 2e-2  # quantized (so not bit-equal), but close


def test_generator_runs_quantized_weights_with_int8_cache_and_keeps_formats_apart():
    cfg = tiny()
    p = init_params(cfg, 3)
    prompts = [[5, 6, 7, 8], [9, 10]]
    outs = {}
    for fmt in ("int8", "w8a8"):
        gen = Generator(quant.quantize_params(p, fmt), cache_dtype=jnp.int8)
        r = gen.generate(prompts, max_new_tokens=6, ignore_eos=True)
        again = gen.generate(prompts, max_new_tokens=6, ignore_eos=True)
        assert [x.generated_ids for x in r] == [x.generated_ids for x in again]
        assert all(len(x.generated_ids) == 6 for x in r)
        outs[fmt] = gen
        assert len(gen.programs) > 0
    # int8 and w8a8 parameters have identical array shapes; the compile key must still tell them apart (and
    # must not tell two int8 models apart)
    int8, w8a8 = (outs[f].params for f in ("int8", "w8a8"))
    other_int8 = quant.quantize_params(init_params(cfg, 4), "int8")
    assert signature("decode", (int8,)) != signature("decode", (w8a8,))
    assert signature("decode", (int8,)) == signature("decode", (other_int8,))


# -- the cache on disk -----------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["int8", "int4", "w8a8"])
def test_save_and_load_round_trip(tmp_path, fmt):
    cfg = tiny()
    p = init_params(cfg, 4)
    tokens, positions = _tokens(cfg, 2, 6)
    calibration = quant.activation_stats(p, tokens, positions) if fmt == "w8a8" else None
    q = quant.quantize_params(p, fmt, group=4, calibration=calibration)
    assert fmt != "w8a8" or q.flat()["layers.1.mlp.w_up"].smooth is not None
    path = tmp_path / "q.safetensors"
    quant.save(path, q)
    back = quant.load(path)
    assert back.quant == fmt and jax.tree.structure(back) == jax.tree.structure(q)
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(q)):
        assert a.dtype == b.dtype and np.array_equal(np.asarray(a), np.asarray(b))


def test_corrupt_cache_file_names_the_fix(tmp_path):
    path = tmp_path / "q.safetensors"
    path.write_bytes(b"not a safetensors file")
    with pytest.raises(ModelFileError, match="unreadable.*delete it to rebuild"):
        quant.load(path)


# -- the embedded model ----------------------------------------------------------------------------


def test_int4_g32_reproduces_the_embedded_q4_1_layers(smollm):
    """The embedded GGUF holds Q4_1 layers (group 32) and a Q8_0 embedding: int4 g32 lands exactly on
    every layer; only the embedding (re-quantized to int8) moves."""
    q = quant.quantize_params(smollm.params, "int4", 32)
    errs = dict(quant.layer_errors(smollm.params, q))
    layer_errs = [e for n, e in errs.items() if n != "embed"]
    assert len(layer_errs) == 7 * 30
    assert max(layer_errs) < 1e-6
    assert 1e-3 < errs["embed"] < 3e-2
    assert q.quant == "int4" and q.flat()["embed"].fmt == "int8"


def test_int8_keeps_the_embedded_models_next_token(smollm):
    tok = smollm.tokenizer
    ids = tok.encode("The capital of France is Paris. The capital of Germany is")
    tokens, positions = left_pad([ids], tok.pad_id if hasattr(tok, "pad_id") else 0)
    f = jax.jit(forward, static_argnames="last_only")
    ref, _ = f(smollm.params, tokens, positions, last_only=True)
    got, _ = f(quant.quantize_params(smollm.params, "int8"), tokens, positions, last_only=True)
    lr, lq = jax.nn.log_softmax(ref[0, -1]), jax.nn.log_softmax(got[0, -1])
    kl = float(jnp.sum(jnp.exp(lr) * (lr - lq)))
    assert int(jnp.argmax(ref[0, -1])) == int(jnp.argmax(got[0, -1]))
    assert kl < 0.05


# -- W8A8 calibration (SmoothQuant) ----------------------------------------------------------------


def test_smoothed_w8a8_still_computes_x_times_w():
    w, x = _w(21, 48), RNG.standard_normal((3, 48)).astype(np.float32)
    x[:, 5] *= 40  # an outlier channel, as LLM activations have
    act_max = np.abs(x).max(0)
    s = quant.smoothing_factors(act_max, w, 0.5)
    plain = quant.quantize_matrix(w, "w8a8")
    smooth = quant.quantize_matrix(w * s, "w8a8")
    smooth = dataclasses.replace(smooth, smooth=jnp.asarray(s))
    exact = x @ w.T
    assert _rel(smooth.dequantize(), w) < 0.05  # rows() undoes the smoothing
    err_plain, err_smooth = _rel(plain.dot(jnp.asarray(x)), exact), _rel(smooth.dot(jnp.asarray(x)), exact)
    assert err_smooth < err_plain / 2  # the outlier no longer sets every token's int8 step alone


def test_activation_stats_are_the_inputs_of_each_matrix():
    from jaxlab.engine.model import RMSNorm

    cfg = tiny()
    p = init_params(cfg, 6)
    tokens, positions = _tokens(cfg, 2, 7)
    stats = quant.activation_stats(p, tokens, positions)
    assert set(stats) == set(quant.quantized_names(p))
    q = quant.quantize_params(p, "int8").flat()
    assert all(v.shape == (q[n].shape[1],) for n, v in stats.items())
    # layer 0's q/k/v all read norm(embedding)
    x = jnp.take(p.flat()["embed"], tokens, axis=0)
    norm = RMSNorm(cfg.dim, cfg.norm_eps, p.policy)
    h = norm(x) * p.flat()["layers.0.attn_norm.weight"]
    want = np.abs(np.asarray(h)).reshape(-1, cfg.dim).max(0)
    for m in ("wq", "wk", "wv"):
        np.testing.assert_allclose(stats[f"layers.0.attn.{m}"], want, rtol=1e-5)


def test_calibrated_w8a8_beats_plain_w8a8_on_the_embedded_model(smollm):
    """SmoothQuant's claim, checked on the real model: calibrated W8A8 is closer to float32."""
    tok = smollm.tokenizer
    ids = tok.encode(
        "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n"
        "    return a\n\nThe function above returns the n-th Fibonacci number, computed"
    )
    tokens, positions = left_pad([ids], 0)
    f = jax.jit(forward)
    ref = jax.nn.log_softmax(f(smollm.params, tokens, positions)[0], -1)

    def kl(params):
        lq = jax.nn.log_softmax(f(params, tokens, positions)[0], -1)
        return float(jnp.mean(jnp.sum(jnp.exp(ref) * (ref - lq), -1)))

    calibrated = quant.quantize_model(smollm.params, tok, "w8a8")
    assert calibrated.flat()["layers.3.mlp.w_down"].smooth is not None
    # plain W8A8 as the same code builds it with every factor 1 (x / 1 and W * 1 are exact): the calibrated
    # model's layout, so one compiled program of the 30 layers serves both
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(calibrate, "smoothing_factors", lambda act_max, w, alpha: np.ones(w.shape[1], np.float32))
        plain = quant.quantize_params(
            smollm.params, "w8a8", calibration=dict.fromkeys(quant.quantized_names(smollm.params))
        )
    assert np.all(np.asarray(plain.flat()["layers.3.mlp.w_down"].smooth) == 1)
    assert kl(calibrated) < 0.7 * kl(plain)


def test_params_from_flat_places_quantized_matrices_and_checks_their_shape():
    cfg = tiny()
    q = quant.quantize_params(init_params(cfg, 7), "int8")
    flat = q.flat()
    back = params_from_flat(cfg, flat, q.policy)
    assert jax.tree.structure(back) == jax.tree.structure(q) and back.quant == "int8"
    wrong = dict(flat, **{"layers.0.attn.wq": flat["layers.0.attn.wk"]})  # [kv_dim, dim] where [dim, dim] belongs
    with pytest.raises(ConfigError, match="layers.0.attn.wq has shape"):
        params_from_flat(cfg, wrong, q.policy)
