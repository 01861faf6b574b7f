"""Solutions to the exercises of notebooks/01_jax_essentials.ipynb."""

import jax
import jax.numpy as jnp


def rms_norm(x, w, eps):
    """x [..., D], w [D] -> [..., D]: x / sqrt(mean(x^2) + eps) * w, computed in float32."""
    x32 = x.astype(jnp.float32)
    ms = jnp.mean(x32 * x32, axis=-1, keepdims=True)
    return w * (x32 * jax.lax.rsqrt(ms + eps))


def scale_logits(logits, temperature):
    """logits [..., V]; temperature a traced scalar. Both branches are computed, one is kept."""
    greedy = jnp.where(logits == logits.max(axis=-1, keepdims=True), 0.0, -jnp.inf)
    safe_t = jnp.where(temperature > 0, temperature, 1.0)  # no division by zero in the unused branch
    return jnp.where(temperature > 0, logits / safe_t, greedy)


def scale_logits_cond(logits, temperature):
    """The same with lax.cond: only the chosen branch runs (both must return the same shape/dtype)."""
    return jax.lax.cond(
        temperature > 0,
        lambda l: l / temperature,
        lambda l: jnp.where(l == l.max(axis=-1, keepdims=True), 0.0, -jnp.inf),
        logits,
    )


# f(ones 4) compiles, f(zeros 4) reuses it (values never matter), f(ones 5) compiles (shape),
# f(int32) compiles (dtype), f(np float64) reuses the float32 program (x64 off: float64 becomes
# float32), scale=3 compiles (static value), scale=3 again reuses it, f(3.0) compiles (a weakly
# typed float32 scalar: a new shape), f(4.0) reuses it.
COMPILE_COUNT = 5
my_answer = COMPILE_COUNT  # the notebook's name for it
