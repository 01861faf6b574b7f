"""Helpers for notebook 01 (JAX essentials): eager vs jit on the real model, compile logs, honest timing.

* :func:`block_step` turns one decoder block of the loaded model into a pure function
  ``step(state, x [B, T, D], positions [B, T]) -> [B, T, D]``, the unit the notebook times eagerly
  and under ``jax.jit``.
* :func:`eager_vs_jit` times a function op by op (eager) and compiled (``jax.jit``), both synchronized,
  with the compile step timed on its own.
* :func:`compile_log` runs a list of calls of one jitted function and records which of them compiled
  (a new shape, dtype, weak type or static argument) - counted by :class:`jaxlab.tools.profile.CompileCounter`.
* :func:`time_unsynced` shows what a timer measures without :func:`jax.block_until_ready`.
* :func:`per_call_seconds` measures what one call costs when the work is tiny: the Python-side
  dispatch that a compiled function still pays on every call; :func:`python_calls_per_call` counts the
  Python functions the interpreter runs during each call (none, when jax's C++ dispatch finds the program).
* :func:`min_python_minor` reads a package's ``Requires-Python`` as a number (notebook 00).
* Figures: :func:`plot_eager_vs_jit`, :func:`plot_settings` (a measured value per setting against a claim's
  threshold), and for notebook 00 :func:`plot_token_probabilities` (its weights figure is
  :func:`jaxlab.lab.anatomy.plot_param_bytes`, notebook 03's).

Every timing here blocks on its outputs unless its name says otherwise, and no helper prints: the
notebook decides what is checked (deterministic) and what is shown as a measurement.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxlab.engine.model import Params, forward, rope_cos_sin
from jaxlab.tools.profile import CompileCounter, time_fn

__all__ = [
    "block_step",
    "block_inputs",
    "prompt_inputs",
    "forward_logits",
    "EagerVsJit",
    "eager_vs_jit",
    "compile_log",
    "time_unsynced",
    "per_call_seconds",
    "python_calls_per_call",
    "min_python_minor",
    "plot_eager_vs_jit",
    "plot_settings",
    "plot_token_probabilities",
]


# --------------------------------------------------------------------------------------------------
# The real model, in pieces small enough to time
# --------------------------------------------------------------------------------------------------


def block_step(params: Params, layer: int = 0) -> tuple[Callable, nnx.State]:
    """One decoder block of ``params`` as a pure function, and that block's weights.

    Returns ``(step, state)`` with ``step(state, x [B, T, D], positions [B, T]) -> [B, T, D]``: RoPE
    tables from the positions, then RMSNorm -> attention -> residual -> RMSNorm -> MLP -> residual,
    no KV cache (every token attends to itself and the tokens before it). ``state`` is a pytree,
    so ``jax.jit(step)(state, x, positions)`` compiles the whole block into one program.
    """
    model = params.module()
    cfg = model.cfg
    graphdef, state = nnx.split(model.layers[layer])

    def step(state, x, positions):
        block = nnx.merge(graphdef, state)
        cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta)
        y, _ = block(x, positions, cos, sin)
        return y

    return step, state


def block_inputs(cfg, seq_len: int, batch: int = 1, seed: int = 0) -> tuple[jax.Array, jax.Array]:
    """Random activations x [B, T, D] (unit variance, like embeddings after a norm) and positions [B, T]."""
    x = jax.random.normal(jax.random.key(seed), (batch, seq_len, cfg.dim), jnp.float32)
    positions = jnp.broadcast_to(jnp.arange(seq_len, dtype=jnp.int32), (batch, seq_len))
    return x, positions


def prompt_inputs(ids: Sequence[int]) -> tuple[jax.Array, jax.Array]:
    """Token ids of one prompt -> (tokens [1, T], positions [1, T]) for :func:`jaxlab.forward`."""
    tokens = jnp.asarray([list(ids)], jnp.int32)
    positions = jnp.arange(len(ids), dtype=jnp.int32)[None, :]
    return tokens, positions


def forward_logits(params: Params, tokens: jax.Array, positions: jax.Array) -> jax.Array:
    """The full model without a cache: tokens, positions [B, T] -> logits [B, T, V] (float32)."""
    return forward(params, tokens, positions)[0]


# --------------------------------------------------------------------------------------------------
# Eager vs jit
# --------------------------------------------------------------------------------------------------


@dataclass
class EagerVsJit:
    """Seconds for one function run op by op (eager) and compiled (jit): best of synchronized runs.

    The best (minimum) time, as ``timeit`` reports it: on a shared machine, other processes only ever
    add time, so the minimum is the steadiest estimate of what the code itself costs."""

    eager_first_s: float  # first eager call: every primitive compiles its own tiny program once
    eager_s: float
    jit_compile_s: float  # trace + lower + XLA compile of the whole function
    jit_s: float
    max_abs_diff: float  # largest |eager - jit| over the outputs
    same: bool  # eager and jit outputs agree (within eager_vs_jit's rtol of the largest output)

    @property
    def speedup(self) -> float:
        """How many times faster the compiled steady state is than the eager one."""
        return self.eager_s / self.jit_s

    @property
    def first_call_x(self) -> float:
        """How many times longer the first jitted call (trace + compile + run) takes than a later one."""
        return (self.jit_compile_s + self.jit_s) / self.jit_s

    @property
    def calls_to_break_even(self) -> float:
        """Calls after which compiling has paid for itself: compile / (eager - jit) per call."""
        saved = self.eager_s - self.jit_s
        return float("inf") if saved <= 0 else self.jit_compile_s / saved

    def row(self, label: str) -> dict:
        return {
            "what": label,
            "eager ms": self.eager_s * 1e3,
            "jit ms": self.jit_s * 1e3,
            "speed-up x": self.speedup,
            "compile ms": self.jit_compile_s * 1e3,
            "break-even calls": self.calls_to_break_even,
            "max |eager-jit|": self.max_abs_diff,
        }


def eager_vs_jit(fn: Callable, *args: Any, repeats: int = 3, rtol: float = 1e-4) -> EagerVsJit:
    """Time ``fn(*args)`` eagerly and under a fresh ``jax.jit``, and compare the two outputs.

    Eager: the first call (which compiles one small program per primitive and shape) is timed apart,
    then ``repeats`` synchronized runs. Jit: :func:`jaxlab.tools.profile.time_fn` - the compile step timed
    with ahead-of-time compilation, one warm-up, then ``repeats`` synchronized runs. Run times are the
    best of the ``repeats``; the outputs agree when each differs by at most ``rtol`` of its largest magnitude
    (:data:`jaxlab.tools.reference.AGREEMENT_RTOL`: 1e-4 in float32, 3e-2 for a model in bfloat16). The jitted
    function is a new wrapper every time, so a program compiled earlier for ``fn`` is never reused
    and the compile time is real (unless the persistent compilation cache is on).
    """
    t0 = time.perf_counter()
    eager_out = jax.block_until_ready(fn(*args))
    eager_first = time.perf_counter() - t0
    eager = time_fn(fn, *args, repeats=repeats, warmup=0)
    jitted = jax.jit(lambda *a: fn(*a))
    compiled = time_fn(jitted, *args, repeats=repeats, warmup=1)
    jit_out = jitted(*args)
    diffs = [
        float(np.max(np.abs(np.asarray(e, np.float64) - np.asarray(j, np.float64))))
        for e, j in zip(jax.tree.leaves(eager_out), jax.tree.leaves(jit_out))
    ]
    same = all(
        d <= rtol * float(np.max(np.abs(np.asarray(j, np.float64)), initial=0.0))
        for d, j in zip(diffs, jax.tree.leaves(jit_out))
    )
    return EagerVsJit(eager_first, eager.min, compiled.compile_s, compiled.min, max(diffs, default=0.0), same)


# --------------------------------------------------------------------------------------------------
# What compiles
# --------------------------------------------------------------------------------------------------


def compile_log(jitted: Callable, calls: Sequence[tuple[str, tuple, dict]]) -> list[dict]:
    """Run ``jitted(*args, **kwargs)`` for each ``(label, args, kwargs)`` and say whether it compiled.

    Only compilations of ``jitted`` itself are counted (by name, from
    :class:`~jaxlab.tools.profile.CompileCounter`), so eager helper ops never blur the count. Build the
    arguments before calling: creating an array eagerly compiles a small program of its own.
    Returns rows ``{"call", "compiled", "input"}``; ``input`` is the abstract signature jit keys on.
    """
    name = f"jit({getattr(jitted, '__name__', '?')})"
    rows = []
    for label, args, kwargs in calls:
        with CompileCounter() as cc:
            jax.block_until_ready(jitted(*args, **kwargs))
        n = sum(1 for c in cc.names if c == name)
        rows.append({"call": label, "compiled": "yes" if n else "no (cached)", "input": _signature(args, kwargs)})
    return rows


def _signature(args: tuple, kwargs: dict) -> str:
    parts = []
    for a in args:
        if isinstance(a, (jax.Array, np.ndarray)):
            weak = getattr(a, "weak_type", False)
            dt = jax.dtypes.canonicalize_dtype(a.dtype)
            parts.append(f"{dt.name}{list(a.shape)}{' weak' if weak else ''}")
        elif isinstance(a, (bool, int, float)):
            parts.append(f"python {type(a).__name__}")
        else:
            parts.append(type(a).__name__)
    parts += [f"{k}={v!r} (static)" for k, v in kwargs.items()]
    return ", ".join(parts)


# --------------------------------------------------------------------------------------------------
# Honest timing
# --------------------------------------------------------------------------------------------------


def time_unsynced(fn: Callable, *args: Any, repeats: int = 5) -> tuple[list[float], list[float]]:
    """Seconds per call timed two ways: without and with :func:`jax.block_until_ready`.

    ``fn`` is called once first (compile). Without synchronization the timer stops when the work
    is *queued* (JAX dispatches asynchronously), so it measures dispatch, not the computation; the
    result is waited for after the timer stops, so the next call starts from an idle device.
    """
    jax.block_until_ready(fn(*args))
    unsynced, synced = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn(*args)
        unsynced.append(time.perf_counter() - t0)
        jax.block_until_ready(out)
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        synced.append(time.perf_counter() - t0)
    return unsynced, synced


def per_call_seconds(fn: Callable, *args: Any, calls: int = 2000) -> float:
    """Mean seconds per call of ``fn(*args)`` over ``calls`` back-to-back calls (after one warm-up call).

    The loop synchronizes once, at the end, on the last output; with a tiny computation this is the
    cost of the call itself: argument checks, cache lookup and dispatch for a jitted function.
    """
    jax.block_until_ready(fn(*args))
    out = None
    t0 = time.perf_counter()
    for _ in range(calls):
        out = fn(*args)
    jax.block_until_ready(out)
    return (time.perf_counter() - t0) / calls


def python_calls_per_call(fn: Callable, calls: Sequence[tuple]) -> float:
    """Mean number of Python function calls the interpreter runs during each ``fn(*args)`` of ``calls``.

    Counted with :func:`sys.setprofile` ("call" events: Python frames, not C functions) on this thread.
    A jitted function called with shapes it has compiled for is dispatched by jax's C++ code and runs
    none; a new shape runs jax's Python to trace, lower and compile (and your function's body once).
    """
    import sys

    count = 0

    def profiler(frame, event, arg):
        nonlocal count
        if event == "call":
            count += 1

    outs, previous = [], sys.getprofile()
    sys.setprofile(profiler)
    try:
        for args in calls:
            outs.append(fn(*args))
    finally:
        sys.setprofile(previous)
    jax.block_until_ready(outs)
    return count / max(len(calls), 1)


def min_python_minor(requires: str, major: int = 3, upto: int = 50) -> int:
    """The oldest Python ``major.x`` that a ``Requires-Python`` specifier (e.g. ``">=3.11"``) accepts, as ``x``."""
    from packaging.specifiers import SpecifierSet

    spec = SpecifierSet(requires)
    for minor in range(upto):
        if spec.contains(f"{major}.{minor}", prereleases=True):
            return minor
    raise ValueError(f"no Python {major}.x below {major}.{upto} satisfies {requires!r}")


# --------------------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------------------


def plot_token_probabilities(tokenizer, token_ids: Sequence[int], logprobs: Sequence[float]):
    """Bars: the probability the model gave each token of a greedy answer, labelled with the token's text."""
    import matplotlib.pyplot as plt

    probs = np.exp(np.asarray(logprobs, np.float64))
    labels = [repr(tokenizer.decode([t]))[1:-1] or "''" for t in token_ids]
    fig, ax = plt.subplots(figsize=(max(5.0, 0.45 * len(labels)), 3.2))
    ax.bar(range(len(probs)), probs, color=["tab:orange" if p < 0.5 else "tab:blue" for p in probs])
    ax.set_xticks(range(len(labels)), labels, rotation=60, ha="right", fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("probability of the chosen token")
    ax.set_xlabel("generated token (greedy); orange: below 0.5, a closer call")
    ax.set_title("How sure the model was of each token of its answer")
    fig.tight_layout()
    return fig


def plot_eager_vs_jit(results: dict[str, EagerVsJit]):
    """Eager and jit ms per call for each measured setting (log scale), with the speed-up above each pair."""
    import matplotlib.pyplot as plt

    labels = list(results)
    fig, ax = plt.subplots()
    x = np.arange(len(labels))
    ax.bar(x - 0.2, [results[k].eager_s * 1e3 for k in labels], 0.4, label="eager")
    ax.bar(x + 0.2, [results[k].jit_s * 1e3 for k in labels], 0.4, label="jit")
    for i, k in enumerate(labels):
        ax.text(i, results[k].eager_s * 1e3, f"{results[k].speedup:.1f}x", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, [k.replace(", ", "\n") for k in labels], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylim(top=max(r.eager_s for r in results.values()) * 1e3 * 3)  # room for the labels
    ax.set_ylabel("ms per call (log)")
    ax.set_title("Eager vs jit, and the speed-up above each pair")
    ax.legend()
    return fig


def plot_settings(key: str, values: dict[str, float], title: str, ylabel: str | None = None, log: bool = True):
    """One bar per setting of a claim's measurement (``values``), with the threshold of the claim ``key``
    (:mod:`jaxlab.lab.claims`) as a dashed line; bars that meet it are blue, the others grey."""
    import matplotlib.pyplot as plt

    from jaxlab.lab.claims import claim

    c = claim(key)
    bound = c.at_least if c.at_least is not None else c.at_most
    labels = list(values)
    v = [float(values[k]) for k in labels]
    fig, ax = plt.subplots()
    ax.bar(range(len(v)), v, color=["tab:blue" if c.meets(x) else "tab:gray" for x in v])
    for i, x in enumerate(v):
        ax.text(i, x, f"{x:.3g}", ha="center", va="bottom", fontsize=8)
    ax.axhline(bound, ls="--", color="tab:red", label=f"the claim needs {c.needs}")
    ax.set_xticks(range(len(v)), [k.replace(", ", "\n") for k in labels], fontsize=8)
    if log:
        ax.set_yscale("log")
    ax.set_ylim(top=max(v + [bound]) * (3 if log else 1.2))
    ax.set_ylabel(ylabel or c.measure)
    ax.set_title(title)
    ax.legend(fontsize=8)
    return fig
