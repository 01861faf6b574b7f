"""Checks for notebook 06's exercises: a top-p (nucleus) filter and a min-p filter.

Both compare the reader's ``fn(logits [B, V], value) -> filtered logits [B, V]`` (removed tokens set to
``-inf``, kept ones unchanged) with :func:`jaxlab.engine.sampling.filter_logits` at temperature 1 with the
other filters off, on random logits and random thresholds.
"""

from __future__ import annotations

import functools

import jax
import numpy as np

from jaxlab.engine.sampling import Sampling
from jaxlab.lab.exercises import check_function

SHAPE = (4, 50)  # one shape for every trial: eager JAX compiles each operation once per shape


def _logits(rng):
    return (rng.normal(size=SHAPE) * 2.0).astype(np.float32)


@functools.lru_cache(maxsize=1)
def _filter():
    from jaxlab.engine.sampling import filter_logits

    return jax.jit(filter_logits)


def reference_top_p(logits, top_p):
    return np.asarray(
        _filter()(
            np.asarray(logits, np.float32),
            Sampling(np.float32(1.0), np.int32(0), np.float32(top_p), np.float32(0.0), greedy=False),
        )
    )


def reference_min_p(logits, min_p):
    return np.asarray(
        _filter()(
            np.asarray(logits, np.float32),
            Sampling(np.float32(1.0), np.int32(0), np.float32(1.0), np.float32(min_p), greedy=False),
        )
    )


def check_top_p(fn, trials: int = 8) -> bool:
    return check_function(
        fn,
        reference_top_p,
        lambda rng: (_logits(rng), float(rng.uniform(0.2, 0.95))),
        name="top-p filter",
        trials=trials,
    )


def check_min_p(fn, trials: int = 8) -> bool:
    return check_function(
        fn,
        reference_min_p,
        lambda rng: (_logits(rng), float(rng.uniform(0.02, 0.6))),
        name="min-p filter",
        trials=trials,
    )
