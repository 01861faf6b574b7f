"""Measuring tools: timing, compile counting, cost analysis, memory, roofline, traces, HLO.

Every speed claim in the lab's notebooks is measured with these helpers, so they
have to measure the right thing. Each piece exists for a reason:

* **Timing must synchronize.** JAX dispatches work *asynchronously*: ``f(x)``
  returns as soon as the computation is queued, long before it has run. A
  ``time.perf_counter()`` around ``f(x)`` without :func:`jax.block_until_ready`
  measures Python dispatch overhead, not the computation. :func:`time_fn` and
  :func:`timed` always block on the outputs.

* **Compile time is not run time.** The first call of a ``jax.jit`` function
  traces, lowers and compiles it with XLA; later calls with the same shapes and
  dtypes reuse the executable. Mixing the two makes a function look slow (or a
  benchmark look fast if the compile was paid elsewhere). :func:`time_fn` uses
  ahead-of-time compilation (``fn.lower(*args).compile()``) to time the compile
  step on its own, then times ``repeats`` synchronized runs.

* **Recompiles are silent.** A new shape, dtype, static argument or a Python
  value baked into a trace quietly triggers a fresh compile - the classic
  reason a "fast" decode loop is slow. :class:`CompileCounter` counts XLA
  compilations inside a block so notebooks and tests can *assert* that the
  steady state compiles nothing.

* **Know what the program costs.** :func:`cost_analysis` reads XLA's own FLOP
  and byte counts for a compiled function; :func:`memory_stats` and
  :func:`array_bytes` say how much memory is in use.

* **Compare against the hardware limit.** A time alone says little; a time
  against what the chip *could* do says everything. :func:`measure_bandwidth`
  and :func:`measure_matmul_flops` (float32 or bfloat16) measure this machine's
  two ceilings (an accelerator's datasheet peaks, :mod:`jaxlab.tools.hardware`, are
  set beside them in ``jaxlab bench``), and
  :class:`Roofline` turns (flops, bytes, seconds) into "x% of the bound" and
  says whether a kernel is memory- or compute-bound (decode is memory-bound:
  every generated token reads all the weights).

* **See inside.** :func:`trace` records a ``jax.profiler`` trace (viewable in
  TensorBoard / Perfetto; the model's blocks are wrapped in ``jax.named_scope``
  so the trace reads like the code), and :func:`hlo_text` / :func:`count_ops`
  read the compiled HLO, e.g. to count the collectives a sharding inserted.

This is a bottom-floor module: it imports only jax, numpy and the standard
library (matplotlib is imported lazily inside :func:`plot_roofline`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.engine.kernels import cpu as cpu_kernels

__all__ = [
    "Timing",
    "Timer",
    "time_fn",
    "timed",
    "CompileCounter",
    "BACKEND_COMPILE_EVENT",
    "JAXPR_TRACE_EVENT",
    "cost_analysis",
    "memory_stats",
    "array_bytes",
    "measure_bandwidth",
    "measure_matmul_flops",
    "matmul_probe",
    "Roofline",
    "plot_roofline",
    "trace",
    "hlo_text",
    "count_ops",
    "COLLECTIVES",
]


# --------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------


def _as_jitted(fn: Callable[..., Any]) -> Any:
    """``fn`` itself if it supports AOT (``.lower``), else ``jax.jit(fn)``."""
    return fn if hasattr(fn, "lower") else jax.jit(fn)


def _fmt_seconds(s: float) -> str:
    """Human-readable duration: 1.23 s / 4.56 ms / 7.8 us."""
    if s >= 1.0:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} us"


def _fmt_range(lo: float, hi: float) -> str:
    """Format a range in the unit of its upper end: '4.40–4.90 ms'."""
    if hi >= 1.0:
        return f"{lo:.2f}–{hi:.2f} s"
    if hi >= 1e-3:
        return f"{lo * 1e3:.2f}–{hi * 1e3:.2f} ms"
    return f"{lo * 1e6:.1f}–{hi * 1e6:.1f} us"


# --------------------------------------------------------------------------------------------------
# Compile counting
# --------------------------------------------------------------------------------------------------

#: Emitted (as a duration) once per backend compile request of a jitted computation, with the
#: computation's name as ``fun_name`` (e.g. ``"jit(f)"``). It wraps
#: ``compiler.compile_or_get_cached``, so it fires for a real XLA compile *and* for a load from the
#: persistent compilation cache; it does not fire for in-memory cache hits (the normal fast path).
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
#: Emitted once per top-level trace of a Python function to a jaxpr (``fun_name`` = the function).
JAXPR_TRACE_EVENT = "/jax/core/compile/jaxpr_trace_duration"
#: Plain event fired when an executable is loaded from the persistent compilation cache.
_CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"

_active_counters: list[CompileCounter] = []
_listeners_lock = threading.Lock()
_listeners_installed = False


def _on_duration_event(event: str, duration_secs: float, **kwargs: Any) -> None:
    if event == BACKEND_COMPILE_EVENT:
        name = str(kwargs.get("fun_name", "?"))
        for c in list(_active_counters):
            c.count += 1
            c.compile_s += duration_secs
            c.names.append(name)
    elif event == JAXPR_TRACE_EVENT:
        name = str(kwargs.get("fun_name", "?"))
        for c in list(_active_counters):
            c.traces += 1
            c.traced_names.append(name)


def _on_event(event: str, **kwargs: Any) -> None:
    if event == _CACHE_HIT_EVENT:
        for c in list(_active_counters):
            c.cache_hits += 1


def _ensure_listeners() -> None:
    """Register this module's two jax.monitoring listeners (once per process).

    One module-level listener dispatches to every active counter, so counters nest and nothing
    accumulates in jax's listener lists. ``jax.monitoring.clear_event_listeners()`` would drop
    them; they are re-registered if that happened (checked through jax's private getters when
    present, else trusting a once-only flag).
    """
    global _listeners_installed
    with _listeners_lock:
        try:
            from jax._src import monitoring as _mon  # private; only to check registration

            have_duration = _on_duration_event in _mon.get_event_duration_listeners()
            have_event = _on_event in _mon.get_event_listeners()
        except Exception:  # pragma: no cover - private API moved
            have_duration = have_event = _listeners_installed
        if not have_duration:
            jax.monitoring.register_event_duration_secs_listener(_on_duration_event)
        if not have_event:
            jax.monitoring.register_event_listener(_on_event)
        _listeners_installed = True


class CompileCounter:
    """Count the XLA compilations (and top-level traces) that happen inside a ``with`` block.

    >>> with CompileCounter() as cc:
    ...     f(x)                      # doctest: +SKIP
    >>> cc.assert_none("decode step recompiled")   # doctest: +SKIP

    What is counted (listening to :mod:`jax.monitoring`):

    * ``count`` - backend compile requests (:data:`BACKEND_COMPILE_EVENT`): one per jitted
      computation that was not in jax's in-memory executable cache. This *includes* loads from the
      persistent compilation cache (``jax_compilation_cache_dir``); those are also counted in
      ``cache_hits``, so ``xla_compiles = count - cache_hits`` are the compiles XLA really ran.
      Eager op-by-op calls (``x + 1`` outside jit) compile tiny ``jit(add)``-style programs the
      first time a shape/dtype is seen, and are counted too.
    * ``traces`` - top-level traces of Python functions to jaxprs (a retrace usually precedes a
      recompile, but a retrace can also hit the cache).
    * ``names`` / ``traced_names`` - the ``fun_name`` of each event, e.g. ``"jit(step)"``.
    * ``compile_s`` - total seconds spent in those compile requests.

    The listener is process-wide: compiles started by other threads during the block count too.
    """

    def __init__(self) -> None:
        self.count = 0
        self.traces = 0
        self.cache_hits = 0
        self.compile_s = 0.0
        self.names: list[str] = []
        self.traced_names: list[str] = []

    @property
    def xla_compiles(self) -> int:
        """Compilations XLA actually ran (``count`` minus persistent-cache loads)."""
        return self.count - self.cache_hits

    def __enter__(self) -> CompileCounter:
        _ensure_listeners()
        with _listeners_lock:
            _active_counters.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        with _listeners_lock:
            if self in _active_counters:
                _active_counters.remove(self)

    def assert_none(self, msg: str = "") -> None:
        """Raise ``AssertionError`` if anything compiled inside the block, naming what did."""
        if self.count:
            what = ", ".join(self.names)
            prefix = f"{msg}: " if msg else ""
            hits = f" ({self.cache_hits} from the persistent cache)" if self.cache_hits else ""
            raise AssertionError(
                f"{prefix}expected no compilation, but {self.count} compilation(s) happened{hits}: {what}"
            )

    def __repr__(self) -> str:
        return (
            f"CompileCounter(count={self.count}, traces={self.traces}, "
            f"cache_hits={self.cache_hits}, names={self.names})"
        )


# --------------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Timing:
    """Result of :func:`time_fn`. All values are seconds.

    ``compile_s`` is the time to get an executable: trace + lower + XLA compile when ``aot`` is
    true (``lower_s`` is the trace + lower part), otherwise the duration of the first, synchronized
    call (which includes whatever it compiled). ``compiles`` is how many backend compilations
    that step triggered; 0 means the function was already compiled (``compile_s`` is then only the
    cache lookup).
    """

    compile_s: float
    times: list[float]
    aot: bool = True
    lower_s: float | None = None
    compiles: int | None = None

    @property
    def median(self) -> float:
        return float(np.median(self.times))

    @property
    def min(self) -> float:
        return float(np.min(self.times))

    @property
    def max(self) -> float:
        return float(np.max(self.times))

    @property
    def mean(self) -> float:
        return float(np.mean(self.times))

    @property
    def spread(self) -> tuple[float, float]:
        """(25th, 75th) percentile of the run times."""
        p25, p75 = np.percentile(self.times, [25, 75])
        return float(p25), float(p75)

    def __str__(self) -> str:
        label = "compile" if self.aot else "first call"
        cached = " (already compiled)" if self.aot and self.compiles == 0 else ""
        lo, hi = self.spread
        return (
            f"{label} {_fmt_seconds(self.compile_s)}{cached}, run {_fmt_seconds(self.median)} "
            f"(median of {len(self.times)}, {_fmt_range(lo, hi)})"
        )


def time_fn(fn: Callable[..., Any], *args: Any, repeats: int = 5, warmup: int = 1, **kwargs: Any) -> Timing:
    """Time ``fn(*args, **kwargs)``: compile separately, then ``repeats`` synchronized runs.

    If ``fn`` has ``.lower`` (a ``jax.jit`` function), the compile step is timed with AOT
    ``fn.lower(*args, **kwargs).compile()``; the later ``fn(...)`` calls hit jax's executable cache,
    so the runs include normal dispatch overhead but no compile. Otherwise the first call is timed
    as ``compile_s`` (``aot=False``). ``warmup`` untimed runs follow, then ``repeats`` timed ones;
    every call is followed by :func:`jax.block_until_ready` on its outputs.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    with CompileCounter() as cc:
        if hasattr(fn, "lower"):
            t0 = time.perf_counter()
            lowered = fn.lower(*args, **kwargs)
            t1 = time.perf_counter()
            lowered.compile()
            t2 = time.perf_counter()
            aot, lower_s, compile_s = True, t1 - t0, t2 - t0
        else:
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*args, **kwargs))
            aot, lower_s, compile_s = False, None, time.perf_counter() - t0
    for _ in range(max(0, warmup)):
        jax.block_until_ready(fn(*args, **kwargs))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args, **kwargs))
        times.append(time.perf_counter() - t0)
    return Timing(compile_s=compile_s, times=times, aot=aot, lower_s=lower_s, compiles=cc.count)


class Timer:
    """Wall-clock stopwatch for a block; see :func:`timed`.

    ``keep(value)`` registers outputs to :func:`jax.block_until_ready` before the clock stops, and
    returns ``value`` unchanged, so ``y = t.keep(f(x))`` times the computation, not the dispatch.
    """

    def __init__(self, label: str | None = None) -> None:
        self.label = label
        self.seconds: float | None = None
        self._kept: list[Any] = []
        self._t0: float | None = None

    def keep(self, value: Any) -> Any:
        self._kept.append(value)
        return value

    def __enter__(self) -> Timer:
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._kept:
            jax.block_until_ready(self._kept)
            self._kept = []
        assert self._t0 is not None
        self.seconds = time.perf_counter() - self._t0

    def __str__(self) -> str:
        s = "running" if self.seconds is None else _fmt_seconds(self.seconds)
        return f"{self.label}: {s}" if self.label else s


@contextlib.contextmanager
def timed(
    label: str | None = None, *, results: dict[str, float] | None = None, verbose: bool = False
) -> Iterator[Timer]:
    """Record the wall time of a block; synchronizes on values passed to ``t.keep``.

    >>> with timed("prefill") as t:
    ...     logits = t.keep(prefill(params, tokens))   # doctest: +SKIP
    >>> t.seconds                                       # doctest: +SKIP

    With ``results``, the time is also stored as ``results[label]``; ``verbose`` prints it.
    """
    t = Timer(label)
    with t:
        yield t
    if results is not None:
        results[label if label is not None else f"block{len(results)}"] = t.seconds  # type: ignore[assignment]
    if verbose:
        print(t)


# --------------------------------------------------------------------------------------------------
# Cost analysis, HLO
# --------------------------------------------------------------------------------------------------


def _cost_dict(raw: Any) -> dict[str, float]:
    """Normalise ``cost_analysis()`` output: a dict, a list of dicts (older jax), or None."""
    if raw is None:
        return {}
    if isinstance(raw, Mapping):
        return dict(raw)
    if isinstance(raw, Sequence):
        merged: dict[str, float] = {}
        for d in raw:  # one dict per device program; sum them
            for k, v in (d or {}).items():
                merged[k] = merged.get(k, 0.0) + v
        return merged
    return {}


def cost_analysis(jitted_fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """XLA's cost model for ``jitted_fn(*args, **kwargs)`` after compilation.

    Returns ``flops``, ``bytes_accessed``, ``transcendentals``, ``optimal_seconds`` (None where the
    backend does not report them), ``argument_bytes`` / ``output_bytes`` / ``temp_bytes`` from
    ``memory_analysis()`` where available, and ``raw``: the backend's full dictionary. Args may be
    arrays or ``jax.ShapeDtypeStruct``. A plain function is wrapped in ``jax.jit``. The program analysed is XLA's
    own (:func:`~jaxlab.engine.kernels.cpu.xla_only`): the cost model cannot see into jaxlab's CPU kernels.
    """
    with cpu_kernels.xla_only():
        compiled = _as_jitted(jitted_fn).lower(*args, **kwargs).compile()
    try:
        raw = _cost_dict(compiled.cost_analysis())
    except Exception:  # some backends raise instead of returning None
        raw = {}

    def get(key: str) -> float | None:
        v = raw.get(key)
        return None if v is None else float(v)

    out: dict[str, Any] = {
        "flops": get("flops"),
        "bytes_accessed": get("bytes accessed"),
        "transcendentals": get("transcendentals"),
        "optimal_seconds": get("optimal_seconds"),
        "argument_bytes": None,
        "output_bytes": None,
        "temp_bytes": None,
        "raw": raw,
    }
    try:
        mem = compiled.memory_analysis()
    except Exception:
        mem = None
    if mem is not None:
        out["argument_bytes"] = getattr(mem, "argument_size_in_bytes", None)
        out["output_bytes"] = getattr(mem, "output_size_in_bytes", None)
        out["temp_bytes"] = getattr(mem, "temp_size_in_bytes", None)
    return out


def hlo_text(jitted_fn: Callable[..., Any], *args: Any, optimized: bool = True, **kwargs: Any) -> str:
    """HLO text of ``jitted_fn(*args, **kwargs)``.

    ``optimized=True``: the compiled module after XLA's passes (fusions, collectives as the
    backend will run them). ``optimized=False``: the HLO jax hands to XLA, before optimization.
    """
    lowered = _as_jitted(jitted_fn).lower(*args, **kwargs)
    if optimized:
        return lowered.compile().as_text()
    return lowered.as_text(dialect="hlo")


COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
DEFAULT_OPS = (
    *COLLECTIVES,
    "dot",
    "convolution",
    "fusion",
    "custom-call",
    "while",
)


def count_ops(hlo: str, names: Sequence[str] = DEFAULT_OPS) -> dict[str, int]:
    """Count HLO instructions by opcode in ``hlo`` text (as from :func:`hlo_text`).

    An instruction ``x = f32[8] all-reduce(...)`` counts for ``"all-reduce"``. Asynchronous pairs
    (``all-reduce-start`` / ``all-reduce-done``, common on GPU/TPU) count once, via their
    ``-start``. Quoted strings (``op_name="..."`` metadata, file names) are ignored. Instructions in
    nested computations (fusion bodies, loop bodies) are counted too: a ``dot`` inside a fusion
    counts as a ``dot`` and its call site as a ``fusion``.
    """
    text = re.sub(r'"[^"\n]*"', '""', hlo)
    counts = {}
    for name in names:
        pat = re.compile(r"(?<![\w.\-%])" + re.escape(name) + r"(?:-start)?\(")
        counts[name] = len(pat.findall(text))
    return counts


# --------------------------------------------------------------------------------------------------
# Memory
# --------------------------------------------------------------------------------------------------


def array_bytes(tree: Any, per_device: bool = False) -> int:
    """Total bytes of the array leaves of a pytree (jax arrays, numpy arrays, ShapeDtypeStructs; a random key
    counts its key data). ``per_device``: one device's part, a leaf placed with a sharding counting its shard (a
    split array its slice, a replicated one whole)."""
    total = 0
    for leaf in jax.tree_util.tree_leaves(tree):
        if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
            sharding = getattr(leaf, "sharding", None) if per_device else None
            shape = sharding.shard_shape(leaf.shape) if sharding is not None else leaf.shape
            total += int(np.prod(shape, dtype=np.int64)) * _itemsize(leaf.dtype)
    return total


def _itemsize(dtype) -> int:
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return 8  # a threefry key (jax's default): two uint32
    return np.dtype(dtype).itemsize


def _rss_bytes() -> tuple[int | None, int | None]:
    """(current RSS, peak RSS) of this process in bytes, where the OS tells us."""
    current = None
    try:
        with open("/proc/self/statm") as f:
            current = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource  # Unix only

        peak: int | None = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        peak = peak if sys.platform == "darwin" else peak * 1024  # Linux: KiB, macOS: bytes
    except (ImportError, OSError):
        peak = None
    return current, peak


def memory_stats(device: Any = None) -> dict[str, Any]:
    """Memory in use, in bytes.

    Always: ``device``, ``platform`` (of ``device``, default: the first device),
    ``live_arrays_bytes`` (sum of ``nbytes`` over :func:`jax.live_arrays` on ``device``; on all
    devices when ``device`` is None),
    ``process_rss_bytes`` and ``process_peak_rss_bytes`` (host memory of this process).
    On GPU/TPU also the device allocator's numbers (``bytes_in_use``, ``peak_bytes_in_use``,
    ``bytes_limit``, ...) from ``device.memory_stats()``; on CPU that returns None, and the process
    RSS is the number to watch.
    """
    dev = device if device is not None else jax.devices()[0]
    live = 0
    for a in jax.live_arrays():
        try:
            if device is None or dev in a.devices():
                live += a.nbytes
        except Exception:  # deleted/donated arrays
            continue
    current, peak = _rss_bytes()
    out: dict[str, Any] = {
        "device": str(dev),
        "platform": dev.platform,
        "live_arrays_bytes": live,
        "process_rss_bytes": current,
        "process_peak_rss_bytes": peak,
    }
    try:
        dev_stats = dev.memory_stats()
    except Exception:
        dev_stats = None
    if dev_stats:
        out.update(dev_stats)
    return out


# --------------------------------------------------------------------------------------------------
# Roofline
# --------------------------------------------------------------------------------------------------


def measure_bandwidth(nbytes: int = 1 << 30, repeats: int = 3) -> float:
    """Sustained memory bandwidth in bytes/s: (bytes read + bytes written) / time of ``x + 1``.

    ``x`` is a float32 array of ``nbytes`` (1 GiB by default, far larger than any cache). The
    jitted ``x + 1.0`` must read and write every element, so XLA cannot elide it; the input is
    donated so the output reuses its buffer (no fresh allocation and page faults per run, which on
    CPU would halve the result) - exactly the steady state of a model whose weights are resident.
    Best (min) time of ``repeats`` synchronized runs. Peak memory is about ``nbytes`` (x2 where
    donation is unsupported). Use a small ``nbytes`` only for tests: caches inflate the result.
    """
    n = max(1, nbytes // 4)
    step = jax.jit(lambda x: x + 1.0, donate_argnums=0)
    x = jnp.zeros((n,), jnp.float32)
    x = jax.block_until_ready(step(x))  # compile + first touch
    best = float("inf")
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        x = jax.block_until_ready(step(x))
        best = min(best, time.perf_counter() - t0)
    del x
    return 2 * n * 4 / best


def measure_matmul_flops(n: int = 2048, dtype: Any = jnp.float32, repeats: int = 3) -> float:
    """Achieved FLOP/s of an ``n x n @ n x n`` matmul (``2 n^3`` FLOPs) at ``Precision.HIGHEST``.

    Best (min) of ``repeats`` synchronized runs after one compile/warm-up run. A practical compute
    ceiling for the roofline; the vendor's datasheet peak (:mod:`jaxlab.tools.hardware`) is usually higher.

    ``dtype=jnp.bfloat16`` measures the ceiling accelerators publish their peaks in (bfloat16 inputs,
    float32 accumulation on the TPU's MXU and NVIDIA's tensor cores). XLA:CPU has no bfloat16 matrix
    unit to use on most CPUs: it computes the product in float32 and rounds, so on a CPU the bfloat16
    ceiling is about the float32 one (2 cores here: within the noise of each other), not twice it.
    """
    probe = matmul_probe(n, dtype)
    return max(probe() for _ in range(max(1, repeats)))


def matmul_probe(n: int = 2048, dtype: Any = jnp.float32) -> Callable[[], float]:
    """The matmul of :func:`measure_matmul_flops`, compiled and warmed once: each call runs it once more and
    returns that run's FLOP/s. For sampling the compute ceiling *beside* other work, where one measurement
    before it could land in a moment when a neighbouring process held the cores and understate the ceiling."""
    ka, kb = jax.random.split(jax.random.key(0))
    a = jax.random.normal(ka, (n, n), dtype)
    b = jax.random.normal(kb, (n, n), dtype)
    mm = jax.jit(lambda a, b: jnp.matmul(a, b, precision=jax.lax.Precision.HIGHEST))
    jax.block_until_ready(mm(a, b))

    def once() -> float:
        t0 = time.perf_counter()
        jax.block_until_ready(mm(a, b))
        return 2.0 * n**3 / (time.perf_counter() - t0)

    return once


@dataclasses.dataclass(frozen=True)
class Roofline:
    """A two-ceiling roofline: memory ``bandwidth`` (bytes/s) and ``peak_flops`` (FLOP/s).

    A program doing ``flops`` work over ``bytes`` of memory traffic cannot finish faster than
    ``max(flops / peak_flops, bytes / bandwidth)``. Its arithmetic intensity ``flops / bytes``
    left of the ``ridge`` means memory-bound, right of it compute-bound.
    """

    bandwidth: float
    peak_flops: float

    @classmethod
    def measure(cls, nbytes: int = 1 << 30, n: int = 2048, repeats: int = 3, dtype: Any = jnp.float32) -> Roofline:
        """Measure both ceilings on the default device; the matmul in ``dtype``, the one the model computes in
        (a bfloat16 model's ceiling is the bfloat16 matmul's: the peak accelerators publish)."""
        return cls(measure_bandwidth(nbytes, repeats), measure_matmul_flops(n, dtype, repeats=repeats))

    @property
    def ridge(self) -> float:
        """Arithmetic intensity (FLOP/byte) where the two ceilings meet."""
        return self.peak_flops / self.bandwidth

    @staticmethod
    def intensity(flops: float, nbytes: float) -> float:
        """Arithmetic intensity in FLOP/byte."""
        return flops / nbytes

    def attainable(self, intensity: float) -> float:
        """Best FLOP/s possible at this arithmetic intensity: ``min(peak, intensity * bw)``."""
        return min(self.peak_flops, intensity * self.bandwidth)

    def time_bound(self, flops: float, nbytes: float) -> float:
        """Lower bound on seconds: ``max(flops / peak_flops, bytes / bandwidth)``."""
        return max(flops / self.peak_flops, nbytes / self.bandwidth)

    def bound(self, flops: float, nbytes: float) -> str:
        """``"memory"`` or ``"compute"``: which ceiling limits this program."""
        return "memory" if nbytes / self.bandwidth >= flops / self.peak_flops else "compute"

    def fraction(self, flops: float, nbytes: float, seconds: float) -> float:
        """Achieved fraction of the roofline bound: ``time_bound / seconds`` (1.0 = at the roof)."""
        return self.time_bound(flops, nbytes) / seconds

    def __str__(self) -> str:
        return (
            f"Roofline(bandwidth {self.bandwidth / 1e9:.1f} GB/s, "
            f"peak {self.peak_flops / 1e9:.1f} GFLOP/s, ridge {self.ridge:.1f} FLOP/B)"
        )


def plot_roofline(
    roofline: Roofline,
    points: Mapping[str, tuple[float, float, float]] | None = None,
    ax: Any = None,
) -> Any:
    """Log-log roofline plot; returns the matplotlib ``Figure``.

    ``points`` maps a label to ``(flops, bytes, seconds)``; each is drawn at
    (arithmetic intensity, achieved FLOP/s) under the memory slope and the compute ceiling.
    """
    import matplotlib.pyplot as plt  # lazy: only notebooks need it

    points = dict(points or {})
    if ax is None:
        fig, ax = plt.subplots(figsize=(6.5, 4.5))
    else:
        fig = ax.figure
    intensities = [Roofline.intensity(f, b) for f, b, _ in points.values()] + [roofline.ridge]
    lo = min(intensities) / 10
    hi = max(intensities) * 10
    xs = np.logspace(np.log10(lo), np.log10(hi), 200)
    ax.loglog(xs, [roofline.attainable(x) for x in xs], "k-", lw=2, label="roofline")
    ax.axvline(roofline.ridge, color="gray", ls=":", lw=1)
    ax.text(
        roofline.ridge,
        roofline.peak_flops,
        f" ridge {roofline.ridge:.1f} FLOP/B",
        va="bottom",
        ha="left",
        fontsize=8,
        color="gray",
    )
    ax.text(
        lo,
        roofline.attainable(lo),
        f" {roofline.bandwidth / 1e9:.0f} GB/s",
        va="bottom",
        ha="left",
        fontsize=8,
        rotation=0,
    )
    ax.text(
        hi,
        roofline.peak_flops,
        f"{roofline.peak_flops / 1e9:.0f} GFLOP/s ",
        va="bottom",
        ha="right",
        fontsize=8,
    )
    for label, (flops, nbytes, seconds) in points.items():
        x = Roofline.intensity(flops, nbytes)
        y = flops / seconds
        frac = roofline.fraction(flops, nbytes, seconds)
        ax.loglog([x], [y], "o", label=f"{label} ({frac:.0%} of bound)")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("achieved FLOP/s")
    ax.set_title("Roofline")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return fig


# --------------------------------------------------------------------------------------------------
# Profiler trace
# --------------------------------------------------------------------------------------------------


def trace(fn: Callable[..., Any], *args: Any, logdir: str | os.PathLike | None = None, **kwargs: Any) -> str:
    """Run ``fn(*args, **kwargs)`` once under ``jax.profiler.trace`` and return the log directory.

    Outputs are blocked on inside the trace, so the device work is captured, not just the dispatch.
    Call ``fn`` once beforehand if the compile should stay out of the trace. The directory
    (a new temp dir by default) gets ``plugins/profile/<run>/*.xplane.pb`` and ``*.trace.json.gz``:
    open it with TensorBoard's profile plugin or drop the ``.trace.json.gz`` into Perfetto
    (ui.perfetto.dev). The model wraps its blocks in ``jax.named_scope`` (attention, mlp, ...), so
    the ops in the trace carry the names of the code that produced them.
    """
    path = str(logdir) if logdir is not None else tempfile.mkdtemp(prefix="jaxlab-trace-")
    os.makedirs(path, exist_ok=True)
    with jax.profiler.trace(path):
        jax.block_until_ready(fn(*args, **kwargs))
    return path
