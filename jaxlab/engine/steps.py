"""The jitted steps every generation loop is built from: pure functions of arrays.

* :func:`prefill_step` — a prompt chunk [B, T] in, the first new token out (sampled inside the prefill
  program, so the first token needs one compiled program, not two);
* :func:`decode_step` — one token per row;
* :func:`choose` — logits to (token, its log-probability under the unscaled model).

``jit_prefill`` and ``jit_decode`` are the jitted forms with the KV cache (argument 3) *donated*, so XLA
updates it in place instead of copying it every step. Sampling settings travel as one pytree
(:class:`~jaxlab.engine.sampling.Sampling`). The loops (:class:`~jaxlab.engine.generate.Generator`,
:class:`~jaxlab.engine.sharding.Sharded`, :class:`~jaxlab.engine.speculative.SpeculativeDecoder`,
:func:`~jaxlab.engine.generate.decode_on_device`) call these; none restates them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxlab.engine.kvcache import KVCache
from jaxlab.engine.model import Params, forward
from jaxlab.engine.sampling import Sampling, sample


def choose(logits: jax.Array, key: jax.Array, sampling: Sampling) -> tuple[jax.Array, jax.Array]:
    """logits [B, V] -> (next tokens [B] int32, their log-probabilities under the unscaled model [B])."""
    nxt = sample(logits, key, sampling)
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), nxt[:, None], axis=-1)[:, 0]
    return nxt, logp


def prefill_step(params: Params, tokens, positions, cache: KVCache, key, sampling: Sampling, **hooks):
    """Prompt chunk tokens, positions [B, T] -> (next tokens [B], their logprobs [B], cache).

    For all but the last chunk of a long prompt the sampled token is ignored. ``hooks`` go to
    :func:`~jaxlab.engine.model.forward` (``reduce`` for a tensor-parallel shard)."""
    logits, cache = forward(params, tokens, positions, cache, last_only=True, **hooks)
    return (*choose(logits[:, 0], key, sampling), cache)


def decode_step(params: Params, tokens, positions, cache: KVCache, key, sampling: Sampling, **hooks):
    """One token per row: tokens, positions [B] -> (next tokens [B], their logprobs [B], cache)."""
    logits, cache = forward(params, tokens[:, None], positions[:, None], cache, **hooks)
    return (*choose(logits[:, 0], key, sampling), cache)


jit_prefill = jax.jit(prefill_step, donate_argnums=(3,))
jit_decode = jax.jit(decode_step, donate_argnums=(3,))
