"""Solutions to notebook 04's exercises."""

import jax.numpy as jnp
import numpy as np

import jaxlab


def my_pad_to_bucket(ids, buckets, pad_id):
    """Left-pad one prompt to the smallest bucket that holds it -> (tokens [L], positions [L])."""
    n = len(ids)
    length = next((b for b in buckets if n <= b), None)
    if length is None:  # past the largest bucket: the next multiple of it
        top = buckets[-1]
        length = -(-n // top) * top
    tokens = np.full(length, pad_id, np.int32)
    positions = np.full(length, -1, np.int32)
    tokens[length - n:] = ids
    positions[length - n:] = np.arange(n)
    return tokens, positions


def my_decode_step(params, token, pos, cache):
    """token, pos [B] -> (greedy next token [B], updated cache)."""
    logits, cache = jaxlab.forward(params, token[:, None], pos[:, None], cache)  # [B, 1, V]
    return jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32), cache
