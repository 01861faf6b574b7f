"""What the kernels share: a row's sums (norm, softmax, logprobs) computed alike, alone or among many rows."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.engine.kernels.common import ALIKE_ELEMENTS, LOG_SOFTMAX, SOFTMAX, online_softmax, rows_alike


def mean_square(rows):
    return jnp.mean(rows * rows, axis=-1, keepdims=True)


@pytest.mark.parametrize("fn", [mean_square, SOFTMAX, LOG_SOFTMAX], ids=["mean of squares", "softmax", "log-softmax"])
@pytest.mark.parametrize("size", [10, 64, 576])
def test_a_row_gets_the_same_bits_alone_and_among_many(fn, size):
    """XLA:CPU sums the rows of a small array in another order than those of a large one (a decode step of 1 row
    against one of 32); through rows_alike the first rows come out the same bits at every count, and the values are
    the function's own."""
    many = -(-ALIKE_ELEMENTS // (3 * size)) + 4  # enough outer rows of 3 inner rows to need no copies
    x = jnp.asarray(np.random.default_rng(size).standard_normal((many, 3, size)) * 3, jnp.float32)
    step = jax.jit(lambda v: rows_alike(fn, v))
    full = np.asarray(step(x))
    for n in (1, 2, 3, 5, 8):
        np.testing.assert_array_equal(np.asarray(step(x[:n])), full[:n], err_msg=f"{n} rows")
    np.testing.assert_allclose(full, np.asarray(jax.jit(fn)(x)), rtol=1e-6, atol=1e-6)


def test_only_arrays_below_the_threshold_get_copies():
    small, large = jnp.ones((2, 100)), jnp.ones((41, 100))  # 200 and 4,100 elements
    assert "pad" in str(jax.make_jaxpr(lambda v: rows_alike(mean_square, v))(small))
    assert "pad" not in str(jax.make_jaxpr(lambda v: rows_alike(mean_square, v))(large))
    assert rows_alike(mean_square, small).shape == (2, 1) and float(rows_alike(mean_square, small)[0, 0]) == 1.0


def test_the_online_softmax_sums_a_block_alike_and_computes_the_same():
    rng = np.random.default_rng(1)
    s = jnp.asarray(rng.standard_normal((64, 3, 32)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((64, 32, 8)), jnp.float32)
    m, total, acc = jnp.full((64, 3, 1), -1e30), jnp.zeros((64, 3, 1)), jnp.zeros((64, 3, 8))

    def fold(scores, values, alike):
        return online_softmax(m[: len(scores)], total[: len(scores)], acc[: len(scores)], scores,
                              lambda p: jnp.einsum("nqk,nkd->nqd", p, values), alike=alike)  # fmt: skip

    step = jax.jit(fold, static_argnums=2)
    alike = step(s, v, True)
    for a, b in zip(alike, step(s, v, False)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(step(s[:1], v[:1], True)[1]), np.asarray(alike[1])[:1])
