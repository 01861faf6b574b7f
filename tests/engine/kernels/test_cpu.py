"""jaxlab's CPU kernels (jaxlab.engine.kernels.cpu): built where the CPU can run them; the int8 product gives the
same integers as XLA's dot for every int8 value and shape, the float32 product XLA's within float32 rounding, paged
and contiguous attention what XLA's reads give within float32 rounding, and each row the same bits alone or among
others; in CPU programs only for a few rows or queries, never in a program lowered for a TPU, nor under vmap or
differentiation.

The model-level checks run through them without naming them: every int8 test of a one- or two-row step (the goldens,
`tests/engine/test_model.py::test_an_int8_decode_row_is_the_same_bits_alone_and_among_others`, the engine's batch
invariance) compares the int8 kernel's rows with XLA's GEMM rows of larger batches; every float32 decode step of the
engine (`tests/engine/test_continuous.py`, `tests/engine/test_paged.py`'s key layout "ds") reads its pages through
the attention kernel; and every float32 decode step of the `Generator` (its goldens and greedy parity with the
reference, the speculative decoder's identical tokens) runs its linear layers and its contiguous cache's attention
on the kernels.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.engine.kernels import cpu as cpu_kernel
from jaxlab.engine.kvcache import quantize_kv
from jaxlab.engine.model import default_policy
from jaxlab.engine.paged import PagedLayer, read_pages
from jaxlab.quant.formats import quantize_matrix


def _needs_kernel():
    st = cpu_kernel.status()
    if not st.available:
        pytest.skip(f"jaxlab's CPU kernels are not in use on this host: {st.reason}")
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
        assert st.library and st.library.endswith(".so") and "<= 4 rows" in st.reason and "<= 8 queries" in st.reason
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


@pytest.mark.parametrize("rows", [1, 2])
def test_the_split_product_is_xlas_split_and_dot_bit_for_bit(rows):
    """int8 weight-only rows: the kernel's split of float32 activations into hi and lo int8 rows, and their scales,
    are quant.formats.split_activations' as XLA:CPU computes it (same bits), and the products XLA's dot of those
    rows: zero rows, rows of one large value, tiny and subnormal values, inner sizes around the 16 floats of a
    vector, up to the head's 49,152 outputs."""
    from jaxlab.quant import formats

    _needs_kernel()
    rng = np.random.default_rng(10 + rows)
    kernel = jax.jit(cpu_kernel.int8_split_matmul)

    @jax.jit
    def xla(x, w):
        rows, s = formats.split_activations(x)
        return jax.lax.dot_general(rows, w, (((1,), (1,)), ((), ())), preferred_element_type=jnp.int32), s

    # a long row: x / s divided (not multiplied by 1 / s, as XLA does) moves about one lo value in 7,000
    for k, n in [(1, 1), (15, 3), (16, 16), (17, 33), (576, 576), (1536, 600), (576, 49152), (200_003, 2)]:
        w = rng.integers(-128, 128, (n, k), dtype=np.int8)
        for case in ("normal", "zero", "spike", "tiny"):
            x = (rng.standard_normal((rows, k)) * rng.uniform(0.01, 100, (rows, 1))).astype(np.float32)
            if case == "zero":
                x[0] = 0
            elif case == "spike":
                x[-1, k // 2] = 3e4
            elif case == "tiny":
                x[0] *= np.float32(1e-39)
            want_acc, want_s = xla(x, w)
            acc, s = kernel(x, w)
            where = f"{rows}x{k} . {n}x{k}, {case}"
            np.testing.assert_array_equal(
                np.asarray(s).view(np.int32), np.asarray(want_s).view(np.int32), err_msg=where
            )
            np.testing.assert_array_equal(np.asarray(acc), np.asarray(want_acc), err_msg=where)


def test_an_int8_row_is_the_same_bits_on_the_kernel_as_among_xlas_rows_whatever_follows():
    """The join and the scaling stay in XLA's program (quant.formats): there XLA:CPU fuses the last product
    with a residual add or the rotary embedding into one multiply-add at every row count. A row on the kernel (1
    row) must give the bits of the same row among XLA's (3 rows), followed by each."""
    _needs_kernel()
    rng = np.random.default_rng(3)
    k, n = 576, 576
    m = quantize_matrix((rng.standard_normal((n, k)) * 0.05).astype(np.float32), "int8")
    x, h = (jnp.asarray(rng.standard_normal((3, d)), jnp.float32) for d in (k, n))
    angle = jnp.asarray(rng.uniform(0, 3, (3, n)), jnp.float32)

    def rotary(y, a):
        return y * jnp.cos(a) + jnp.concatenate([-y[:, n // 2 :], y[:, : n // 2]], -1) * jnp.sin(a)

    follows = {
        "nothing": lambda y, h, a: y,
        "residual add": lambda y, h, a: h + y,
        "rotary": lambda y, h, a: rotary(y, a),
    }
    for name, then in follows.items():
        f = jax.jit(lambda x, h, a, then=then: then(m.dot(x), h, a))
        assert "jaxlab_int8_split_matmul" in f.lower(x[:1], h[:1], angle[:1]).as_text()
        one, among = np.asarray(f(x[:1], h[:1], angle[:1])), np.asarray(f(x, h, angle))[:1]
        np.testing.assert_array_equal(one, among, err_msg=name)


def test_cpu_programs_hold_the_kernel_for_few_rows_and_tpu_programs_never():
    _needs_kernel()
    rng = np.random.default_rng(0)
    w = quantize_matrix(rng.standard_normal((64, 128)).astype(np.float32), "int8")
    w8a8 = quantize_matrix(rng.standard_normal((64, 128)).astype(np.float32), "w8a8")
    f = jax.jit(lambda m, x: m.dot(x))
    for rows, expect in [(1, True), (2, True), (3, False), (8, False)]:  # activation rows are split in two: <= 4
        x = jnp.ones((rows, 128), jnp.float32)
        assert ("jaxlab_int8_split_matmul" in f.lower(w, x).as_text()) == expect, rows
        assert ("jaxlab_int8_matmul" in f.lower(w8a8, x).as_text()) == (rows <= 4), rows  # w8a8: unsplit rows
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


def _paged_case(rng, b, t, kvh, g, hd, ps, width, pool, pages="float32"):
    """Random pools as the engine keeps them on a CPU (float32 with each page's keys transposed, or int8 with their
    scales), a random page table and positions: (q, positions, layer); row 0's first query sees every position, row
    1's (if any) is padding."""
    k = jnp.asarray(rng.standard_normal((kvh, pool, ps, hd)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((kvh, pool, ps, hd)), jnp.float32)
    table = jnp.asarray(rng.integers(1, pool, (b, width // ps)), jnp.int32)
    q = jnp.asarray(rng.standard_normal((b, t, kvh, g, hd)), jnp.float32)
    pos = rng.integers(0, width, (b, t)).astype(np.int32)
    pos[0, 0] = width - 1
    if b > 1:
        pos[1, 0] = -1
    if pages == "int8":
        (k8, ks), (v8, vs) = quantize_kv(k, axis=3), quantize_kv(v, axis=3)
        return q, jnp.asarray(pos), PagedLayer(k8, v8, table, ks, vs, key_layout="sd")
    return q, jnp.asarray(pos), PagedLayer(k.transpose(0, 1, 3, 2), v, table, key_layout="ds")


def _xla_attention(q, pos, layer):
    return read_pages(q, layer, pos, default_policy().matmul)  # the model's float32 matmul


def _dequantized(layer):
    """int8 pages as the float32 vectors they stand for (key layout "sd")."""
    k, v = (
        layer.k.astype(jnp.float32) * layer.k_scale[..., None],
        layer.v.astype(jnp.float32) * layer.v_scale[..., None],
    )
    return PagedLayer(k, v, layer.page_table, key_layout="sd")


def _kernel(q, pos, layer):
    scales = () if layer.k_scale is None else (layer.k_scale, layer.v_scale)
    return cpu_kernel.paged_attention(q, pos, layer.k, layer.v, layer.page_table, *scales)


@pytest.mark.parametrize("pages", ["float32", "int8"])
@pytest.mark.parametrize(
    "b, t, kvh, g, hd, ps, width",
    [
        (3, 1, 2, 3, 10, 1, 32),  # the tiny model's heads, one position a page
        (3, 2, 2, 3, 10, 4, 32),  # two queries a row, pages of 4: masked lanes
        (2, 5, 1, 5, 16, 16, 64),  # a speculative step's five queries, five heads a kv head
        (4, 1, 3, 3, 64, 16, 256),  # SmolLM2's heads
        (1, 1, 2, 2, 128, 32, 96),  # the widest head, pages of 32
    ],
)
def test_paged_attention_is_xlas_read_through_the_pages(b, t, kvh, g, hd, ps, width, pages):
    """Every visible query within float32 rounding of read_pages over the same vectors (int8 pages: dequantized, and
    within the ~15-bit rounding of XLA's int8 path of that path itself); a padding query (position -1) gives zeros."""
    _needs_kernel()
    rng = np.random.default_rng(hd + ps)
    q, pos, layer = _paged_case(rng, b, t, kvh, g, hd, ps, width, pool=3 * b * width // ps, pages=pages)
    got = np.asarray(jax.jit(_kernel)(q, pos, layer))
    exact = layer if pages == "float32" else _dequantized(layer)
    want = np.asarray(jax.jit(_xla_attention)(q, pos, exact)).reshape(got.shape)
    seen = np.asarray(pos) >= 0
    np.testing.assert_allclose(got[seen], want[seen], atol=2e-6, rtol=0)
    assert not got[~seen].any()
    if pages == "int8":
        xla8 = np.asarray(jax.jit(_xla_attention)(q, pos, layer)).reshape(got.shape)
        np.testing.assert_allclose(got[seen], xla8[seen], atol=2e-4, rtol=0)


@pytest.mark.parametrize("pages", ["float32", "int8"])
def test_a_rows_paged_attention_is_the_same_bits_alone_and_among_others(pages):
    """Batch invariance: row r's output is the same bits in batches of 1, 5 and 32 rows (few rows split each kv
    head's query heads over the threads, many give a thread whole kv heads), whatever the other rows hold."""
    _needs_kernel()
    q, pos, layer = _paged_case(np.random.default_rng(3), 32, 1, 3, 3, 64, 16, 512, pool=600, pages=pages)
    kernel = jax.jit(_kernel)
    full = np.asarray(kernel(q, pos, layer))
    for rows in ([0], [5], [0, 7, 9, 20, 31]):
        rows = np.asarray(rows)
        part = np.asarray(kernel(q[rows], pos[rows], dataclasses.replace(layer, page_table=layer.page_table[rows])))
        np.testing.assert_array_equal(part, full[rows])


def test_cpu_programs_read_pages_on_the_kernel_for_few_queries_only():
    """The engine's decode steps (<= 8 queries a row, over float32 pages with keys transposed or int8 pages) hold the
    kernel; a prefill chunk's many queries, float32 pages in the Pallas kernels' key layout and a program lowered for
    a TPU keep XLA's."""
    _needs_kernel()
    pol = default_policy()
    rng = np.random.default_rng(0)
    f = jax.jit(lambda q, pos, layer: layer.attend(q, pos, pol))
    cases = [(1, "float32", True), (8, "float32", True), (9, "float32", False), (1, "int8", True), (9, "int8", False)]
    for t, pages, expect in cases + [(1, "sd", False)]:
        q, pos, layer = _paged_case(rng, 2, t, 2, 3, 10, 4, 16, pool=20, pages="float32" if pages == "sd" else pages)
        if pages == "sd":
            layer = PagedLayer(layer.k.transpose(0, 1, 3, 2), layer.v, layer.page_table, key_layout="sd")
        assert ("jaxlab_paged_attention" in f.lower(q, pos, layer).as_text()) == expect, (t, pages)
        tpu = f.trace(q, pos, layer).lower(lowering_platforms=("tpu",)).as_text()
        assert "jaxlab_paged_attention" not in tpu


def _f32(rng, *shape):
    return jnp.asarray(rng.standard_normal(shape), jnp.float32)


def _xla_f32(x, w):
    return default_policy().matmul("ri,io->ro", x, w)  # the model's float32 matmul


@pytest.mark.parametrize(
    "k, n", [(1, 1), (5, 17), (9, 33), (130, 600), (576, 576), (576, 192), (576, 1536), (1536, 576)]
)
def test_the_f32_product_is_xlas_within_rounding_and_a_row_the_same_bits_at_every_row_count(k, n):
    """Inner sizes below, at and across the kernel's 128-row k blocks and its two halves, output sizes that are and are
    not a multiple of 16 columns (masked lanes), the model's shapes; rows 1 to 40 (the streamed 1-8 and the tiles'
    heights and remainders), a row taken alone or among others in another order gives the same bits; one row is the
    sum of XLA's matrix-vector products of k's two halves at the model's shapes (NOTES 28, 29: each one multiply-add
    chain over k in order)."""
    _needs_kernel()
    rng = np.random.default_rng(k + n)
    x, w = _f32(rng, 40, k), _f32(rng, k, n)
    kernel, xla = jax.jit(cpu_kernel.f32_matmul), jax.jit(_xla_f32)
    full, want = np.asarray(kernel(x, w)), np.asarray(xla(x, w))
    assert np.abs(full - want).max() <= 1e-6 * np.abs(want).max() * np.sqrt(k)
    for rows in ([0], [1, 0], [2, 0, 1], [3, 1, 2, 0], [39, 4, 12, 7, 0], list(range(9)), list(range(17, 40))):
        np.testing.assert_array_equal(np.asarray(kernel(x[np.asarray(rows)], w)), full[rows], err_msg=str(rows))
    if k >= 576:
        h = k // 2 // 4 * 4  # where the kernel's second chain starts (f32_matmul.cc, Half)
        np.testing.assert_array_equal(full[:1], np.asarray(xla(x[:1, :h], w[:h]) + xla(x[:1, h:], w[h:])))


def test_cpu_programs_hold_the_f32_product_for_a_decode_steps_rows_only():
    """A linear layer of <= 64 float32 rows lowered for the CPU holds the kernel; more rows, bfloat16, a quantized
    kernel and a program lowered for a TPU keep XLA's dot."""
    from jaxlab.engine.model import dense

    _needs_kernel()
    w = _f32(np.random.default_rng(0), 32, 48)
    f = jax.jit(lambda x, w, pol: dense(x, w, pol), static_argnums=2)
    f32, bf16 = default_policy(), default_policy("bfloat16")
    for shape, pol, expect in [((1, 1, 32), f32, True), ((8, 8, 32), f32, True), ((65, 32), f32, False)]:
        x = jnp.ones(shape, jnp.float32)
        assert ("jaxlab_f32_matmul" in f.lower(x, w, pol).as_text()) == expect, shape
        assert "custom_call" not in f.trace(x, w, pol).lower(lowering_platforms=("tpu",)).as_text()
    x = jnp.ones((2, 32), jnp.float32)
    assert "jaxlab_f32_matmul" not in f.lower(x, w.astype(jnp.bfloat16), bf16).as_text()
    w8 = quantize_matrix(np.asarray(w).T.copy(), "int8")
    assert "jaxlab_f32_matmul" not in f.lower(x, w8, f32).as_text()


def test_vmap_and_grad_through_a_kernel_are_xlas():
    """A kernel takes whole arrays and has no derivative: under ``jax.vmap`` the call is XLA's, vmapped, and its
    gradient is XLA's (the same bits, for a loss whose gradient does not read the forward's values)."""
    from jaxlab.engine.model import dense

    _needs_kernel()
    rng = np.random.default_rng(1)
    pol = default_policy()
    x, w = _f32(rng, 3, 2, 16), _f32(rng, 16, 24)
    ours = jax.jit(jax.vmap(lambda x: dense(x, w, pol)))
    np.testing.assert_array_equal(np.asarray(ours(x)), np.asarray(jax.jit(jax.vmap(lambda x: _xla_f32(x, w)))(x)))
    assert "jaxlab_f32_matmul" not in ours.lower(x).as_text()
    # a loss linear in the product: its gradient reads no forward value (the kernel's forward sums in another order)
    c = _f32(rng, 2, 24)
    loss = jax.jit(jax.grad(lambda x, w: jnp.sum(c * dense(x, w, pol)), argnums=(0, 1)))
    ref = jax.jit(jax.grad(lambda x, w: jnp.sum(c * _xla_f32(x.reshape(-1, 16), w)), argnums=(0, 1)))
    for a, b in zip(loss(x[0], w), ref(x[0], w)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _contiguous_case(rng, b, t, kvh, g, hd, s, written):
    """A float32 contiguous layer as the Generator keeps it on a CPU (key layout "ds"), left-padded rows (row r's
    first r % 3 slots are padding), ``written`` slots written; queries at the last positions of each row, row 1's
    (if any) first query a padding one (position -1)."""
    from jaxlab.engine.kvcache import KVLayer

    k, v = _f32(rng, b * kvh, hd, s), _f32(rng, b * kvh, s, hd)
    slot_pos = np.full((b, s), -1, np.int32)
    for r in range(b):
        slot_pos[r, r % 3 : written] = np.arange(written - r % 3)
    last = slot_pos[:, written - 1]
    pos = (last[:, None] - t + 1 + np.arange(t)).astype(np.int32)
    if b > 1:
        pos[1, 0] = -1
    return _f32(rng, b, t, kvh, g, hd), jnp.asarray(pos), KVLayer(k, v, jnp.asarray(slot_pos), written, key_layout="ds")


def _contiguous_kernel(q, pos, layer):
    return cpu_kernel.contiguous_attention(q, pos, layer.k, layer.v, layer.pos, layer.index)


@pytest.mark.parametrize(
    "b, t, kvh, g, hd, s, written",
    [
        (3, 1, 2, 3, 10, 32, 20),  # the tiny model's heads, slots left unwritten
        (3, 2, 2, 3, 10, 37, 37),  # two queries a row, slots not a multiple of 16, all written
        (2, 5, 1, 5, 16, 64, 50),  # a speculative step's five queries
        (4, 1, 3, 3, 64, 256, 192),  # SmolLM2's heads, the bench's context
        (1, 1, 2, 2, 128, 96, 17),  # the widest head
        (2, 24, 2, 3, 16, 64, 40),  # a prompt's last 24 positions: each query sees the slots up to its own
        (1, 48, 3, 3, 64, 64, 48),  # a whole prompt's prefill, SmolLM2's heads
    ],
)
def test_contiguous_attention_is_xlas_read_of_the_slots(b, t, kvh, g, hd, s, written):
    """Every visible query within float32 rounding of XLA's read (:func:`~jaxlab.engine.kvcache.read_slots`), the
    padding slots and the unwritten ones masked; a padding query gives zeros."""
    from jaxlab.engine.kvcache import read_slots

    _needs_kernel()
    q, pos, layer = _contiguous_case(np.random.default_rng(hd + s), b, t, kvh, g, hd, s, written)
    got = np.asarray(jax.jit(_contiguous_kernel)(q, pos, layer))
    want = np.asarray(jax.jit(lambda q, p, lay: read_slots(q, p, lay, default_policy()))(q, pos, layer))
    want = want.reshape(got.shape)
    seen = np.asarray(pos) >= 0
    np.testing.assert_allclose(got[seen], want[seen], atol=2e-6, rtol=0)
    assert not got[~seen].any()


def test_a_rows_contiguous_attention_is_the_same_bits_alone_and_among_others():
    _needs_kernel()
    q, pos, layer = _contiguous_case(np.random.default_rng(5), 32, 1, 3, 3, 64, 256, 200)
    kernel = jax.jit(_contiguous_kernel)
    full = np.asarray(kernel(q, pos, layer))
    kvh = 3
    for rows in ([0], [5], [0, 7, 9, 20, 31]):
        heads = np.asarray([r * kvh + h for r in rows for h in range(kvh)])
        rows = np.asarray(rows)
        part = dataclasses.replace(layer, k=layer.k[heads], v=layer.v[heads], pos=layer.pos[rows])
        np.testing.assert_array_equal(np.asarray(kernel(q[rows], pos[rows], part)), full[rows])


def test_cpu_programs_read_the_contiguous_cache_on_the_kernel_for_any_queries():
    """A float32 "ds" layer's decode steps and prefills (1 to 64 queries a row) hold the kernel; the Pallas kernels'
    layout "sd", an int8 layer, ``jax.vmap`` and a program lowered for a TPU keep XLA's read."""
    from jaxlab.engine.kvcache import init_cache, read_slots
    from jaxlab.io.config import tiny

    _needs_kernel()
    pol = default_policy()
    rng = np.random.default_rng(0)
    f = jax.jit(lambda q, pos, layer: layer.attend(q, pos, pol))
    for t in (1, 8, 9, 64):
        q, pos, layer = _contiguous_case(rng, 2, t, 2, 3, 10, 80, 70)
        assert "jaxlab_contiguous_attention" in f.lower(q, pos, layer).as_text(), t
        assert "custom_call" not in f.trace(q, pos, layer).lower(lowering_platforms=("tpu",)).as_text()
    cfg = tiny()
    q, pos, _ = _contiguous_case(rng, 2, 1, cfg.n_kv_heads, cfg.n_heads // cfg.n_kv_heads, cfg.head_dim, 32, 20)
    for kw in (dict(key_layout="ds"), dict(key_layout="sd"), dict(key_layout="ds", dtype="int8")):
        layer = init_cache(cfg, 2, 32, **kw).layer(0)
        want = kw == dict(key_layout="ds")
        assert ("jaxlab_contiguous_attention" in f.lower(q, pos, layer).as_text()) == want, kw
    q, pos, layer = _contiguous_case(rng, 1, 1, 2, 3, 10, 32, 20)  # one row's layer, three rows' queries vmapped
    qs, ps = jnp.stack([q, q, q]), jnp.stack([pos, pos, pos])
    vm = jax.jit(jax.vmap(lambda q, p: layer.attend(q, p, pol)))
    assert "jaxlab_contiguous_attention" not in vm.lower(qs, ps).as_text()
    np.testing.assert_allclose(np.asarray(vm(qs, ps))[1], np.asarray(read_slots(q, pos, layer, pol)), atol=1e-6)


@pytest.mark.parametrize("n, chunks", [(1, 1), (1000, 7), (64 * 1024 + 5, 64)])
def test_read_sum_reads_every_element_once(n, chunks):
    """The bench's read-bandwidth ceiling reads each element exactly once, in chunks (sums within float32 rounding of
    numpy's, each chunk its own sum)."""
    _needs_kernel()
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    got = np.asarray(jax.jit(lambda x: cpu_kernel.read_sum(x, chunks))(jnp.asarray(x)))
    per = -(-n // chunks)
    want = [x[c * per : (c + 1) * per].astype(np.float64).sum() for c in range(chunks)]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
