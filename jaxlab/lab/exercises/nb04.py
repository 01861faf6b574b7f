"""Checks for notebook 04's exercises: pad a prompt to its bucket, and write one greedy decode step.

* :func:`check_pad_to_bucket` compares ``fn(ids, buckets, pad_id) -> (tokens [L], positions [L])`` with
  :func:`jaxlab.bench.stages.pad_to_bucket` on random prompt lengths and bucket lists.
* :func:`check_decode_step` compares ``fn(params, token, pos, cache) -> (next token [B], cache)`` with
  :func:`jaxlab.bench.stages.greedy_decode_step`: both are rolled forward several steps (each feeding its own
  tokens and cache back in) from the same prefilled, ragged batch on a tiny random model, so a step that
  forgets to return the updated cache, or writes the wrong position, is caught by the later tokens.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.lab.exercises import check_function

ROLL_STEPS = 4


def check_pad_to_bucket(fn, trials: int = 8) -> bool:
    from jaxlab.bench.stages import pad_to_bucket

    def make_inputs(rng):
        buckets = tuple(sorted(rng.choice([4, 8, 16, 32, 64], size=int(rng.integers(1, 4)), replace=False).tolist()))
        n = int(rng.integers(1, 2 * buckets[-1] + 2))  # sometimes past the largest bucket
        ids = rng.integers(3, 1000, size=n).tolist()
        return ids, buckets, int(rng.integers(0, 3))

    return check_function(fn, pad_to_bucket, make_inputs, name="pad_to_bucket", trials=trials)


@functools.lru_cache(maxsize=1)
def _tiny_params():
    # random weights large enough that greedy tokens vary from step to step instead of repeating one id
    from jaxlab.tools.program_export import tiny_params

    return tiny_params()


BATCH, PROMPT_COLUMNS = 3, 8  # fixed shapes, so each step function compiles once for all trials


def _prefilled(rng):
    """(params, first token [B], next positions [B], cache) after prefilling a ragged, left-padded batch
    with the engine's prefill step (greedy)."""
    from jaxlab.engine.kvcache import init_cache, left_pad
    from jaxlab.engine.steps import GREEDY, jit_prefill

    params = _tiny_params()
    cfg = params.config
    prompts = [
        rng.integers(3, cfg.vocab_size, size=int(rng.integers(1, PROMPT_COLUMNS + 1))).tolist() for _ in range(BATCH)
    ]
    tokens, positions = left_pad(prompts, cfg.pad_id, PROMPT_COLUMNS)
    cache = init_cache(cfg, BATCH, PROMPT_COLUMNS + ROLL_STEPS)
    first, _, cache = jit_prefill(params, jnp.asarray(tokens), jnp.asarray(positions), cache, None, GREEDY)
    return params, first, jnp.asarray([len(p) for p in prompts], jnp.int32), cache


def _roll(step):
    """Run ``step`` ROLL_STEPS times (jitted), feeding back its tokens and cache -> (tokens [B, steps], cache.pos)."""

    def rolled(params, token, pos, cache):
        jitted = jax.jit(step)
        out = []
        for _ in range(ROLL_STEPS):
            token, cache = jitted(params, token, pos, cache)
            out.append(np.asarray(token))
            pos = pos + 1
        return np.stack(out, axis=1), np.asarray(cache.pos)

    return rolled


def check_decode_step(fn, trials: int = 3) -> bool:
    """Your step is run under ``jax.jit`` (as the lab runs its own), so write it with ``jnp`` operations."""
    from jaxlab.bench.stages import greedy_decode_step

    return check_function(_roll(fn), _roll(greedy_decode_step), _prefilled, name="greedy decode step", trials=trials)
