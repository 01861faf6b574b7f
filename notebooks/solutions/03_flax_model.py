"""Solutions to the exercises of notebook 03 (the model in Flax NNX)."""

import jax.numpy as jnp


def my_rmsnorm(x, weight, eps):
    # x [..., D], weight [D]: divide by the root-mean-square over the last axis, in float32
    x = jnp.asarray(x, jnp.float32)
    return weight * x / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)


def my_apply_rope(x, cos, sin):
    # x [B, T, H, d]; cos, sin [B, T, d]: pair i is (i, i + d/2) ("rotate half")
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, :, None, :] + rotated * sin[:, :, None, :]
