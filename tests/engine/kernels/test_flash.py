"""The flash-attention kernel computes the model's attention: causal by position, padding, GQA, a cache."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax.experimental.pallas import tpu as pltpu

from jaxlab.engine.kernels import flash_attention, lower
from jaxlab.engine.kernels.flash import key_block_bounds

KVH, G = 3, 3  # SmolLM2's grouping: 9 query heads over 3 KV heads


def reference(q, k, v, q_pos, k_pos):
    """The model's formulation (engine/model.py, Attention): scores, the position rule, softmax; a query that
    sees no key gives zeros here (the kernel's convention; the model's padding rows are never read)."""
    s = jnp.einsum("nqd,nsd->nqs", q, k, precision="highest") * q.shape[-1] ** -0.5
    visible = (k_pos[:, None, :] >= 0) & (k_pos[:, None, :] <= q_pos[:, :, None])
    p = jax.nn.softmax(jnp.where(visible, s, -1e30), axis=-1)
    out = jnp.einsum("nqs,nsd->nqd", p, v, precision="highest")
    return jnp.where(visible.any(-1)[..., None], out, 0.0)


def problem(rng, b, t, cached, d, dtype=np.float32):
    """b left-padded rows of up to t new tokens after ``cached`` earlier positions, in the kernel's layout:
    N = b x KVH problems, Q = G x t queries each (query (g, t) at row g*t + t), keys = the cache then the new tokens."""
    lens = rng.integers(1, t + 1, b)
    s = cached + t
    pos = np.full((b, t), -1)
    for r, n in enumerate(lens):
        pos[r, t - n :] = cached + np.arange(n)
    key_pos = np.concatenate([np.tile(np.arange(cached), (b, 1)), pos], axis=1)
    q_pos = np.repeat(np.tile(pos, (1, G)), KVH, axis=0)
    k_pos = np.repeat(key_pos, KVH, axis=0)
    n = b * KVH
    q, k, v = (jnp.asarray(rng.standard_normal(shape), dtype) for shape in ((n, G * t, d), (n, s, d), (n, s, d)))
    return q, k, v, jnp.asarray(q_pos, jnp.int32), jnp.asarray(k_pos, jnp.int32)


def assert_close(got, want, valid, atol=1e-5):
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    m = np.asarray(valid)
    np.testing.assert_allclose(got[m], want[m], atol=atol, rtol=0)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    b=st.integers(1, 3),
    t=st.integers(1, 24),
    cached=st.sampled_from([0, 5, 32]),
    d=st.sampled_from([8, 16]),
    seed=st.integers(0, 2**16),
)
def test_flash_equals_the_models_attention_on_random_ragged_shapes(b, t, cached, d, seed):
    q, k, v, qp, kp = problem(np.random.default_rng(seed), b, t, cached, d)
    got = flash_attention(q, k, v, qp, kp, block_q=8, block_k=16)
    assert_close(got, reference(q, k, v, qp, kp), qp >= 0)


@pytest.mark.parametrize("variant", ["tpu", "gpu"])
def test_both_variants_and_the_cache_layout_agree(variant):
    q, k, v, qp, kp = problem(np.random.default_rng(1), 2, 13, 19, 16)
    want = reference(q, k, v, qp, kp)
    for vt in (False, True):  # the contiguous cache keeps values as [N, D, S]
        vv = v.transpose(0, 2, 1) if vt else v
        got = flash_attention(q, k, vv, qp, kp, v_transposed=vt, variant=variant, block_q=8, block_k=8)
        assert_close(got, want, qp >= 0)


def test_tpu_interpret_mode_simulates_the_tpu_kernel():
    """TPU interpret mode simulates VMEM/SMEM, the scalar prefetch and the copies (not Mosaic's compiler)."""
    q, k, v, qp, kp = problem(np.random.default_rng(2), 1, 8, 8, 8)
    got = flash_attention(q, k, v, qp, kp, variant="tpu", block_q=8, block_k=8, interpret=pltpu.InterpretParams())
    assert_close(got, reference(q, k, v, qp, kp), qp >= 0)


def test_bfloat16_within_the_stated_tolerance():
    q, k, v, qp, kp = problem(np.random.default_rng(3), 2, 16, 16, 16)
    want = reference(q, k, v, qp, kp)
    got = flash_attention(
        q.astype(jnp.bfloat16),
        k.astype(jnp.bfloat16),
        v.astype(jnp.bfloat16),
        qp,
        kp,
        dtype=jnp.bfloat16,
        precision=jax.lax.Precision.DEFAULT,
        block_q=8,
        block_k=8,
    )
    assert_close(got, want, qp >= 0, atol=3e-2)  # bfloat16 inputs (8 bits of mantissa), float32 sums


def test_causal_prefill_visits_only_blocks_on_or_below_the_diagonal():
    pos = jnp.arange(64)[None]
    bounds = np.asarray(key_block_bounds(pos, pos, 16, 16)).reshape(4, 2)
    assert bounds.tolist() == [[0, 1], [0, 2], [0, 3], [0, 4]]  # 10 of 16 blocks: the upper triangle skipped
    padded = jnp.concatenate([jnp.full((1, 32), -1), jnp.arange(32)[None]], axis=1)  # half the row is padding
    assert np.asarray(key_block_bounds(padded, padded, 16, 16)).reshape(4, 2).tolist() == [
        [0, 0],
        [0, 0],
        [2, 3],
        [2, 4],
    ]


@pytest.mark.parametrize("platform,variant,call", [("tpu", "tpu", "tpu_custom_call"), ("cuda", "gpu", "triton")])
def test_the_kernel_lowers_for_a_chip_that_is_not_here(platform, variant, call):
    q, k, v, qp, kp = problem(np.random.default_rng(4), 2, 64, 64, 64)
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (q, k, v, qp, kp)]
    text = lower(lambda *a: flash_attention(*a, variant=variant, interpret=False), platform, *shapes)
    assert call in text
