"""Checks for the exercises of notebook 01 (JAX essentials).

1. :func:`check_rms_norm` - a jittable ``rms_norm(x, w, eps)`` equal to :class:`jaxlab.engine.model.RMSNorm`.
2. :func:`check_scale_logits` - the Python ``if`` on a traced temperature rewritten with
   ``jnp.where`` / ``lax.cond``: correct for temperature > 0 and == 0, jittable, and compiled once for
   every temperature (the temperature stays a traced value, not a static argument).
3. :func:`check_compile_count` - predict how many compilations :data:`QUIZ` triggers; the answer is
   measured live with :class:`jaxlab.tools.profile.CompileCounter`, not stored.

Each check prints one PASS/FAIL line (the first mismatch on FAIL) and returns a bool.
"""

from __future__ import annotations

import itertools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.engine.model import Policy, RMSNorm
from jaxlab.lab.exercises import check_function, report
from jaxlab.tools.profile import CompileCounter

__all__ = [
    "reference_rms_norm",
    "scale_logits_python_if",
    "reference_scale_logits",
    "check_rms_norm",
    "check_scale_logits",
    "QUIZ",
    "quiz_function",
    "run_quiz",
    "check_compile_count",
]


# --------------------------------------------------------------------------------------------------
# 1. RMSNorm
# --------------------------------------------------------------------------------------------------


def reference_rms_norm(x, w, eps):
    """``jaxlab.engine.model.RMSNorm`` itself, with weight ``w`` [D], applied to x [..., D]."""
    norm = RMSNorm(x.shape[-1], float(eps), Policy())
    norm.weight[...] = jnp.asarray(w, jnp.float32)
    return norm(jnp.asarray(x, jnp.float32))


def _rms_inputs(rng: np.random.Generator):
    d = int(rng.choice([7, 64, 576]))  # odd sizes too, so a hard-coded width fails
    lead = tuple(int(n) for n in rng.integers(1, 5, size=int(rng.integers(1, 3))))
    scale = float(rng.choice([1e-3, 1.0, 30.0]))  # tiny activations make eps matter
    x = (rng.standard_normal(lead + (d,)) * scale).astype(np.float32)
    w = rng.standard_normal(d).astype(np.float32)
    eps = float(rng.choice([1e-5, 1e-6, 1e-2]))
    return jnp.asarray(x), jnp.asarray(w), eps


def check_rms_norm(rms_norm: Callable) -> bool:
    """Your ``rms_norm(x, w, eps)`` under ``jax.jit`` vs ``jaxlab.engine.model.RMSNorm`` on random inputs."""
    return check_function(
        jax.jit(rms_norm), reference_rms_norm, _rms_inputs, name="rms_norm", trials=6, atol=1e-5, rtol=1e-4
    )


# --------------------------------------------------------------------------------------------------
# 2. A Python `if` on a traced value
# --------------------------------------------------------------------------------------------------


def scale_logits_python_if(logits, temperature):
    """The version that cannot be jitted: ``if`` needs a concrete bool, a traced temperature has none.

    logits [..., V] float32; temperature a scalar. temperature > 0: logits / temperature.
    Otherwise greedy, written as logits: 0 at each row's maximum, -inf elsewhere.
    """
    if temperature > 0:
        return logits / temperature
    return jnp.where(logits == logits.max(axis=-1, keepdims=True), 0.0, -jnp.inf)


def reference_scale_logits(logits, temperature):
    """The same function without the Python ``if`` (never jitted here: a reference for the check)."""
    logits = jnp.asarray(logits, jnp.float32)
    if float(temperature) > 0:
        return logits / jnp.float32(temperature)
    return jnp.where(logits == logits.max(axis=-1, keepdims=True), 0.0, -jnp.inf)


def _scale_inputs_factory():
    temps = itertools.cycle([0.7, 0.0, 1.0, 0.0, 2.5, 0.0])  # both branches, alternating

    def make(rng: np.random.Generator):
        shape = (int(rng.integers(1, 4)), int(rng.choice([5, 11, 64])))
        logits = jnp.asarray(rng.standard_normal(shape).astype(np.float32) * 3.0)
        return logits, jnp.float32(next(temps))

    return make


def check_scale_logits(scale_logits: Callable) -> bool:
    """Your ``scale_logits(logits, temperature)`` under ``jax.jit``, temperature traced: correct on both
    branches, and one compilation serves every temperature."""
    jitted = jax.jit(scale_logits)
    ok = check_function(
        jitted,
        reference_scale_logits,
        _scale_inputs_factory(),
        name="scale_logits",
        trials=6,
        atol=1e-6,
        rtol=1e-6,
        quiet=True,
    )
    if not ok:  # rerun loudly for the message
        return check_function(
            jitted, reference_scale_logits, _scale_inputs_factory(), name="scale_logits", trials=6, atol=1e-6, rtol=1e-6
        )
    fresh = jax.jit(scale_logits)
    logits = jnp.ones((2, 8), jnp.float32)
    temps = [jnp.float32(t) for t in (0.5, 1.0, 0.0, 2.0)]
    with CompileCounter() as cc:
        for t in temps:
            jax.block_until_ready(fresh(logits, t))
    if cc.count > 1:
        return report(
            False,
            "scale_logits",
            f"{cc.count} compilations for 4 temperatures: keep the "
            "temperature a traced value (no static argument, no Python branch on it)",
            False,
        )
    return report(
        True,
        "scale_logits",
        "jittable, both branches match the reference, one compilation for every temperature",
        False,
    )


# --------------------------------------------------------------------------------------------------
# 3. How many compilations?
# --------------------------------------------------------------------------------------------------


def quiz_function():
    """A fresh jitted ``f(x, *, scale)`` (``scale`` static): the function :data:`QUIZ` calls."""

    def f(x, *, scale=2):
        return jnp.tanh(x) * scale

    return jax.jit(f, static_argnames="scale")


#: The calls of the quiz, in order: (what the call looks like, a builder of (args, kwargs)).
QUIZ = [
    ("f(jnp.ones(4))", lambda: ((jnp.ones(4),), {})),
    ("f(jnp.zeros(4))", lambda: ((jnp.zeros(4),), {})),
    ("f(jnp.ones(5))", lambda: ((jnp.ones(5),), {})),
    ("f(jnp.ones(4, jnp.int32))", lambda: ((jnp.ones(4, jnp.int32),), {})),
    ("f(np.ones(4))  # NumPy float64", lambda: ((np.ones(4),), {})),
    ("f(jnp.ones(4), scale=3)", lambda: ((jnp.ones(4),), {"scale": 3})),
    ("f(jnp.ones(4), scale=3)  # again", lambda: ((jnp.ones(4),), {"scale": 3})),
    ("f(3.0)", lambda: ((3.0,), {})),
    ("f(4.0)", lambda: ((4.0,), {})),
]


def run_quiz() -> list[dict]:
    """Run :data:`QUIZ` on a fresh function; one row per call: the call and whether it compiled."""
    f = quiz_function()
    built = [(label, *make()) for label, make in QUIZ]  # build inputs first: eager ops compile too
    rows = []
    for label, args, kwargs in built:
        with CompileCounter() as cc:
            jax.block_until_ready(f(*args, **kwargs))
        rows.append({"call": label, "compiled": "yes" if any(n == "jit(f)" for n in cc.names) else "no"})
    return rows


def check_compile_count(answer) -> bool:
    """Compare your predicted number of compilations for :data:`QUIZ` with the measured one."""
    if answer is None:
        return report(False, "compile count", "not implemented yet", False)
    measured = sum(r["compiled"] == "yes" for r in run_quiz())
    if isinstance(answer, bool) or not isinstance(answer, (int, np.integer)):
        return report(False, "compile count", f"answer with a whole number, got {answer!r}", False)
    if int(answer) != measured:
        hint = (
            "too many: values never recompile, only shapes, dtypes, weak types and static arguments do"
            if answer > measured
            else "too few: look again at dtypes and at Python scalars"
        )
        return report(False, "compile count", f"{answer} is {hint}", False)
    return report(True, "compile count", f"{measured} compilations, as you predicted", False)
