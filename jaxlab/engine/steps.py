"""The jitted steps every generation loop is built from: pure functions of arrays.

* :func:`next_logits` — the model on a chunk [B, T] with its cache: the logits of the last position (a
  prefill chunk, or one decode token with T = 1); every step below starts with it;
* :func:`choose` — logits to (token, its log-probability under the unscaled model);
* :func:`prefill_step` — a prompt chunk [B, T] in, the first new token out (sampled inside the prefill
  program, so the first token needs one compiled program, not two);
* :func:`decode_step` — one token per row; :func:`greedy_step` is its greedy form that also returns the
  logits (what an exported step, a vmap lesson or a logit check needs);
* :func:`verify_step` — speculative decoding's check: roll the cache back, run ``[x, d_1..d_k]`` at once,
  and let an acceptance rule (:func:`jaxlab.engine.speculative.accept`) keep a prefix;
* :func:`rows_step` — one step of continuous batching: every row its own request, position and sampling;
* :func:`draft_step` — k draft tokens from a draft model (for an early exit: the same weights with
  ``upto=L``), with its own cache.

``jit_prefill``, ``jit_decode``, ``jit_verify``, ``jit_rows`` and ``jit_draft`` are the jitted forms with the KV cache
*donated*, so XLA updates it in place instead of copying it every step; the model's hooks (``upto``,
``reduce``: :func:`~jaxlab.engine.model.forward`) are static. Sampling settings travel as one pytree
(:class:`~jaxlab.engine.sampling.Sampling`; :data:`GREEDY` for argmax). The loops
(:class:`~jaxlab.engine.generate.Generator`, :class:`~jaxlab.engine.speculative.SpeculativeDecoder`,
:func:`~jaxlab.engine.generate.decode_on_device`, the lab's stages) call these; none restates them.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.engine.grammar import mask_logits
from jaxlab.engine.kernels.common import LOG_SOFTMAX, rows_alike
from jaxlab.engine.kvcache import KVCache, rollback
from jaxlab.engine.model import Params, forward
from jaxlab.engine.sampling import Sampling, filter_logits, sample, sample_rows

#: Greedy decoding's settings as the pytree a step takes (argmax reads none of the numbers, nor the key:
#: greedy steps may pass ``key=None``). NumPy scalars, so importing this module starts no device.
GREEDY = Sampling(np.float32(1e-6), np.int32(0), np.float32(1.0), np.float32(0.0), greedy=True)

#: The model's hooks a jitted step treats as static (``upto``: layers run; ``reduce``: a function).
HOOKS = ("upto", "reduce")


def next_logits(params: Params, tokens, positions, cache: KVCache | None, **hooks):
    """tokens, positions [B, T] -> (logits of the last position [B, V] float32, cache).

    With left padding the last position is every row's last real token. ``hooks`` go to
    :func:`~jaxlab.engine.model.forward` (``upto``, ``reduce``)."""
    logits, cache = forward(params, tokens, positions, cache, last_only=True, **hooks)
    return logits[:, 0], cache


def choose(logits: jax.Array, key: jax.Array, sampling: Sampling) -> tuple[jax.Array, jax.Array]:
    """logits [B, V] -> (next tokens [B] int32, their log-probabilities under the unscaled model [B])."""
    nxt = sample(logits, key, sampling)
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), nxt[:, None], axis=-1)[:, 0]
    return nxt, logp


def prefill_step(params: Params, tokens, positions, cache: KVCache, key, sampling: Sampling, **hooks):
    """Prompt chunk tokens, positions [B, T] -> (next tokens [B], their logprobs [B], cache).

    For all but the last chunk of a long prompt the sampled token is ignored."""
    logits, cache = next_logits(params, tokens, positions, cache, **hooks)
    return (*choose(logits, key, sampling), cache)


def decode_step(params: Params, tokens, positions, cache: KVCache, key, sampling: Sampling, **hooks):
    """One token per row: tokens, positions [B] -> (next tokens [B], their logprobs [B], cache)."""
    logits, cache = next_logits(params, tokens[:, None], positions[:, None], cache, **hooks)
    return (*choose(logits, key, sampling), cache)


def greedy_step(params: Params, tokens, positions, cache: KVCache, **hooks):
    """The greedy decode step with its logits: tokens, positions [B] -> (next tokens [B] int32, logits [B, V], cache)."""
    logits, cache = next_logits(params, tokens[:, None], positions[:, None], cache, **hooks)
    return sample(logits, None, GREEDY), logits, cache


def top_alternatives(all_logp, top: int, wanted=None) -> tuple:
    """(logprobs [..., top], ids [..., top]) of the ``top`` most likely tokens, from log-probabilities [..., V]. With
    ``wanted`` (a traced bool []) they are computed only when it is true, zeros otherwise: one program serves the
    steps where some request asked for them and the steps where none did, which pay a branch, not the search."""
    if wanted is None:
        return jax.lax.top_k(all_logp, top)
    shape = all_logp.shape[:-1] + (top,)
    return jax.lax.cond(
        wanted,
        lambda a: tuple(jax.lax.top_k(a, top)),
        lambda a: (jnp.zeros(shape, a.dtype), jnp.zeros(shape, jnp.int32)),
        all_logp,
    )


def rows_step(
    params: Params,
    tokens,
    positions,
    cache,
    seeds,
    sampling: Sampling,
    greedy_rows,
    allowed,
    wanted=None,
    top: int = 0,
    **hooks,
):
    """Every row its own request (continuous batching): tokens, positions [B, T] (each row's last column its
    last token; -1 = padding or an idle row) -> (next tokens [B], their logprobs [B], cache); with ``top`` > 0
    (static) -> (next tokens, logprobs, (the ``top`` most likely tokens' logprobs [B, top], their ids [B, top]),
    cache): an OpenAI client's ``top_logprobs``, computed only when ``wanted`` (bool [], traced; None: always) is
    true (:func:`top_alternatives`).

    Row ``r`` draws with ``fold_in(key(seeds[r]), its last position)`` and its own settings (``sampling``
    with [B] leaves, ``greedy_rows`` [B]: :func:`~jaxlab.engine.sampling.stack_rows`; or :data:`GREEDY`), so
    its token depends on its own request and position only, never on the rows beside it. ``allowed``
    [B, ceil(V/32)] int32 is each row's grammar bitmask (:mod:`jaxlab.engine.grammar`; all ones = free): the
    token is chosen among the allowed ones, and the logprobs stay the model's own, before the mask.

    ``tokens`` may be [B] (one token per row, positions [B, 1]): a decode step fed the tokens of the step before
    as that step returned them, without a trip to the host (the continuous engine's look-ahead)."""
    if tokens.ndim == 1:
        tokens = tokens[:, None]
    logits, cache = next_logits(params, tokens, positions, cache, **hooks)
    keys = jax.vmap(lambda s, p: jax.random.fold_in(jax.random.key(s), p))(seeds, positions[:, -1])
    nxt = sample_rows(mask_logits(logits, allowed), keys, sampling, greedy_rows)
    all_logp = rows_alike(LOG_SOFTMAX, logits)  # a row's logprobs the same bits in every row bucket
    logp = jnp.take_along_axis(all_logp, nxt[:, None], axis=-1)[:, 0]
    if top:
        return nxt, logp, top_alternatives(all_logp, top, wanted), cache
    return nxt, logp, cache


def rows_verify_step(
    params: Params,
    tokens,
    positions,
    cache,
    seeds,
    sampling: Sampling,
    greedy_rows,
    allowed,
    wanted=None,
    top: int = 0,
    **hooks,
):
    """:func:`rows_step` with drafts (speculative decoding on the continuous engine): tokens, positions [B, 1+k],
    each row's last token in column 0 then its own drafts (positions -1 after them: padding, an idle row) -> (the
    model's token after each column [B, 1+k], their logprobs [B, 1+k], cache); with ``top`` > 0 also column 0's
    alternatives, as :func:`rows_step`.

    Column 0 is chosen as :func:`rows_step` chooses (the row's own key at its position, its settings, its grammar
    mask); the other columns greedily, for the host to keep the drafts that equal them (a row's accepted run is
    its own: each row advances by its own count)."""
    logits, cache = forward(params, tokens, positions, cache, **hooks)  # [B, 1+k, V]
    keys = jax.vmap(lambda s, p: jax.random.fold_in(jax.random.key(s), p))(seeds, positions[:, 0])
    first = sample_rows(mask_logits(logits[:, 0], allowed), keys, sampling, greedy_rows)
    out = jnp.argmax(logits, axis=-1).astype(jnp.int32).at[:, 0].set(first)
    all_logp = rows_alike(LOG_SOFTMAX, logits)  # a row's logprobs the same bits in every row bucket
    logp = jnp.take_along_axis(all_logp, out[..., None], axis=-1)[..., 0]
    if top:
        return out, logp, top_alternatives(all_logp[:, 0], top, wanted), cache
    return out, logp, cache


#: accept(logits [B, k+1, V], drafts [B, k], q [B, k, V] or None, key, sampling) -> (tokens [B, k+1], kept [B])
AcceptRule = Callable


def verify_step(
    params: Params, tokens, positions, cache: KVCache, index, q, key, sampling: Sampling, *, accept: AcceptRule, **hooks
):
    """Speculative decoding's check: roll the cache back to ``index`` (forgetting the previous round's
    rejected tokens), run ``tokens`` [B, k+1] = ``[x, d_1..d_k]`` at ``positions`` [B, k+1] in one pass,
    and let ``accept`` keep a prefix of the drafts (``q``: the draft's probabilities [B, k, V], or None).

    -> (tokens [B, k+1]: the model's choice after each prefix, accepted count [B], cache). With k = 0
    (``tokens`` [B, 1]) it is a plain decode step that also rolls back."""
    cache = rollback(cache, index)
    logits, cache = forward(params, tokens, positions, cache, **hooks)  # [B, k+1, V]
    out, n = accept(logits, tokens[:, 1:], q, key, sampling)
    return out, n, cache


def draft_choice(logits: jax.Array, key, sampling: Sampling) -> tuple[jax.Array, jax.Array | None]:
    """A draft model's pick: logits [B, V] -> (token [B] int32, the distribution it was drawn from [B, V];
    None when greedy, where the rule needs no distribution)."""
    token = sample(logits, key, sampling)
    return token, None if sampling.greedy else jax.nn.softmax(filter_logits(logits, sampling), axis=-1)


def draft_step(params: Params, prev, x, pos, cache: KVCache, index, key, sampling: Sampling, *, k: int, **hooks):
    """k draft tokens after ``x`` (at positions ``pos`` [B]) with the draft model and its own cache.

    ``index`` is the slot of ``prev`` (the token before ``x``): the draft's cache is rolled back there and
    fed ``[prev, x]``, rewriting ``prev``'s slot, which fills it in the one case where it was never fed (all
    k drafts of the last round accepted). Returns (drafts [B, k], q [B, k, V] or None when greedy, cache)."""
    cache = rollback(cache, index)
    tokens = jnp.stack([prev, x], axis=1)
    positions = jnp.stack([pos - 1, pos], axis=1)
    logits, cache = next_logits(params, tokens, positions, cache, **hooks)
    keys = jax.random.split(key, k)
    d0, q0 = draft_choice(logits, keys[0], sampling)

    def body(carry, key):
        d, p, cache = carry
        logits, cache = next_logits(params, d[:, None], p[:, None], cache, **hooks)
        nd, nq = draft_choice(logits, key, sampling)
        return (nd, p + 1, cache), (nd, nq)

    (_, _, cache), (ds, qs) = jax.lax.scan(body, (d0, pos + 1, cache), keys[1:])
    drafts = jnp.concatenate([d0[:, None], ds.T], axis=1)  # [B, k]
    q = None if sampling.greedy else jnp.concatenate([q0[:, None], jnp.moveaxis(qs, 0, 1)], axis=1)
    return drafts, q, cache


jit_prefill = jax.jit(prefill_step, donate_argnums=(3,), static_argnames=HOOKS)
jit_decode = jax.jit(decode_step, donate_argnums=(3,), static_argnames=HOOKS)
jit_verify = jax.jit(verify_step, donate_argnums=(3,), static_argnames=("accept", *HOOKS))
jit_rows = jax.jit(rows_step, donate_argnums=(3,), static_argnames=("top", *HOOKS))
jit_rows_verify = jax.jit(rows_verify_step, donate_argnums=(3,), static_argnames=("top", *HOOKS))
jit_draft = jax.jit(draft_step, donate_argnums=(4,), static_argnames=("k", *HOOKS))
