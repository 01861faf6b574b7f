"""The int8 matrix product of a decode step's few rows, as a CPU kernel of jaxlab's own (XLA FFI).

Why: at one or two rows, XLA:CPU's int8 GEMM (YNNPACK) reads the weights at under half of what two cores can
stream, so the one-row int8 decode step was bound by the kernel, not by memory (``benchmarks/NOTES.md`` 15, 26).
``int8_matmul.cc`` beside this file is the product ``[R, K] int8 x [N, K] int8 -> [R, N] int32`` with AVX-512
VNNI, the weight rows split over the CPU's cores. Integer sums are exact, so it gives **the same bits** as XLA's
dot: every golden, parity and batch-invariance check holds whichever of the two runs.

* Built on first use with the system C++ compiler (``g++`` / ``c++``, a few seconds) into the cache folder
  (``$JAXLAB_CACHE/kernels/<hash>/``, keyed by the source, the flags and jaxlib), then registered as the FFI target
  :data:`TARGET` for the CPU platform.
* Used only where it wins (:data:`MAX_ROWS`), only when a program is lowered for the CPU
  (``jax.lax.platform_dependent``: a program compiled for a TPU or a GPU from this process keeps XLA's dot), and only
  where the CPU has AVX-512 BW and VNNI on Linux. Elsewhere, or without a compiler, or with ``JAXLAB_CPU_KERNEL=0``,
  XLA's dot runs, and :func:`status` says why (``jaxlab info`` prints it).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import jaxlib

from jaxlab.io.assets import cache_dir

SOURCE = Path(__file__).with_name("int8_matmul.cc")
TARGET = "jaxlab_int8_matmul"
SYMBOL = "JaxlabInt8Matmul"
#: The kernel runs products of at most this many int8 rows (a decode step's 1-2 rows, split into hi and lo); XLA's
#: GEMM is faster from 8 (NOTES 26: the int8 ``Generator`` at 1 / 2 / 4 rows 18.8 -> 12.3, 20.9 -> 17.7 and
#: 23.1 -> 26.9 ms a token).
MAX_ROWS = 4
FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-pthread")
#: what the kernel's instructions need, as /proc/cpuinfo names them
CPU_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512_vnni")
ENV = "JAXLAB_CPU_KERNEL"


@dataclass(frozen=True)
class KernelStatus:
    """Whether the kernel is in use in this process, and why (not)."""

    available: bool
    reason: str
    library: str | None = None


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def _compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def library_path() -> Path:
    """Where the built kernel lives: one folder per source, flags and jaxlib version."""
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join(FLAGS).encode() + jaxlib.__version__.encode()).hexdigest()
    return cache_dir() / "kernels" / key[:16] / "libjaxlab_int8_matmul.so"


def build(compiler: str, out: Path) -> None:
    """Compile the kernel into ``out`` (whole or not at all: concurrent builders each write a file of their own and
    rename it into place). Raises ``RuntimeError`` with the compiler's message."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        part = Path(tmp) / out.name
        cmd = [compiler, *FLAGS, f"-I{jax.ffi.include_dir()}", str(SOURCE), "-o", str(part)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {(done.stderr or done.stdout).strip()[-800:]}")
        os.replace(part, out)


@functools.cache
def status() -> KernelStatus:
    """Find, build if needed, load and register the kernel, once per process."""
    if os.environ.get(ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return KernelStatus(False, f"turned off ({ENV}=0): XLA's int8 dot runs")
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return KernelStatus(False, f"written for Linux on x86-64 (this is {platform.system()} {platform.machine()})")
    missing = [f for f in CPU_FLAGS if f not in _cpu_flags()]
    if missing:
        return KernelStatus(False, f"this CPU lacks {', '.join(missing)}: XLA's int8 dot runs")
    path = library_path()
    if not path.exists():
        compiler = _compiler()
        if compiler is None:
            return KernelStatus(False, "no C++ compiler (g++ or c++) to build it with: XLA's int8 dot runs")
        try:
            build(compiler, path)
        except (RuntimeError, OSError) as e:
            return KernelStatus(False, f"building it failed ({e}): XLA's int8 dot runs")
    try:
        lib = ctypes.cdll.LoadLibrary(str(path))
        handler = getattr(lib, SYMBOL)
    except (OSError, AttributeError) as e:  # a damaged file in the cache: say so, and what to do
        return KernelStatus(False, f"loading {path} failed ({e}); delete it to rebuild: XLA's int8 dot runs")
    jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(handler), platform="cpu")
    return KernelStatus(True, f"in use for int8 products of <= {MAX_ROWS} rows", str(path))


def int8_matmul(xq: jax.Array, q: jax.Array) -> jax.Array:
    """``[R, K] int8 x [N, K] int8 -> [R, N] int32`` by the kernel (CPU only; call :func:`status` first)."""
    return jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct((xq.shape[0], q.shape[0]), jnp.int32))(xq, q)


def uses_kernel(rows: int) -> bool:
    """Whether a product of ``rows`` int8 rows runs on the kernel when lowered for a CPU."""
    return rows <= MAX_ROWS and status().available
