"""The gated delta rule's two forms compute the same sums, equal a plain transcription of the reference's loop, and
leave their state untouched by padding; the causal convolution gives the same outputs token by token as at once.

Small prime-ish sizes (H=3, Dk=5, Dv=7) so that a transposed axis cannot hide."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.engine import deltanet
from jaxlab.engine.deltanet import l2norm

B, H, DK, DV = 2, 3, 5, 7
# jitted: the chunked form is dozens of small operations, and run eagerly each is compiled for each new shape
# (1.3 s per shape against 0.5 s for the one program); the tests reuse a few shapes so most calls compile nothing
gated_delta_recurrent = jax.jit(deltanet.gated_delta_recurrent)
gated_delta_chunked = jax.jit(deltanet.gated_delta_chunked, static_argnames="chunk")
causal_conv1d = jax.jit(deltanet.causal_conv1d)


def inputs(t: int, seed: int = 0):
    """q, k (l2-normalised, q scaled), v, g (<= 0), beta in (0, 1), and a random initial state."""
    rng = np.random.default_rng(seed)
    q = l2norm(jnp.asarray(rng.normal(size=(B, t, H, DK)), jnp.float32)) * DK**-0.5
    k = l2norm(jnp.asarray(rng.normal(size=(B, t, H, DK)), jnp.float32))
    v = jnp.asarray(rng.normal(size=(B, t, H, DV)), jnp.float32)
    g = -jnp.asarray(rng.uniform(0.0, 2.0, size=(B, t, H)), jnp.float32)
    beta = jnp.asarray(rng.uniform(0.0, 1.0, size=(B, t, H)), jnp.float32)
    state = jnp.asarray(rng.normal(size=(B, H, DK, DV)), jnp.float32)
    return q, k, v, g, beta, state


def numpy_recurrent(q, k, v, g, beta, state):
    """``transformers``' ``torch_recurrent_gated_delta_rule`` transcribed line by line into numpy (float64), with q
    already normalised and scaled: the loop the reference decodes with."""
    q, k, v, g, beta = (np.asarray(x, np.float64).swapaxes(1, 2) for x in (q, k, v, g, beta))  # [B, H, T, ...]
    s = np.asarray(state, np.float64).copy()
    out = np.zeros_like(v)
    for i in range(q.shape[2]):
        q_t, k_t, v_t = q[:, :, i], k[:, :, i], v[:, :, i]
        s = s * np.exp(g[:, :, i])[..., None, None]
        kv_mem = (s * k_t[..., None]).sum(axis=-2)
        delta = (v_t - kv_mem) * beta[:, :, i][..., None]
        s = s + k_t[..., None] * delta[..., None, :]
        out[:, :, i] = (s * q_t[..., None]).sum(axis=-2)
    return out.swapaxes(1, 2), s


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("t", [1, 16])
def test_recurrent_equals_the_reference_loop(t):
    q, k, v, g, beta, state = inputs(t)
    out, s = gated_delta_recurrent(q, k, v, g, beta, state)
    want_out, want_s = numpy_recurrent(q, k, v, g, beta, state)
    assert out.shape == (B, t, H, DV) and s.shape == (B, H, DK, DV)
    assert out.dtype == s.dtype == jnp.float32
    assert rel(out, want_out) <= 1e-5 and rel(s, want_s) <= 1e-5


@pytest.mark.parametrize("t, chunk", [(1, 8), (16, 8), (37, 8)], ids=["shorter", "multiple", "ragged"])
def test_chunked_equals_recurrent(t, chunk, parity):
    """The UT transform is the same sum: T shorter than a chunk, a multiple of it, or neither; from a given state."""
    q, k, v, g, beta, state = inputs(t, seed=t)
    out_r, s_r = gated_delta_recurrent(q, k, v, g, beta, state)
    out_c, s_c = gated_delta_chunked(q, k, v, g, beta, state, chunk=chunk)
    assert out_c.shape == (B, t, H, DV) and s_c.shape == (B, H, DK, DV)
    parity(f"gated delta rule, chunked ({chunk}) vs recurrent, T={t}: max relative error {rel(out_c, out_r):.1e}")
    assert rel(out_c, out_r) <= 1e-5 and rel(s_c, s_r) <= 1e-5


@pytest.mark.parametrize("rule", [gated_delta_recurrent, gated_delta_chunked], ids=["recurrent", "chunked"])
def test_no_state_is_the_zero_state(rule):
    q, k, v, g, beta, state = inputs(37, seed=1)
    out, s = rule(q, k, v, g, beta)
    out0, s0 = rule(q, k, v, g, beta, jnp.zeros_like(state))
    assert rel(out, out0) <= 1e-6 and rel(s, s0) <= 1e-6


def test_a_prefill_split_in_two_equals_one():
    """The state carries everything: the last 21 tokens run (one at a time) from the first 16's state equal the
    whole sequence run at once."""
    q, k, v, g, beta, _ = inputs(37, seed=3)
    zero = jnp.zeros((B, H, DK, DV), jnp.float32)
    out, s = gated_delta_chunked(q, k, v, g, beta, zero, chunk=8)
    part = lambda sl: (x[:, sl] for x in (q, k, v, g, beta))  # noqa: E731
    out1, s1 = gated_delta_chunked(*part(slice(0, 16)), zero, chunk=8)
    out2, s2 = gated_delta_recurrent(*part(slice(16, None)), s1)
    assert rel(jnp.concatenate([out1, out2], axis=1), out) <= 1e-5 and rel(s2, s) <= 1e-5


@pytest.mark.parametrize("rule", [gated_delta_recurrent, gated_delta_chunked], ids=["recurrent", "chunked"])
def test_padding_tokens_leave_the_state_unchanged(rule):
    """Tokens with g = 0 and beta = 0 (what the model gives a padding token) neither decay nor write."""
    q, k, v, g, beta, state = inputs(37, seed=5)
    pad = np.zeros((B, 37), bool)
    pad[:, 3:24] = True  # 21 padding tokens in the middle of each row, 16 real ones around them
    g_p = jnp.where(pad[..., None], 0.0, g)
    beta_p = jnp.where(pad[..., None], 0.0, beta)
    kw = {"chunk": 8} if rule is gated_delta_chunked else {}
    out, s = rule(q, k, v, g_p, beta_p, state, **kw)
    keep = ~pad[0]
    out_real, s_real = rule(q[:, keep], k[:, keep], v[:, keep], g[:, keep], beta[:, keep], state, **kw)
    assert rel(s, s_real) <= 1e-5
    assert rel(out[:, keep], out_real) <= 1e-5
    zero = jnp.zeros_like(g[:, keep])
    _, s_pad = rule(q[:, keep], k[:, keep], v[:, keep], zero, zero, state, **kw)  # padding only
    np.testing.assert_array_equal(np.asarray(s_pad), np.asarray(state))


def conv_inputs(t: int, c: int = 11, kk: int = 4, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.normal(size=(B, t, c)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(c, kk)), jnp.float32)
    state = jnp.asarray(rng.normal(size=(B, kk - 1, c)), jnp.float32)
    return x, w, state


def test_conv1d_step_by_step_equals_the_whole_sequence():
    x, w, state = conv_inputs(13)
    y, new = causal_conv1d(x, w, state)
    s, ys = state, []
    for i in range(x.shape[1]):
        y_i, s = causal_conv1d(x[:, i : i + 1], w, s)
        ys.append(y_i)
    np.testing.assert_allclose(np.concatenate(ys, axis=1), y, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(s), np.asarray(new))


def test_conv1d_equals_the_reference_convolution():
    """From an empty state: silu(conv1d(x, weight, padding K-1)[:T]), the reference's causal_conv1d_fn, in numpy."""
    x, w, _ = conv_inputs(9, seed=1)
    y, new = causal_conv1d(x, w, jnp.zeros((B, 3, 11)))
    xp = np.pad(np.asarray(x, np.float64), [(0, 0), (3, 0), (0, 0)])
    want = sum(np.asarray(w, np.float64)[:, j] * xp[:, j : j + 9] for j in range(4))
    np.testing.assert_allclose(y, want / (1 + np.exp(-want)), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(new), np.asarray(x[:, -3:]))


def test_conv1d_skips_padding():
    """Left padding (3 tokens in row 0) after a non-empty state: the real tokens' outputs and the new state are as
    if the padding were not there; the padding's outputs are 0; a padding-only decode step keeps the state."""
    x, w, state = conv_inputs(10, seed=2)
    mask = jnp.asarray(np.arange(10)[None, :] >= np.array([[3], [0]]))
    y, new = causal_conv1d(x, w, state, mask)
    y0, new0 = causal_conv1d(x[:1, 3:], w, state[:1])
    np.testing.assert_allclose(y[0, 3:], y0[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(new[0]), np.asarray(new0[0]))
    np.testing.assert_array_equal(np.asarray(y[0, :3]), 0.0)
    y1, new1 = causal_conv1d(x[1:], w, state[1:])
    np.testing.assert_allclose(y[1], y1[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(new[1]), np.asarray(new1[0]))
    _, kept = causal_conv1d(x[:, :1], w, state, jnp.zeros((B, 1), bool))
    np.testing.assert_array_equal(np.asarray(kept), np.asarray(state))
