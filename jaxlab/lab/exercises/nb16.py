"""Checks for notebook 16's exercises: the KV cache's bytes, and how many rows fit on a chip.

* ``my_kv_bytes(n_layers, n_kv_heads, head_dim, batch, context, itemsize)``: bytes of a KV cache (K and V, every
  layer, every row and token). Reference: :func:`jaxlab.engine.kvcache.cache_bytes`.
* ``my_max_batch(weights_bytes, kv_bytes_per_row, hbm_bytes, reserve=0.1)``: the most rows whose KV caches fit
  beside the weights when a fraction ``reserve`` of the HBM is kept for the program's temporaries and code.
"""

from __future__ import annotations

import numpy as np

from jaxlab.lab.exercises import check_function


def reference_kv_bytes(n_layers, n_kv_heads, head_dim, batch, context, itemsize):
    return 2 * n_layers * n_kv_heads * head_dim * batch * context * itemsize


def _kv_inputs(rng):
    # SmolLM2-135M, SmolLM2-1.7B and Llama-3-8B's shapes, and random ones; bfloat16, float32 or int8 numbers
    layers, kvh, hd = [
        (30, 3, 64),
        (24, 32, 64),
        (32, 8, 128),
        (int(rng.integers(1, 80)), int(rng.integers(1, 17)), 64),
    ][int(rng.integers(0, 4))]
    return layers, kvh, hd, int(rng.integers(1, 65)), int(rng.integers(1, 8193)), int(rng.choice([1, 2, 4]))


def check_kv_bytes(fn, trials: int = 20) -> bool:
    return check_function(
        lambda *a: np.int64(fn(*a)), lambda *a: np.int64(reference_kv_bytes(*a)), _kv_inputs,
        name="KV-cache bytes", trials=trials, atol=0, rtol=0,
    )  # fmt: skip


def reference_max_batch(weights_bytes, kv_bytes_per_row, hbm_bytes, reserve=0.1):
    free = hbm_bytes * (1 - reserve) - weights_bytes
    return max(0, int(free // kv_bytes_per_row))


def _batch_inputs(rng):
    hbm = float(rng.choice([16e9, 32e9, 16 * 2**30]))
    weights = float(rng.uniform(0.1, 1.1)) * hbm  # sometimes more than the chip holds: then no row fits
    return weights, float(rng.uniform(1e6, 2e9)), hbm, float(rng.choice([0.0, 0.1, 0.2]))


def check_max_batch(fn, trials: int = 20) -> bool:
    return check_function(
        lambda *a: np.int64(fn(*a)), lambda *a: np.int64(reference_max_batch(*a)), _batch_inputs,
        name="rows that fit", trials=trials, atol=0, rtol=0,
    )  # fmt: skip
