"""Checks for notebook 18's exercises: one step of the gated delta rule, one step of the causal convolution, and
the decay matrix of a chunk.

* ``my_delta_step(S, q, k, v, g, beta)``: one head, one token. S [Dk, Dv] the state, q and k [Dk], v [Dv], g <= 0
  the log decay, beta in (0, 1) -> (o [Dv], S_new [Dk, Dv]). Reference: :func:`jaxlab.engine.deltanet.
  gated_delta_recurrent` on a batch of one head and one token.
* ``my_conv_step(state, x, w)``: the decode step of the short causal convolution: state [K-1, C] the last inputs,
  x [C] this token's, w [C, K] -> (y [C] after SiLU, new state [K-1, C]). Reference:
  :func:`jaxlab.engine.deltanet.causal_conv1d` with T = 1.
* ``my_decay_matrix(g)``: log decays g [C] of a chunk -> D [C, C] with D[i, j] = exp(g_{j+1} + ... + g_i) for
  j <= i (the decay a write at j has suffered when read at i; 1 on the diagonal) and 0 above it: the mask the
  chunked form multiplies its QK^T and KK^T products by.
"""

from __future__ import annotations

import numpy as np

from jaxlab.engine.deltanet import causal_conv1d, gated_delta_recurrent
from jaxlab.lab.exercises import check_function


def reference_delta_step(S, q, k, v, g, beta):
    f = lambda x: np.asarray(x, np.float32)[None, None, None]  # noqa: E731  one batch row, one token, one head
    out, s = gated_delta_recurrent(f(q), f(k), f(v), f(g), f(beta), np.asarray(S, np.float32)[None, None])
    return np.asarray(out[0, 0, 0]), np.asarray(s[0, 0])


def _delta_inputs(rng):
    dk, dv = int(rng.integers(2, 9)), int(rng.integers(2, 9))
    unit = lambda x: x / np.linalg.norm(x)  # noqa: E731  the layer l2-normalises q and k
    S = rng.standard_normal((dk, dv)).astype(np.float32)
    q, k = unit(rng.standard_normal(dk)).astype(np.float32), unit(rng.standard_normal(dk)).astype(np.float32)
    return S, q, k, rng.standard_normal(dv).astype(np.float32), np.float32(-rng.random()), np.float32(rng.random())


def _pair(fn):
    def call(*a):
        o, s = fn(*a)
        return np.concatenate([np.ravel(np.asarray(o, np.float32)), np.ravel(np.asarray(s, np.float32))])

    return call


def check_delta_step(fn, trials: int = 10) -> bool:
    return check_function(
        _pair(fn), _pair(reference_delta_step), _delta_inputs, name="gated delta rule, one step", trials=trials
    )


def reference_conv_step(state, x, w):
    y, s = causal_conv1d(np.asarray(x, np.float32)[None, None], np.asarray(w, np.float32), np.asarray(state)[None])
    return np.asarray(y[0, 0]), np.asarray(s[0])


def _conv_inputs(rng):
    c, k = int(rng.integers(1, 7)), int(rng.integers(2, 5))
    return (
        rng.standard_normal((k - 1, c)).astype(np.float32),
        rng.standard_normal(c).astype(np.float32),
        rng.standard_normal((c, k)).astype(np.float32),
    )


def check_conv_step(fn, trials: int = 10) -> bool:
    return check_function(
        _pair(fn), _pair(reference_conv_step), _conv_inputs, name="causal conv1d, one decode step", trials=trials
    )


def reference_decay_matrix(g):
    cum = np.cumsum(np.asarray(g, np.float64))
    diff = cum[:, None] - cum[None, :]
    return np.where(np.tril(np.ones((len(cum),) * 2, bool)), np.exp(np.minimum(diff, 0.0)), 0.0)


def _decay_inputs(rng):
    return (-rng.random(int(rng.integers(1, 9))) * rng.choice([0.1, 1.0, 5.0]),)


def check_decay_matrix(fn, trials: int = 10) -> bool:
    return check_function(
        lambda g: np.asarray(fn(g), np.float64),
        reference_decay_matrix,
        _decay_inputs,
        name="a chunk's decay matrix",
        trials=trials,
    )
