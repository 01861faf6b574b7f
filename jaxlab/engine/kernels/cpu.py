"""jaxlab's own CPU kernels, called from XLA:CPU programs through the XLA FFI: where XLA:CPU's code for a decode
step's few rows is far from what the CPU can do.

* ``cc/int8_matmul.cc`` — the int8 matrix product ``[R, K] int8 x [N, K] int8 -> [R, N] int32`` of a few rows (a
  decode step's 1-2 rows, split into hi and lo): AVX-512 VNNI, the weight rows split over the CPU's cores. At one
  or two rows XLA:CPU's int8 GEMM (YNNPACK) reads the weights at under half of what two cores can stream
  (``benchmarks/NOTES.md`` 15, 26). Integer sums are exact, so it gives **the same bits** as XLA's dot. The int8
  weight-only layers call it with float32 rows (``jaxlab_int8_split_matmul``): the split into hi and lo happens in
  the call, with XLA's float operations for it (the same int8 rows and scales), instead of in five small XLA fusions
  before each product (NOTES 31).
* ``cc/f32_matmul.cc`` — the float32 product ``[R, K] x [K, N]`` of a decode step's rows (a linear layer): each
  output two multiply-add chains, over k's two halves, then their sum, whatever the row count (so a row is the same
  bits alone and among others). Up to 8 rows each of two threads reads one half of the weights front to back, at a
  plain read's bandwidth (NOTES 29); from 9, register tiles with the columns split over the cores. XLA:CPU's 32-row
  product uses about one core (NOTES 19); this one both, and streams a one-row product's weights faster (NOTES 28, 29).
* ``cc/paged_attention.cc`` — attention through the page table for a few queries a row (decode steps): float32
  pages with each page's keys transposed (key layout "ds"), or int8 pages with their scales (key layout "sd"). Each
  page is read where it lies, where XLA:CPU first gathers every row's pages into a copy that it writes at under half
  the copy bandwidth (NOTES 22, 27). The same code reads the contiguous cache's float32 slots ("ds"), 16 at a time,
  masked by their positions, for a decode step's queries and a prefill's alike, each query only as far as the last
  slot it sees, where XLA's reads all of them (NOTES 28, 29). Float
  sums in another order: float32 pages within float32 rounding of XLA's attention (~3e-7); int8 pages within float32
  rounding of the attention of their dequantized vectors, closer to it than XLA's int8 path, which rounds the queries
  and weights to ~15 bits first (~5e-5). Each row's result is the same bits alone or among others.
* ``cc/threads.h`` — the helper threads both share.

Built on first use with the system C++ compiler (``g++`` / ``c++``, a few seconds) into one library in the cache
folder (``$JAXLAB_CACHE/kernels/<hash>/``, keyed by the sources, the flags and jaxlib), whose targets are registered
for the CPU platform. Used only where they win (:func:`uses_int8_matmul`, :func:`uses_f32_matmul`, :func:`uses_paged_attention`,
:func:`uses_contiguous_attention`), only when a
program is lowered for the CPU (``jax.lax.platform_dependent``: a program compiled for a TPU or a GPU from this
process keeps XLA's code), and only where the CPU has AVX-512 BW and VNNI on Linux. Elsewhere, without a compiler or
with ``JAXLAB_CPU_KERNEL=0``, XLA's code runs, and :func:`status` says why (``jaxlab info`` prints it).
"""

from __future__ import annotations

import contextlib
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
from jax.custom_batching import custom_vmap

from jaxlab.io.assets import cache_dir

SOURCES = tuple(
    Path(__file__).with_name("cc") / n
    for n in ("int8_matmul.cc", "f32_matmul.cc", "paged_attention.cc", "stream_read.cc")
)
HEADERS = (Path(__file__).with_name("cc") / "threads.h",)
#: FFI target name -> the handler's symbol in the library
TARGETS = {
    "jaxlab_int8_matmul": "JaxlabInt8Matmul",
    "jaxlab_int8_split_matmul": "JaxlabInt8SplitMatmul",
    "jaxlab_f32_matmul": "JaxlabF32Matmul",
    "jaxlab_paged_attention": "JaxlabPagedAttention",
    "jaxlab_paged_attention_int8": "JaxlabPagedAttentionInt8",
    "jaxlab_contiguous_attention": "JaxlabContiguousAttention",
    "jaxlab_read_sum": "JaxlabReadSum",
}
#: The int8 product runs on the kernel for at most this many int8 rows (a decode step's 1-2 rows, split into hi and
#: lo); XLA's GEMM is faster from 8 (NOTES 26: the int8 ``Generator`` at 1 / 2 / 4 rows 18.8 -> 12.3, 20.9 -> 17.7
#: and 23.1 -> 26.9 ms a token).
MAX_ROWS = 4
#: The float32 product runs on the kernel for at most this many rows (decode steps; NOTES 28: a 30-layer chain of the
#: model's matrices at 1 / 32 rows, XLA 25.8 / 69.6 ms, the kernel 23.0 / 58.2); a prefill's many rows keep XLA's GEMM.
MAX_F32_ROWS = 64
#: Paged attention runs on the kernel for at most this many queries a row (a decode step's one, a speculative
#: step's few); a prefill chunk's many queries share each page better in XLA's batched matmuls.
MAX_QUERIES = 8
#: The widest attention head the kernel holds (its accumulators).
MAX_HEAD_DIM = 128
FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-pthread")
#: what the kernels' instructions need, as /proc/cpuinfo names them
CPU_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512_vnni")
ENV = "JAXLAB_CPU_KERNEL"
#: True inside :func:`xla_only`; part of jit's cache key (``jax.make_user_context``), so a function traced inside and
#: outside gets two programs
XLA_ONLY = jax.make_user_context(default_value=False)


@contextlib.contextmanager
def xla_only():
    """Programs traced inside hold XLA's code, not the kernels: what XLA's cost analysis reads (a custom call's
    FLOPs and bytes are invisible to it), a program's operations as XLA alone would compile them, and what
    ``jax.export`` writes (a serialized program must run where this library is not)."""
    with XLA_ONLY(True):
        yield


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
    fallback = "XLA's dots and attention run"
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
        f"in use for int8 products of <= {MAX_ROWS} rows, float32 products of <= {MAX_F32_ROWS} rows and attention "
        f"(paged: <= {MAX_QUERIES} queries a row; a float32 contiguous cache: any)",
        str(path),
    )


def int8_matmul(xq: jax.Array, q: jax.Array) -> jax.Array:
    """``[R, K] int8 x [N, K] int8 -> [R, N] int32`` by the kernel (CPU only; call :func:`status` first)."""
    return jax.ffi.ffi_call("jaxlab_int8_matmul", jax.ShapeDtypeStruct((xq.shape[0], q.shape[0]), jnp.int32))(xq, q)


def int8_split_matmul(x: jax.Array, q: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``x [R, K] float32, q [N, K] int8 -> (y [2R, N] int32, s [R, 1] float32)``: ``quant.formats.split_activations``
    of x (the same bits) and the product of its rows with q, in one call by the kernel (CPU only; call :func:`status`
    first)."""
    r, n = x.shape[0], q.shape[0]
    out = (jax.ShapeDtypeStruct((2 * r, n), jnp.int32), jax.ShapeDtypeStruct((r, 1), jnp.float32))
    return jax.ffi.ffi_call("jaxlab_int8_split_matmul", out)(x, q)


def f32_matmul(x: jax.Array, w: jax.Array) -> jax.Array:
    """``[R, K] float32 x [K, N] float32 -> [R, N] float32`` by the kernel (CPU only; call :func:`status` first)."""
    out = jax.ShapeDtypeStruct((x.shape[0], w.shape[1]), jnp.float32)
    return jax.ffi.ffi_call("jaxlab_f32_matmul", (out, out))(x, w)[0]  # the second: the kernel's scratch


def read_sum(x: jax.Array, chunks: int = 64) -> jax.Array:
    """``float32 [n] -> [chunks]``: each chunk's sum, read by the kernels' threads, each chunk front to back (the
    bench's read-bandwidth ceiling; CPU only; call :func:`status` first)."""
    return jax.ffi.ffi_call("jaxlab_read_sum", jax.ShapeDtypeStruct((chunks,), jnp.float32))(x.reshape(-1))


def xla_program(fn):
    """``fn`` traced with XLA's code only (:func:`xla_only`), whoever traces it: the steps of a program over several
    devices (a custom call is opaque to XLA's partitioner, which would gather its operands onto every device, and
    has no type for ``shard_map``'s per-device values)."""

    @functools.wraps(fn)
    def traced(*args, **kwargs):
        with xla_only():
            return fn(*args, **kwargs)

    return traced


def in_use() -> bool:
    """Whether programs traced now may hold the kernels: built and loaded (:func:`status`), outside
    :func:`xla_only`."""
    return not XLA_ONLY.value and status().available


def uses_f32_matmul(rows: int) -> bool:
    """Whether a float32 product of ``rows`` rows runs on the kernel when lowered for a CPU."""
    return isinstance(rows, int) and rows <= MAX_F32_ROWS and in_use()


def uses_int8_matmul(rows: int) -> bool:
    """Whether a product of ``rows`` int8 rows runs on the kernel when lowered for a CPU."""
    return isinstance(rows, int) and rows <= MAX_ROWS and in_use()


def paged_attention(q, positions, k, v, page_table, k_scale=None, v_scale=None) -> jax.Array:
    """q [B, T, KVH, G, Hd] float32 at ``positions`` [B, T] through ``page_table`` [B, P] -> [B, T, KVH, G, Hd] float32
    by the kernel (CPU only; call :func:`status` first), over float32 pools k [KVH, N, Hd, ps] (keys transposed in
    their pages) and v [KVH, N, ps, Hd], or int8 pools k and v [KVH, N, ps, Hd] with their scales [KVH, N, ps]. A
    padding query (position -1) gives zeros."""
    out = jax.ShapeDtypeStruct(q.shape, jnp.float32)
    if k_scale is None:
        return jax.ffi.ffi_call("jaxlab_paged_attention", out)(q, positions, k, v, page_table)
    return jax.ffi.ffi_call("jaxlab_paged_attention_int8", out)(q, positions, k, v, k_scale, v_scale, page_table)


def contiguous_attention(q, positions, k, v, slot_pos, index) -> jax.Array:
    """q [B, T, KVH, G, Hd] float32 at ``positions`` [B, T] over a contiguous float32 cache layer (keys transposed, key
    layout "ds": k [B*KVH, Hd, S], v [B*KVH, S, Hd]; ``slot_pos`` [B, S] each slot's position, -1 empty or padding;
    ``index`` the slots written) -> [B, T, KVH, G, Hd] float32 by the kernel (CPU only; call :func:`status` first). A
    query at position p sees the slots holding positions 0..p; one that sees none gives zeros."""
    index = jnp.asarray(index, jnp.int32).reshape(())
    return jax.ffi.ffi_call("jaxlab_contiguous_attention", jax.ShapeDtypeStruct(q.shape, jnp.float32))(
        q, positions, k, v, slot_pos, index
    )


def on_cpu(kernel, xla):
    """``kernel(*arrays)`` where a program is lowered for a CPU and ``xla(*arrays)`` elsewhere
    (``jax.lax.platform_dependent``), with ``xla``'s rules under ``jax.vmap`` and differentiation: a kernel takes
    whole unbatched arrays and has no derivative, so a vmapped call runs ``jax.vmap(xla)`` and derivatives (forward
    and reverse) are ``xla``'s. ``kernel`` and ``xla`` compute the same function of the same positional arrays."""

    @custom_vmap
    def either(*args):
        return jax.lax.platform_dependent(*args, cpu=kernel, default=xla)

    @either.def_vmap
    def _batched(axis_size, in_batched, *args):
        return jax.vmap(xla, in_axes=tuple(0 if b else None for b in in_batched))(*args), True

    @jax.custom_jvp
    def call(*args):
        return either(*args)

    @call.defjvp
    def _derivative(args, tangents):
        return either(*args), jax.jvp(xla, args, tangents)[1]

    return call


def uses_contiguous_attention(head_dim: int) -> bool:
    """Whether attention over a float32 contiguous cache with heads of ``head_dim`` runs on the kernel when lowered
    for a CPU, for any number of queries: each query reads the written slots up to the last it sees, so a prefill's
    prompt costs about half of XLA's read of every slot (one layer, 128 queries over 256 slots 0.46 against 1.63 ms,
    512 over 1,024 3.6 against 24; NOTES 29)."""
    return head_dim <= MAX_HEAD_DIM and in_use()


def uses_paged_attention(queries: int, head_dim: int) -> bool:
    """Whether paged attention of ``queries`` queries a row and heads of ``head_dim`` runs on the kernel when
    lowered for a CPU (the pages' format and layout: the caller checks those)."""
    return isinstance(queries, int) and queries <= MAX_QUERIES and head_dim <= MAX_HEAD_DIM and in_use()
