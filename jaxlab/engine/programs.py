"""The compiled-program cache: one compiled program per input signature, compiled ahead of time and timed.

``jit(f).lower(*args).compile()`` separates compiling from running, so the time spent compiling is
measured exactly and reported with each result, and a call whose signature was seen before never
compiles again. The signature is the tree structure and every leaf's shape and dtype (the structure
tells int8 from w8a8 parameters, and greedy from sampling: :class:`~jaxlab.engine.sampling.Sampling`
carries ``greedy`` as static metadata) plus any static keyword arguments.

:class:`Verdicts` keeps what a check learned about compiled programs (the engine's row-bucket probe) beside the
persistent compile cache, keyed by the program's text and the host, so a process that loads the programs from that
cache need not run the check again.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import jax

from jaxlab.engine.kernels import cpu as cpu_kernels


def signature(name: str, args: tuple, static: dict | None = None, options: dict | None = None) -> tuple:
    """What makes two calls need the same compiled program (``options``: XLA compiler options; whether jaxlab's CPU
    kernels may be in it: :func:`~jaxlab.engine.kernels.cpu.xla_only`)."""
    leaves, treedef = jax.tree.flatten(args)
    # the dtype objects themselves (hashable, and compared far faster than their names: a step's call pays this)
    shapes = tuple((getattr(a, "shape", ()), getattr(a, "dtype", None), type(a)) for a in leaves)
    static_items, option_items = tuple(sorted((static or {}).items())), tuple(sorted((options or {}).items()))
    return (name, treedef, shapes, static_items, option_items, cpu_kernels.XLA_ONLY.value)


class Programs:
    """Compiled programs by signature; ``compile_seconds_total`` is every compile this cache ran."""

    def __init__(self):
        self._compiled: dict[tuple, Callable] = {}
        self._lowered: dict[tuple, Any] = {}  # lowered by lower(), not compiled yet: get and compile_many take them
        self.compile_seconds_total = 0.0

    def lower(self, name: str, jitted, args: tuple, static: dict | None = None):
        """The program lowered (traced to StableHLO), kept until :meth:`get` or :meth:`compile_many` compiles it:
        what reads a program's text before it is compiled, lowering it once."""
        sig = signature(name, args, static)
        if sig not in self._lowered:
            self._lowered[sig] = jitted.lower(*args, **(static or {}))
        return self._lowered[sig]

    def _take_lowered(self, sig: tuple, jitted, args: tuple, static: dict | None):
        """The program :meth:`lower` kept for ``sig`` (no longer kept), or lowered now."""
        return self._lowered.pop(sig, None) or jitted.lower(*args, **(static or {}))

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
        lowered = self._take_lowered(sig, jitted, args, static)
        fn = lowered.compile(compiler_options=options)
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
                lowered[sig] = self._take_lowered(sig, jitted, args, static)
        if lowered:
            with ThreadPoolExecutor(max(1, min(len(lowered), workers or os.cpu_count() or 1))) as pool:
                for sig, fn in zip(lowered, pool.map(lambda lo: lo.compile(), lowered.values())):
                    self._compiled[sig] = fn
        seconds = time.perf_counter() - t0
        self.compile_seconds_total += seconds
        return seconds

    def __len__(self) -> int:
        return len(self._compiled)


def host_facts() -> str:
    """What a compiled program's numbers depend on besides its text: the jax and jaxlib versions, the backend, its
    version and device kind, and on a CPU the host's model and instruction-set flags (XLA:CPU compiles for them)."""
    import jaxlib

    dev = jax.devices()[0]
    facts = [jax.__version__, jaxlib.__version__, dev.platform, dev.device_kind, dev.client.platform_version]
    if dev.platform == "cpu":
        try:
            lines = Path("/proc/cpuinfo").read_text().splitlines()
            facts += [next((ln for ln in lines if ln.startswith(f)), "") for f in ("model name", "flags")]
        except OSError:
            facts.append(platform.processor() or platform.machine())
    return "\n".join(facts)


class Verdicts:
    """What a check learned about compiled programs (the row-bucket probe: does a bucket compute a row bit for bit
    as the full step does), kept in the persistent compile cache's folder beside the programs it is about
    (``jaxlab-verdicts.json``), keyed by the program's lowered text and :func:`host_facts`: as exact as the cached
    programs themselves, so a process that loads them from the cache need not run the check again. Without a
    persistent cache (or with ``folder`` "") nothing is kept and every check runs."""

    FILE = "jaxlab-verdicts.json"

    def __init__(self, folder: str | os.PathLike | None = None):
        folder = folder if folder is not None else jax.config.jax_compilation_cache_dir
        self.path = Path(folder) / self.FILE if folder else None

    def key(self, what: str, text: str, *more) -> str:
        """One verdict's key: what was checked, the program's text, anything else it depended on."""
        return hashlib.sha256("\0".join([what, host_facts(), text, *map(str, more)]).encode()).hexdigest()

    def _read(self) -> dict:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):  # none yet, or a torn or foreign file: checks run again
            return {}
        return data if isinstance(data, dict) else {}

    def get(self, key: str):
        return None if self.path is None else self._read().get(key)

    def put(self, key: str, value) -> None:
        if self.path is None:
            return
        data = self._read()
        data[key] = value
        tmp = self.path.with_name(f"{self.FILE}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
            os.replace(tmp, self.path)  # whole or not at all, for a process reading beside it
        except OSError:  # a read-only cache folder: the check runs again next time
            tmp.unlink(missing_ok=True)
