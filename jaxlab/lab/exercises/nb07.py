"""Checks for notebook 07's exercises: arithmetic intensity, the roofline time bound, and AOT compile timing.

* :func:`check_matmul_intensity` compares ``fn(m, k, n, itemsize) -> FLOP/byte`` of ``[m, k] @ [k, n]``
  with the formula ``2 m k n / ((m k + k n + m n) * itemsize)`` (each matrix moved through memory once).
* :func:`check_time_bound` compares ``fn(bandwidth, peak_flops, flops, nbytes) -> seconds`` with
  :meth:`jaxlab.tools.profile.Roofline.time_bound`.
* :func:`check_compile_then_run` checks ``fn(jitted, *args) -> (compile_s, run_s, out)`` structurally:
  the output is right, both times are positive numbers, the program was compiled exactly once and run
  exactly once (a function that "compiles" by calling ``jitted(*args)`` runs the program twice).
"""

from __future__ import annotations

import itertools
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.lab.exercises import check_function, first_mismatch, report


def matmul_intensity(m: int, k: int, n: int, itemsize: int) -> float:
    """Arithmetic intensity (FLOP/byte) of ``[m, k] @ [k, n]``: 2mkn FLOPs over reading both inputs
    and writing the output once."""
    return 2.0 * m * k * n / ((m * k + k * n + m * n) * itemsize)


def check_matmul_intensity(fn, trials: int = 8) -> bool:
    def make_inputs(rng):
        m, k, n = (int(2 ** rng.integers(0, 13)) for _ in range(3))
        return m, k, n, int(rng.choice([1, 2, 4]))

    return check_function(fn, matmul_intensity, make_inputs, name="matmul intensity", trials=trials, rtol=1e-6)


def check_time_bound(fn, trials: int = 8) -> bool:
    from jaxlab.tools.profile import Roofline

    def reference(bandwidth, peak_flops, flops, nbytes):
        return Roofline(bandwidth, peak_flops).time_bound(flops, nbytes)

    def make_inputs(rng):  # both memory-bound and compute-bound cases
        return (
            float(10 ** rng.uniform(10, 12.5)),
            float(10 ** rng.uniform(11, 15)),
            float(10 ** rng.uniform(6, 13)),
            float(10 ** rng.uniform(6, 10)),
        )

    return check_function(fn, reference, make_inputs, name="roofline time bound", trials=trials, rtol=1e-6, atol=0)


_fresh = itertools.count()


def check_compile_then_run(fn) -> bool:
    """``fn(jitted, *args)`` must compile ``jitted`` ahead of time, then run the compiled program once."""
    from jaxlab.tools.profile import CompileCounter

    name = "compile, then run"
    runs: list[float] = []
    salt = next(_fresh)  # a new function each check, so nothing is in jax's caches yet

    def program(x, y):
        jax.debug.callback(lambda: runs.append(time.perf_counter()))
        return jnp.tanh(x @ y) + salt

    jitted = jax.jit(program)
    rng = np.random.default_rng(salt)
    x, y = (jnp.asarray(rng.normal(size=s), jnp.float32) for s in ((16, 8), (8, 4)))
    with CompileCounter() as cc:
        try:
            result = fn(jitted, x, y)
        except NotImplementedError:
            return report(False, name, "not implemented yet", False)
        except Exception as e:
            return report(False, name, f"raised {type(e).__name__}: {e}", False)
        jax.effects_barrier()
    if not isinstance(result, tuple) or len(result) != 3:
        return report(False, name, "return a tuple (compile_s, run_s, out)", False)
    compile_s, run_s, out = result
    for label, value in (("compile_s", compile_s), ("run_s", run_s)):
        if not isinstance(value, (float, int)) or isinstance(value, bool) or not value > 0:
            return report(False, name, f"{label} should be a positive number of seconds, got {value!r}", False)
    mismatch = first_mismatch(out, np.tanh(np.asarray(x) @ np.asarray(y)) + salt, 1e-5, 1e-5)
    if mismatch:
        return report(False, name, f"out {mismatch}", False)
    if cc.count != 1:
        return report(False, name, f"the program was compiled {cc.count} times, expected once", False)
    if len(runs) != 1:
        return report(
            False,
            name,
            f"the program ran {len(runs)} times, expected once: compile with "
            "jitted.lower(*args).compile() (which does not run it), then call the result",
            False,
        )
    return report(True, name, "compiled once ahead of time, ran once, right output", False)
