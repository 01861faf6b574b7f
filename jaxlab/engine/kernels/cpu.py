"""jaxlab's own CPU kernels, called from XLA:CPU programs through the XLA FFI: where XLA:CPU's code for a decode
step's few rows is far from what the CPU can do.

* ``cc/int8_matmul.cc`` — the int8 matrix product ``[R, K] int8 x [N, K] int8 -> [R, N] int32`` of a few rows (a
  decode step's 1-2 rows, split into hi and lo): AVX-512 VNNI, the weight rows split over the CPU's cores. At one
  or two rows XLA:CPU's int8 GEMM (YNNPACK) reads the weights at under half of what two cores can stream
  (``benchmarks/NOTES.md`` 15, 26). Integer sums are exact, so it gives **the same bits** as XLA's dot.
* ``cc/paged_attention.cc`` — attention through the page table for a few queries a row (decode steps): float32
  pages with each page's keys transposed (key layout "ds"), or int8 pages with their scales (key layout "sd"). Each
  page is read where it lies, where XLA:CPU first gathers every row's pages into a copy that it writes at under half
  the copy bandwidth (NOTES 22, 27). Float sums in another order: float32 pages within float32 rounding of XLA's
  attention (~3e-7); int8 pages within float32 rounding of the attention of their dequantized vectors, closer to it
  than XLA's int8 path, which rounds the queries and weights to ~15 bits first (~5e-5). Each row's result is the same
  bits alone or among others.
* ``cc/threads.h`` — the helper threads both share.

Built on first use with the system C++ compiler (``g++`` / ``c++``, a few seconds) into one library in the cache
folder (``$JAXLAB_CACHE/kernels/<hash>/``, keyed by the sources, the flags and jaxlib), whose targets are registered
for the CPU platform. Used only where they win (:func:`uses_int8_matmul`, :func:`uses_paged_attention`), only when a
program is lowered for the CPU (``jax.lax.platform_dependent``: a program compiled for a TPU or a GPU from this
process keeps XLA's code), and only where the CPU has AVX-512 BW and VNNI on Linux. Elsewhere, without a compiler or
with ``JAXLAB_CPU_KERNEL=0``, XLA's code runs, and :func:`status` says why (``jaxlab info`` prints it).
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

SOURCES = tuple(Path(__file__).with_name("cc") / n for n in ("int8_matmul.cc", "paged_attention.cc"))
HEADERS = (Path(__file__).with_name("cc") / "threads.h",)
#: FFI target name -> the handler's symbol in the library
TARGETS = {
    "jaxlab_int8_matmul": "JaxlabInt8Matmul",
    "jaxlab_paged_attention": "JaxlabPagedAttention",
    "jaxlab_paged_attention_int8": "JaxlabPagedAttentionInt8",
}
#: The int8 product runs on the kernel for at most this many int8 rows (a decode step's 1-2 rows, split into hi and
#: lo); XLA's GEMM is faster from 8 (NOTES 26: the int8 ``Generator`` at 1 / 2 / 4 rows 18.8 -> 12.3, 20.9 -> 17.7
#: and 23.1 -> 26.9 ms a token).
MAX_ROWS = 4
#: Paged attention runs on the kernel for at most this many queries a row (a decode step's one, a speculative
#: step's few); a prefill chunk's many queries share each page better in XLA's batched matmuls.
MAX_QUERIES = 8
#: The widest attention head the kernel holds (its accumulators).
MAX_HEAD_DIM = 128
FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-pthread")
#: what the kernels' instructions need, as /proc/cpuinfo names them
CPU_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512_vnni")
ENV = "JAXLAB_CPU_KERNEL"


@dataclass(frozen=True)
class KernelStatus:
    """Whether the kernels are in use in this process, and why (not)."""

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
    """Where the built library lives: one folder per sources, flags and jaxlib version."""
    text = b"".join(p.read_bytes() for p in (*SOURCES, *HEADERS))
    key = hashlib.sha256(text + " ".join(FLAGS).encode() + jaxlib.__version__.encode()).hexdigest()
    return cache_dir() / "kernels" / key[:16] / "libjaxlab_cpu_kernels.so"


def build(compiler: str, out: Path) -> None:
    """Compile the kernels into ``out`` (whole or not at all: concurrent builders each write a file of their own and
    rename it into place). Raises ``RuntimeError`` with the compiler's message."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        part = Path(tmp) / out.name
        cmd = [compiler, *FLAGS, f"-I{jax.ffi.include_dir()}", *map(str, SOURCES), "-o", str(part)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {(done.stderr or done.stdout).strip()[-800:]}")
        os.replace(part, out)


@functools.cache
def status() -> KernelStatus:
    """Find, build if needed, load and register the kernels, once per process."""
    fallback = "XLA's int8 dot and paged attention run"
    if os.environ.get(ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return KernelStatus(False, f"turned off ({ENV}=0): {fallback}")
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return KernelStatus(False, f"written for Linux on x86-64 (this is {platform.system()} {platform.machine()})")
    missing = [f for f in CPU_FLAGS if f not in _cpu_flags()]
    if missing:
        return KernelStatus(False, f"this CPU lacks {', '.join(missing)}: {fallback}")
    path = library_path()
    if not path.exists():
        compiler = _compiler()
        if compiler is None:
            return KernelStatus(False, f"no C++ compiler (g++ or c++) to build them with: {fallback}")
        try:
            build(compiler, path)
        except (RuntimeError, OSError) as e:
            return KernelStatus(False, f"building them failed ({e}): {fallback}")
    try:
        lib = ctypes.cdll.LoadLibrary(str(path))
        handlers = {target: getattr(lib, symbol) for target, symbol in TARGETS.items()}
    except (OSError, AttributeError) as e:  # a damaged file in the cache: say so, and what to do
        return KernelStatus(False, f"loading {path} failed ({e}); delete it to rebuild: {fallback}")
    for target, handler in handlers.items():
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(handler), platform="cpu")
    return KernelStatus(
        True,
        f"in use for int8 products of <= {MAX_ROWS} rows and paged attention of <= {MAX_QUERIES} queries a row",
        str(path),
    )


def int8_matmul(xq: jax.Array, q: jax.Array) -> jax.Array:
    """``[R, K] int8 x [N, K] int8 -> [R, N] int32`` by the kernel (CPU only; call :func:`status` first)."""
    return jax.ffi.ffi_call("jaxlab_int8_matmul", jax.ShapeDtypeStruct((xq.shape[0], q.shape[0]), jnp.int32))(xq, q)


def uses_int8_matmul(rows: int) -> bool:
    """Whether a product of ``rows`` int8 rows runs on the kernel when lowered for a CPU."""
    return rows <= MAX_ROWS and status().available


def paged_attention(q, positions, k, v, page_table, k_scale=None, v_scale=None) -> jax.Array:
    """q [B, T, KVH, G, Hd] float32 at ``positions`` [B, T] through ``page_table`` [B, P] -> [B, T, KVH, G, Hd] float32
    by the kernel (CPU only; call :func:`status` first), over float32 pools k [KVH, N, Hd, ps] (keys transposed in
    their pages) and v [KVH, N, ps, Hd], or int8 pools k and v [KVH, N, ps, Hd] with their scales [KVH, N, ps]. A
    padding query (position -1) gives zeros."""
    out = jax.ShapeDtypeStruct(q.shape, jnp.float32)
    if k_scale is None:
        return jax.ffi.ffi_call("jaxlab_paged_attention", out)(q, positions, k, v, page_table)
    return jax.ffi.ffi_call("jaxlab_paged_attention_int8", out)(q, positions, k, v, k_scale, v_scale, page_table)


def uses_paged_attention(queries: int, head_dim: int) -> bool:
    """Whether paged attention of ``queries`` queries a row and heads of ``head_dim`` runs on the kernel when
    lowered for a CPU (the pages' format and layout: the caller checks those)."""
    return queries <= MAX_QUERIES and head_dim <= MAX_HEAD_DIM and status().available
