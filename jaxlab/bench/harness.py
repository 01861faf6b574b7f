"""What every measured section stands on: the progress log, the :class:`Setup` a run loads once (model,
prompts, shapes, the generator and the peer), a :class:`~jaxlab.engine.generate.Generator` whose program
cache records each compile (:func:`timed_generator`), and the host facts the report's header prints."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

from jaxlab.engine.programs import Programs
from jaxlab.tools.hardware import cpu_name  # noqa: F401 - the bench's modules and scripts import it from here


class Progress:
    """The run's log on stderr: elapsed wall and CPU seconds, then the message."""

    def __init__(self, enabled: bool = True):
        self.t0 = time.perf_counter()
        self.cpu0 = time.process_time()
        self.enabled = enabled

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def __call__(self, msg: str) -> None:
        if self.enabled:
            sys.stderr.write(f"[bench {self.elapsed():6.0f} s, cpu {time.process_time() - self.cpu0:6.0f} s] {msg}\n")
            sys.stderr.flush()


@dataclass
class Setup:
    """What the measured sections share, loaded once per run."""

    params: Any  # float32 Params (the model of every row but the quantized variants)
    tokenizer: Any
    rows: list[list[int]]  # prompt windows, one per row of the largest batch; rows[0] is every batch-1 prompt
    cache_len: int  # KV-cache slots of every measured program (the bucket of prompt + new tokens)
    log: Callable[[str], None]
    generator: Any = None  # the timed Generator of the float32 rows (None in a --quant-only run)
    peer: Any = None  # the transformers model, or None


class TimedPrograms(Programs):
    """The engine's program cache, recording each compile: function, shapes, seconds, and XLA's memory
    and cost analyses of the compiled program (``compile_log``). Compiling is still the library's."""

    def __init__(self, dtype: str):
        super().__init__()
        self.dtype = dtype
        self.compile_log: list[dict] = []

    def get(self, name: str, jitted, args: tuple, static: dict | None = None):
        fn, compile_s = super().get(name, jitted, args, static)
        if compile_s:
            entry = {"function": name, "seconds": compile_s, "dtype": self.dtype}
            if name in ("prefill", "decode"):  # args: params, tokens, positions, cache, ...
                entry.update(
                    batch=int(args[1].shape[0]),
                    tokens=int(args[1].shape[1]) if args[1].ndim > 1 else 1,
                    cache_len=int(args[3].length),
                )
            else:
                entry.update(batch=int(args[0].shape[0]), tokens=None, cache_len=None)
            try:
                mem = fn.memory_analysis()
                entry["temp_bytes"] = getattr(mem, "temp_size_in_bytes", None)
            except Exception:
                entry["temp_bytes"] = None
            cost = xla_cost(fn)
            entry["xla_flops"], entry["xla_bytes_accessed"] = cost.get("flops"), cost.get("bytes accessed")
            self.compile_log.append(entry)
        return fn, compile_s


def timed_generator(params, tokenizer):
    """A :class:`~jaxlab.engine.generate.Generator` whose program cache is a :class:`TimedPrograms`: its
    compiles are in ``generator.programs.compile_log``; generation is the library's."""
    from jaxlab.engine.generate import Generator

    gen = Generator(params, tokenizer)
    gen.programs = TimedPrograms(params.policy.dtype)
    return gen


def xla_cost(compiled) -> dict:
    """XLA's cost analysis of a compiled program (what :func:`jaxlab.tools.profile.cost_analysis` reads), as one dict."""
    try:
        raw = compiled.cost_analysis()
    except Exception:
        return {}
    if isinstance(raw, (list, tuple)):
        merged: dict = {}
        for d in raw:
            for k, v in (d or {}).items():
                merged[k] = merged.get(k, 0.0) + v
        return merged
    return dict(raw or {})


def threads_info(peer_loaded: bool) -> dict:
    """The thread pools the numbers depend on: XLA's intra-op pool, OpenMP's settings, torch's threads."""
    flags = os.environ.get("XLA_FLAGS", "")
    try:
        schedulable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        schedulable = os.cpu_count()
    intra = [f for f in flags.split() if "intra_op" in f or "multi_thread_eigen" in f or "thread" in f]
    info = {
        "os_cpu_count": os.cpu_count(),
        "schedulable_cpus": schedulable,
        "xla_flags": flags,
        "xla_thread_flags": intra,
        "xla_intra_op_threads": None if intra else schedulable,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "torch_threads": None,
    }
    if peer_loaded:
        import torch

        info["torch_threads"] = torch.get_num_threads()
        info["torch_interop_threads"] = torch.get_num_interop_threads()
    return info


def versions() -> dict:
    """Installed versions of the packages the numbers depend on (None: not installed)."""
    from importlib import metadata

    out = {}
    for pkg in ("jaxlab", "jax", "jaxlib", "flax", "numpy", "torch", "transformers"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out
