"""Exercises of notebook 03 (the model in Flax NNX): grouped-query attention and RoPE, checked against
``jaxlab.engine.model``'s way of computing them."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.engine.kernels.common import MASK_VALUE
from jaxlab.engine.model import apply_rope, rope_cos_sin
from jaxlab.lab.exercises import check_function


def reference_gqa_attention(q, k, v, visible):
    """Grouped-query attention as jaxlab computes it: q [B, T, H, d], k and v [B, S, KVH, d], visible bool
    [B, T, S] -> [B, T, H, d]. Query head ``h`` reads K/V head ``h // (H // KVH)``: the queries are reshaped
    into KVH groups and an einsum broadcasts each K/V head over its group (nothing is copied)."""
    q, k, v = (jnp.asarray(a, jnp.float32) for a in (q, k, v))
    b, t, h, d = q.shape
    kvh = k.shape[2]
    qg = q.reshape(b, t, kvh, h // kvh, d)
    scores = jnp.einsum("btkgd,bskd->bkgts", qg, k) * d**-0.5
    scores = jnp.where(jnp.asarray(visible)[:, None, None], scores, MASK_VALUE)
    out = jnp.einsum("bkgts,bskd->btkgd", jax.nn.softmax(scores, axis=-1), v)
    return out.reshape(b, t, h, d)


def _gqa_inputs(rng: np.random.Generator):
    b, t = int(rng.integers(1, 3)), int(rng.integers(2, 7))
    kvh, group, d = int(rng.choice([2, 3])), int(rng.choice([2, 3])), int(rng.choice([4, 8, 16]))
    q = rng.standard_normal((b, t, kvh * group, d)).astype(np.float32)
    k = rng.standard_normal((b, t, kvh, d)).astype(np.float32)
    v = rng.standard_normal((b, t, kvh, d)).astype(np.float32)
    causal = np.tril(np.ones((t, t), bool))
    keep = rng.random((b, t, t)) > 0.3  # some keys hidden too; every query always sees itself
    visible = (causal[None] & keep) | np.eye(t, dtype=bool)[None]
    return q, k, v, visible


def check_gqa_attention(my_gqa_attention: Callable, trials: int = 5) -> bool:
    """``my_gqa_attention(q [B, T, H, d], k [B, S, KVH, d], v [B, S, KVH, d], visible [B, T, S]) -> [B, T, H, d]``
    against :func:`reference_gqa_attention` (query head h uses K/V head h // (H // KVH))."""
    return check_function(
        my_gqa_attention,
        reference_gqa_attention,
        _gqa_inputs,
        name="gqa_attention",
        trials=trials,
        atol=1e-5,
        rtol=1e-4,
    )


def _rope_inputs(rng: np.random.Generator):
    b, t, h = rng.integers(1, 3), rng.integers(1, 6), rng.integers(1, 4)
    d = int(rng.choice([4, 8, 16, 64]))
    positions = rng.integers(0, 2000, (b, t))
    cos, sin = rope_cos_sin(jnp.asarray(positions), d, float(rng.choice([10000.0, 100000.0])))
    x = rng.standard_normal((b, t, h, d)).astype(np.float32)
    return x, np.asarray(cos), np.asarray(sin)


def check_rope(my_apply_rope: Callable, trials: int = 5) -> bool:
    """``my_apply_rope(x [B, T, H, d], cos [B, T, d], sin [B, T, d]) -> [B, T, H, d]`` against
    :func:`jaxlab.engine.model.apply_rope` ("rotate half" layout)."""
    return check_function(
        my_apply_rope, apply_rope, _rope_inputs, name="apply_rope", trials=trials, atol=1e-5, rtol=1e-5
    )
