"""Solutions to notebook 06's exercises."""

import jax
import jax.numpy as jnp


def my_top_p(logits, top_p):
    """Keep the smallest set of most likely tokens whose probabilities add up to at least top_p."""
    logits = jnp.asarray(logits, jnp.float32)
    order = jnp.argsort(-logits, axis=-1)
    sorted_logits = jnp.take_along_axis(logits, order, axis=-1)
    probs = jax.nn.softmax(sorted_logits, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs  # probability of the tokens ranked above
    keep_sorted = mass_before < top_p  # the first token is always kept
    cutoff = jnp.min(jnp.where(keep_sorted, sorted_logits, jnp.inf), axis=-1, keepdims=True)
    return jnp.where(logits < cutoff, -jnp.inf, logits)


def my_min_p(logits, min_p):
    """Keep the tokens whose probability is at least min_p times the most likely token's."""
    logits = jnp.asarray(logits, jnp.float32)
    probs = jax.nn.softmax(logits, axis=-1)
    threshold = min_p * jnp.max(probs, axis=-1, keepdims=True)
    return jnp.where(probs < threshold, -jnp.inf, logits)


def my_sample(logits, keys, temperatures):
    """One token per row: the argmax where the temperature is 0, else a draw from softmax(logits / t) with the
    row's own key (so a row's token never depends on the rows beside it)."""
    logits = jnp.asarray(logits, jnp.float32)  # [B, V]
    t = jnp.asarray(temperatures, jnp.float32)  # [B]
    scaled = logits / jnp.where(t > 0, t, 1.0)[:, None]  # a greedy row divides by 1: no division by zero
    drawn = jax.vmap(jax.random.categorical)(keys, scaled)  # row r drawn with keys[r]
    return jnp.where(t > 0, drawn, jnp.argmax(logits, axis=-1)).astype(jnp.int32)
