"""Exercises of notebook 05 (the KV cache): the cache write and the cache's memory formula.

The cache write is a piece of the build-the-engine track (:mod:`jaxlab.lab.exercises.track`): there the model writes
its cache with it (``init_cache(..., slot_write=my_cache_update)``)."""

from __future__ import annotations

from typing import Callable

import jax.numpy as jnp
import numpy as np

from jaxlab.engine.kvcache import cache_bytes, write_slots
from jaxlab.io.config import LlamaConfig
from jaxlab.lab.exercises import check_function

ITEMSIZE_DTYPE = {2: jnp.bfloat16, 4: jnp.float32}


def _update_inputs(rng: np.random.Generator):
    axis = int(rng.integers(1, 4))  # the slot axis: not the batch axis
    shape = [int(rng.integers(1, 3)), int(rng.integers(2, 5)), int(rng.integers(2, 6)), int(rng.integers(2, 6))]
    shape[axis] = int(rng.integers(6, 17))  # slots
    cache = rng.standard_normal(shape).astype(np.float32)
    new_shape = list(shape)
    new_shape[axis] = int(rng.integers(1, 4))  # tokens to write
    new = rng.standard_normal(new_shape).astype(np.float32)
    index = int(rng.integers(0, shape[axis] - new_shape[axis] + 1))
    return cache, new, index, axis


def check_cache_update(my_cache_update: Callable, trials: int = 5) -> bool:
    """``my_cache_update(cache, new, index, axis) -> cache`` with ``new`` written at slots
    ``index .. index + T - 1`` along ``axis``, against :func:`jaxlab.engine.kvcache.write_slots` (the model's write)."""
    return check_function(
        my_cache_update, write_slots, _update_inputs, name="cache update", trials=trials, atol=0, rtol=0
    )


def _bytes_inputs(rng: np.random.Generator):
    kv = int(rng.integers(1, 5))
    cfg = LlamaConfig(
        vocab_size=64,
        dim=32,
        n_layers=int(rng.integers(1, 40)),
        n_heads=kv * int(rng.integers(1, 5)),
        n_kv_heads=kv,
        head_dim=int(rng.choice([32, 64, 80, 128])),
        ffn_dim=64,
        name="random",
    )
    return cfg, int(rng.integers(1, 9)), int(rng.integers(1, 9000)), int(rng.choice([2, 4]))


def reference_kv_cache_bytes(cfg: LlamaConfig, batch: int, slots: int, itemsize: int) -> int:
    """Bytes of keys and values of a jaxlab cache of that size (shaped with ``jax.eval_shape``)."""
    return cache_bytes(cfg, batch, slots, ITEMSIZE_DTYPE[itemsize])


def check_kv_cache_bytes(my_kv_cache_bytes: Callable, trials: int = 5) -> bool:
    """``my_kv_cache_bytes(cfg, batch, slots, itemsize) -> int`` against the bytes of a real
    :class:`jaxlab.KVCache` of that size."""
    # compared as 1-element arrays: a scalar mismatch must show up as an element that differs
    return check_function(
        lambda *a: np.atleast_1d(my_kv_cache_bytes(*a)),
        lambda *a: np.atleast_1d(reference_kv_cache_bytes(*a)),
        _bytes_inputs,
        name="KV cache bytes",
        trials=trials,
    )
