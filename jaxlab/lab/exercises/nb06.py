"""Checks for notebook 06's exercises: a top-p (nucleus) filter, a min-p filter and a batched sampler.

* :func:`check_top_p` and :func:`check_min_p` compare the reader's ``fn(logits [B, V], value) -> filtered logits
  [B, V]`` (removed tokens set to ``-inf``, kept ones unchanged) with :func:`jaxlab.engine.sampling.filter_logits` at
  temperature 1 with the other filters off, on random logits and random thresholds.
* :func:`check_sample` compares ``fn(logits [B, V], keys [B], temperatures [B]) -> tokens [B]`` (the argmax where the
  temperature is 0, else a draw from ``softmax(logits / t)`` with the row's own key) with the engine's per-row
  sampler, :func:`jaxlab.engine.sampling.sample_rows`, token for token: the same key gives the same draw. It is a
  piece of the build-the-engine track (:mod:`jaxlab.lab.exercises.track`): it picks each request's first token.
"""

from __future__ import annotations

import functools

import jax
import numpy as np

from jaxlab.engine.sampling import Sampling, SamplingParams, stack_rows
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


@functools.lru_cache(maxsize=1)
def _sample_rows():
    from jaxlab.engine.sampling import sample_rows

    return jax.jit(sample_rows)


def reference_sample(logits, keys, temperatures):
    """The engine's per-row sampler with the temperature only (top-k, top-p and min-p off): tokens [B] int32."""
    sampling, greedy_rows = stack_rows([SamplingParams(temperature=float(t)) for t in np.asarray(temperatures)])
    return np.asarray(_sample_rows()(np.asarray(logits, np.float32), keys, sampling, greedy_rows))


def _sample_inputs(rng):
    temperatures = np.where(rng.random(SHAPE[0]) < 0.4, 0.0, rng.uniform(0.5, 1.5, SHAPE[0])).astype(np.float32)
    keys = jax.random.split(jax.random.key(int(rng.integers(2**31))), SHAPE[0])  # one key per row [B]
    return _logits(rng), keys, temperatures


def check_sample(fn, trials: int = 6) -> bool:
    """``fn(logits [B, V], keys [B], temperatures [B]) -> tokens [B]``: compared draw for draw with the engine's
    sampler, so use ``jax.random.categorical(key, logits / t)`` with each row's own key."""
    return check_function(fn, reference_sample, _sample_inputs, name="batched sampler", trials=trials)
