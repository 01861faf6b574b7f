"""The compiled-program cache: one compiled program per input signature, compiled ahead of time and timed.

``jit(f).lower(*args).compile()`` separates compiling from running, so the time spent compiling is
measured exactly and reported with each result, and a call whose signature was seen before never
compiles again. The signature is the tree structure and every leaf's shape and dtype (the structure
tells int8 from w8a8 parameters, and greedy from sampling: :class:`~jaxlab.engine.sampling.Sampling`
carries ``greedy`` as static metadata) plus any static keyword arguments.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import jax


def signature(name: str, args: tuple, static: dict | None = None, options: dict | None = None) -> tuple:
    """What makes two calls need the same compiled program (``options``: XLA compiler options)."""
    leaves, treedef = jax.tree.flatten(args)
    shapes = tuple((getattr(a, "shape", ()), str(getattr(a, "dtype", type(a).__name__))) for a in leaves)
    return (name, treedef, shapes, tuple(sorted((static or {}).items())), tuple(sorted((options or {}).items())))


class Programs:
    """Compiled programs by signature; ``compile_seconds_total`` is every compile this cache ran."""

    def __init__(self):
        self._compiled: dict[tuple, Callable] = {}
        self.compile_seconds_total = 0.0

    def get(
        self, name: str, jitted, args: tuple, static: dict | None = None, options: dict | None = None
    ) -> tuple[Callable, float]:
        """(compiled program, seconds spent compiling it now: 0.0 when it was compiled before). ``options``: XLA
        compiler options for this program (``compile(compiler_options=...)``), part of its signature."""
        sig = signature(name, args, static, options)
        fn = self._compiled.get(sig)
        if fn is not None:
            return fn, 0.0
        t0 = time.perf_counter()
        fn = jitted.lower(*args, **(static or {})).compile(compiler_options=options)
        seconds = time.perf_counter() - t0
        self._compiled[sig] = fn
        self.compile_seconds_total += seconds
        return fn, seconds

    def compile_many(self, items, workers: int | None = None) -> float:
        """Compile every ``(name, jitted, args, static)`` of ``items`` not compiled yet, as :meth:`get` would: each
        lowered in turn (tracing is Python), then all compiled on ``workers`` threads at once (XLA compiles outside
        Python's lock; default: the CPU count). What a warm-up of many programs calls. -> wall seconds, added to
        ``compile_seconds_total``."""
        t0 = time.perf_counter()
        lowered = {}
        for name, jitted, args, static in items:
            sig = signature(name, args, static)
            if sig not in self._compiled and sig not in lowered:
                lowered[sig] = jitted.lower(*args, **(static or {}))
        if lowered:
            with ThreadPoolExecutor(max(1, min(len(lowered), workers or os.cpu_count() or 1))) as pool:
                for sig, fn in zip(lowered, pool.map(lambda lo: lo.compile(), lowered.values())):
                    self._compiled[sig] = fn
        seconds = time.perf_counter() - t0
        self.compile_seconds_total += seconds
        return seconds

    def __len__(self) -> int:
        return len(self._compiled)
