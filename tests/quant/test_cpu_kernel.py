"""jaxlab's int8 CPU kernel (jaxlab.quant.cpu_kernel): built where the CPU can run it, the same integers as XLA's
dot for every int8 value and shape, in CPU programs only for a few rows, never in a program lowered for a TPU.

The model-level checks run through it without naming it: every int8 test of a one- or two-row step (the goldens,
`tests/engine/test_model.py::test_an_int8_decode_row_is_the_same_bits_alone_and_among_others`, the engine's batch
invariance) now compares the kernel's rows with XLA's GEMM rows of larger batches.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.quant import cpu_kernel
from jaxlab.quant.formats import quantize_matrix


def _needs_kernel():
    st = cpu_kernel.status()
    if not st.available:
        pytest.skip(f"jaxlab's int8 CPU kernel is not in use on this host: {st.reason}")
    return st


def test_the_kernel_is_in_use_where_the_cpu_and_a_compiler_allow():
    """On Linux x86-64 with AVX-512 BW/VL/VNNI and g++ (CI's machines and Colab's CPUs), the kernel must build and
    load; elsewhere its status must say what is missing."""
    import platform
    import shutil
    from pathlib import Path

    st = cpu_kernel.status()
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    can = (
        platform.system() == "Linux"
        and platform.machine() == "x86_64"
        and all(f" {f}" in flags for f in cpu_kernel.CPU_FLAGS)
        and (shutil.which("g++") or shutil.which("c++"))
    )
    if can:
        assert st.available, st.reason
        assert st.library and st.library.endswith(".so") and "<= 4 rows" in st.reason
    else:
        assert not st.available and ("lacks" in st.reason or "compiler" in st.reason or "Linux" in st.reason)


def test_turned_off_and_a_failed_build_say_so(monkeypatch, tmp_path):
    monkeypatch.setenv(cpu_kernel.ENV, "0")
    st = cpu_kernel.status.__wrapped__()
    assert not st.available and "JAXLAB_CPU_KERNEL=0" in st.reason
    with pytest.raises(RuntimeError, match="failed"):
        cpu_kernel.build("false", tmp_path / "lib.so")
    assert not (tmp_path / "lib.so").exists()
    if cpu_kernel.status().available:  # a damaged library in the cache is reported, not raised
        monkeypatch.setenv(cpu_kernel.ENV, "1")
        monkeypatch.setenv("JAXLAB_CACHE", str(tmp_path))
        cpu_kernel.library_path().parent.mkdir(parents=True)
        cpu_kernel.library_path().write_bytes(b"not a library")
        st = cpu_kernel.status.__wrapped__()
        assert not st.available and "delete it to rebuild" in st.reason


@pytest.mark.parametrize("rows", [1, 2, 3, 4])
def test_the_kernel_gives_xla_dots_integers_for_every_int8_value(rows):
    """-128 to 127 in both operands, inner sizes that are and are not a multiple of 64, output sizes that are and
    are not a multiple of the 4 columns read side by side, up to the model's head (49,152 rows)."""
    _needs_kernel()
    rng = np.random.default_rng(rows)
    kernel = jax.jit(cpu_kernel.int8_matmul)
    xla = jax.jit(lambda x, w: jax.lax.dot_general(x, w, (((1,), (1,)), ((), ())), preferred_element_type=jnp.int32))
    for k, n in [(1, 1), (63, 5), (64, 4), (65, 37), (576, 576), (1536, 600), (576, 49152)]:
        x = rng.integers(-128, 128, (rows, k), dtype=np.int8)
        w = rng.integers(-128, 128, (n, k), dtype=np.int8)
        x[0, 0], w[-1, -1] = -128, -128  # the value whose sign the unsigned x signed instruction cannot flip
        np.testing.assert_array_equal(np.asarray(kernel(x, w)), np.asarray(xla(x, w)), err_msg=f"{rows}x{k} . {n}x{k}")


def test_cpu_programs_hold_the_kernel_for_few_rows_and_tpu_programs_never():
    _needs_kernel()
    w = quantize_matrix(np.random.default_rng(0).standard_normal((64, 128)).astype(np.float32), "int8")
    f = jax.jit(lambda m, x: m.dot(x))
    for rows, expect in [(1, True), (2, True), (3, False), (8, False)]:  # activation rows are split in two: <= 4
        x = jnp.ones((rows, 128), jnp.float32)
        assert (cpu_kernel.TARGET in f.lower(w, x).as_text()) == expect, rows
        tpu = f.trace(w, x).lower(lowering_platforms=("tpu",)).as_text()
        assert "custom_call" not in tpu, rows
    x = jnp.asarray(np.random.default_rng(1).standard_normal((2, 128)), jnp.float32)
    y, ref = np.asarray(f(w, x), np.float64), np.asarray(x @ w.dequantize().T, np.float64)
    assert np.abs(y - ref).max() / np.abs(ref).max() < 1e-4  # the bound of tests/quant/test_quant.py's int8 dot


def test_calls_from_several_threads_at_once_each_get_their_own_product():
    """Programs of several CPU devices (or threads) may call the kernel at the same moment: each call is its own."""
    from concurrent.futures import ThreadPoolExecutor

    _needs_kernel()
    rng = np.random.default_rng(7)
    kernel = jax.jit(cpu_kernel.int8_matmul)
    cases = [
        (rng.integers(-128, 128, (2, 576), dtype=np.int8), rng.integers(-128, 128, (1536, 576), dtype=np.int8))
        for _ in range(6)
    ]
    want = [x.astype(np.int32) @ w.astype(np.int32).T for x, w in cases]
    with ThreadPoolExecutor(6) as pool:
        for _ in range(5):
            got = list(pool.map(lambda c: np.asarray(kernel(*c)), cases))
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g, w)
