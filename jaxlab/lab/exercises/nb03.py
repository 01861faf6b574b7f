"""Exercises of notebook 03 (the model in Flax NNX): RMSNorm and RoPE, checked against ``jaxlab.engine.model``."""

from __future__ import annotations

from typing import Callable

import jax.numpy as jnp
import numpy as np

from jaxlab.engine.model import Policy, RMSNorm, apply_rope, rope_cos_sin
from jaxlab.lab.exercises import check_function


def reference_rmsnorm(x, weight, eps):
    """jaxlab's own RMSNorm module with ``weight`` loaded: x [..., D], weight [D] -> [..., D]."""
    norm = RMSNorm(weight.shape[-1], eps, Policy())
    norm.weight[...] = jnp.asarray(weight, jnp.float32)
    return norm(jnp.asarray(x, jnp.float32))


def _rmsnorm_inputs(rng: np.random.Generator):
    b, t, d = rng.integers(1, 4), rng.integers(1, 7), int(rng.choice([8, 24, 40]))
    x = (rng.standard_normal((b, t, d)) * rng.uniform(0.1, 10)).astype(np.float32)
    w = rng.uniform(0.5, 2.0, d).astype(np.float32)
    return x, w, float(rng.choice([1e-5, 1e-6, 1e-2]))


def check_rmsnorm(my_rmsnorm: Callable, trials: int = 5) -> bool:
    """``my_rmsnorm(x [..., D], weight [D], eps) -> [..., D]`` against :class:`jaxlab.engine.model.RMSNorm`."""
    return check_function(
        my_rmsnorm, reference_rmsnorm, _rmsnorm_inputs, name="rmsnorm", trials=trials, atol=1e-5, rtol=1e-4
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
