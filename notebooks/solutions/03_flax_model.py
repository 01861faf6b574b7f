"""Solutions to the exercises of notebook 03 (the model in Flax NNX)."""

import jax
import jax.numpy as jnp


def my_apply_rope(x, cos, sin):
    # x [B, T, H, d]; cos, sin [B, T, d]: pair i is (i, i + d/2) ("rotate half")
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, :, None, :] + rotated * sin[:, :, None, :]


def my_gqa_attention(q, k, v, visible):
    # q [B, T, H, d]; k, v [B, S, KVH, d]; visible [B, T, S]
    group = q.shape[2] // k.shape[2]
    k = jnp.repeat(k, group, axis=2)  # [B, S, H, d]: K/V head j serves query heads j*group .. j*group+group-1
    v = jnp.repeat(v, group, axis=2)  # (jnp.tile would pair query head h with K/V head h % KVH: wrong)
    scores = jnp.einsum("bthd,bshd->bhts", q, k) / jnp.sqrt(q.shape[-1])
    scores = jnp.where(visible[:, None], scores, -jnp.inf)  # every query sees at least itself: no all -inf row
    return jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(scores, axis=-1), v)
