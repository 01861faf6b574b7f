"""Choosing the next token: greedy, temperature, top-k, top-p (nucleus), min-p — with explicit PRNG keys.

The filters apply in the order Hugging Face ``transformers`` uses: temperature, then top-k, then top-p,
then min-p; then one categorical draw. Every filter is written with traced values (no Python ``if`` on
an array), so changing ``temperature`` or ``top_p`` between calls does not recompile; only the choice
greedy-or-not is static.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import jax
import jax.numpy as jnp

from jaxlab.errors import InvalidRequestError

NEG_INF = -jnp.inf


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy. top_k 0, top_p 1 and min_p 0 switch their filter off."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    def __post_init__(self):
        if not (self.temperature >= 0.0) or self.temperature > 100:
            raise InvalidRequestError(f"temperature must be in [0, 100] (0 = greedy), got {self.temperature}")
        if int(self.top_k) != self.top_k or self.top_k < 0:
            raise InvalidRequestError(f"top_k must be a whole number >= 0 (0 = off), got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            raise InvalidRequestError(f"top_p must be in (0, 1] (1 = off), got {self.top_p}")
        if not (0.0 <= self.min_p < 1.0):
            raise InvalidRequestError(f"min_p must be in [0, 1) (0 = off), got {self.min_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def state(self) -> "Sampling":
        """The settings as the pytree a jitted step takes: the numbers traced, greedy-or-not static."""
        return Sampling(
            temperature=jnp.float32(max(self.temperature, 1e-6)),
            top_k=jnp.int32(self.top_k),
            top_p=jnp.float32(self.top_p),
            min_p=jnp.float32(self.min_p),
            greedy=self.greedy,
        )


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class Sampling:
    """Sampling settings inside a jitted step: one pytree instead of four loose scalars.

    The numbers are leaves (traced: a new temperature reuses the compiled program); ``greedy`` is
    static metadata (it changes the program: argmax instead of filter-and-draw). Built by
    :meth:`SamplingParams.state`, which validates the values first."""

    temperature: jax.Array  # [] float32, >= 1e-6 (temperature 0 means greedy, see ``greedy``)
    top_k: jax.Array  # [] int32, 0 = off
    top_p: jax.Array  # [] float32, 1 = off
    min_p: jax.Array  # [] float32, 0 = off
    greedy: bool = field(default=True, metadata=dict(static=True))


def filter_logits(logits: jax.Array, sampling: Sampling) -> jax.Array:
    """Scaled, filtered logits [..., V]: removed tokens are -inf."""
    temperature, top_k, top_p, min_p = sampling.temperature, sampling.top_k, sampling.top_p, sampling.min_p
    logits = logits.astype(jnp.float32) / temperature
    vocab = logits.shape[-1]
    sorted_logits = jnp.sort(logits, axis=-1)[..., ::-1]  # descending
    # top-k: keep logits >= the k-th largest (ties kept, as transformers does)
    k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab), vocab)
    kth = jnp.take_along_axis(
        sorted_logits, (k - 1)[..., None] * jnp.ones(logits.shape[:-1] + (1,), jnp.int32), axis=-1
    )
    logits = jnp.where(logits < kth, NEG_INF, logits)
    sorted_logits = jnp.where(sorted_logits < kth, NEG_INF, sorted_logits)
    # top-p: keep the smallest prefix of the sorted tokens whose probability reaches top_p
    sorted_probs = jax.nn.softmax(sorted_logits, axis=-1)
    before = jnp.cumsum(sorted_probs, axis=-1) - sorted_probs  # mass strictly before each token
    keep_sorted = before < top_p
    cutoff = jnp.min(jnp.where(keep_sorted, sorted_logits, jnp.inf), axis=-1, keepdims=True)
    logits = jnp.where(logits < cutoff, NEG_INF, logits)
    # min-p: keep tokens whose probability is at least min_p x the top token's
    probs = jax.nn.softmax(logits, axis=-1)
    logits = jnp.where(probs < min_p * jnp.max(probs, axis=-1, keepdims=True), NEG_INF, logits)
    return logits


def sample(logits: jax.Array, key: jax.Array, sampling: Sampling) -> jax.Array:
    """logits [B, V] -> token ids [B] int32."""
    if sampling.greedy:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    filtered = filter_logits(logits, sampling)
    return jax.random.categorical(key, filtered, axis=-1).astype(jnp.int32)


def stack_rows(params: "list[SamplingParams]") -> tuple[Sampling, jax.Array]:
    """One :class:`Sampling` whose numbers are per row ([B] leaves, ``greedy`` False), and the rows that are
    greedy [B] bool: a batch whose requests sample differently (:func:`sample_rows`)."""
    states = [p.state() for p in params]
    leaves = {f: jnp.stack([getattr(s, f) for s in states]) for f in ("temperature", "top_k", "top_p", "min_p")}
    return Sampling(**leaves, greedy=False), jnp.asarray([p.greedy for p in params])


def sample_rows(logits: jax.Array, keys: jax.Array, sampling: Sampling, greedy_rows: jax.Array) -> jax.Array:
    """logits [B, V], one key per row [B], per-row settings (:func:`stack_rows`) -> token ids [B] int32.

    Each row is drawn with its own key and settings, so a row's token does not depend on the other rows;
    greedy rows take the argmax. The draw (a sort of the vocabulary per row) runs under a branch taken only when a
    row samples: one program serves greedy and sampling steps at the cost of a greedy one when every row is greedy."""
    best = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    if sampling.greedy:
        return best

    def one(lg, key, s):
        return jax.random.categorical(key, filter_logits(lg, s)).astype(jnp.int32)

    def draw():
        return jnp.where(greedy_rows, best, jax.vmap(one)(logits, keys, sampling))

    return jax.lax.cond(jnp.all(greedy_rows), lambda: best, draw)
