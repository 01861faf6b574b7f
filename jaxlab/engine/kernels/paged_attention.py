"""Ragged paged attention in Pallas: each sequence reads its own pages, as far as its own length.

Layout, the engine's paged cache (:mod:`jaxlab.engine.paged`): pages k, v [KVH, num_pages, page_size, D] in
one pool, ``page_table`` [B, pages_per_row] int32. Queries q [B, KVH, Q, D] (the ``G`` query heads of a KV
head over a row's T new tokens: Q = G x T; decode has T = 1) at positions q_pos [B, Q]. A query at position
``p`` sees its row's keys at positions ``0..p``: page ``j`` of row ``b`` holds positions
``j * page_size ..``. "Ragged": row ``b`` reads only its first ``n_pages[b] = max(q_pos[b]) // page_size + 1``
pages, whatever the table's width — a short sequence beside a long one costs only its own pages.

Two variants of one idea:

* **TPU**: grid (B, KVH, pages_per_row), the page axis innermost and sequential. The page table and the
  page counts are *scalar-prefetched* into SMEM, so the key/value ``BlockSpec`` index maps read
  ``page_table[b, j]`` and the pipeline DMAs exactly that page from HBM to VMEM. Pages past the row's count
  map to its last page (the pipeline skips a copy whose block did not change) and the body skips them.
  The running max, sum and output live in VMEM scratch across the page axis.
* **GPU** (Triton): grid (B, KVH), the pool left in HBM as whole arrays, and a loop over the row's pages
  inside the kernel that loads page ``page_table[b, j]`` itself. Q is padded to a power of two (9 query heads
  over 3 KV heads give Q = 3 at decode: padded to 16, the smallest dot Triton takes).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from jaxlab.engine.kernels.common import (
    MIN_DOT,
    check_variant,
    compiler_params,
    finish,
    matmul_precision,
    next_pow2,
    online_update,
    variant_for,
)


def _visible(qp, j, page_size: int, shape):
    kp = j * page_size + jax.lax.broadcasted_iota(jnp.int32, shape, 1)  # the keys' positions [Q, ps]
    return (kp <= qp) & (qp >= 0)


def paged_kernel_tpu(
    table_ref,
    count_ref,
    q_ref,
    qpos_ref,
    k_ref,
    v_ref,
    o_ref,
    m_sc,
    l_sc,
    acc_sc,
    *,
    page_size,
    scale,
    dtype,
    precision,
):
    b, j = pl.program_id(0), pl.program_id(2)

    @pl.when(j == 0)
    def _():
        m_sc[...] = jnp.full(m_sc.shape, -1e30, jnp.float32)
        l_sc[...] = jnp.zeros(l_sc.shape, jnp.float32)
        acc_sc[...] = jnp.zeros(acc_sc.shape, jnp.float32)

    @pl.when(j < count_ref[b])
    def _():
        qp = qpos_ref[...]  # [Q, 1]
        visible = _visible(qp, j, page_size, (qp.shape[0], page_size))
        m, total, acc = online_update(
            m_sc[...],
            l_sc[...],
            acc_sc[...],
            q_ref[...],
            k_ref[...],
            v_ref[...],
            visible,
            scale=scale,
            dtype=dtype,
            precision=precision,
        )
        m_sc[...], l_sc[...], acc_sc[...] = m, total, acc

    @pl.when(j == pl.num_programs(2) - 1)
    def _():
        o_ref[...] = finish(l_sc[...], acc_sc[...]).astype(o_ref.dtype)


def paged_kernel_gpu(table_ref, count_ref, q_ref, qpos_ref, k_ref, v_ref, o_ref, *, page_size, scale, dtype, precision):
    b, h = pl.program_id(0), pl.program_id(1)
    q = q_ref[...]  # [Q, D]
    qp = qpos_ref[...]  # [Q, 1]

    def body(j, carry):
        page = table_ref[b, j]
        k, v = k_ref[h, page], v_ref[h, page]  # [ps, D]: one page, loaded from HBM
        visible = _visible(qp, j, page_size, (q.shape[0], page_size))
        return online_update(*carry, q, k, v, visible, scale=scale, dtype=dtype, precision=precision)

    rows, d = q.shape
    init = (
        jnp.full((rows, 1), -1e30, jnp.float32),
        jnp.zeros((rows, 1), jnp.float32),
        jnp.zeros((rows, d), jnp.float32),
    )
    _, total, acc = jax.lax.fori_loop(0, count_ref[b], body, init)
    o_ref[...] = finish(total, acc).astype(o_ref.dtype)


def page_counts(q_pos, page_size: int, pages_per_row: int):
    """[B] int32: the pages each row reads, max(q_pos[b]) // page_size + 1 (0 for an idle row)."""
    top = q_pos.max(axis=1)
    return jnp.where(top >= 0, jnp.minimum(top // page_size + 1, pages_per_row), 0).astype(jnp.int32)


def paged_attention(
    q, k_pages, v_pages, page_table, q_pos, *, dtype=None, precision=None, variant: str | None = None, interpret=None
):
    """q [B, KVH, Q, D] at q_pos [B, Q] over the pages -> [B, KVH, Q, D] float32 (zeros for a query at -1)."""
    b, kvh, q_len, d = q.shape
    page_size = k_pages.shape[2]
    pages_per_row = page_table.shape[1]
    if k_pages.dtype == jnp.int8:
        raise ValueError("the Pallas paged kernel reads float pages; int8 pages run with the xla attention")
    auto_variant, auto_interpret = variant_for()
    variant = check_variant(variant or auto_variant)
    interpret = auto_interpret if interpret is None else interpret
    dtype = dtype or q.dtype
    precision = matmul_precision(dtype, precision)
    q_pos = q_pos.astype(jnp.int32)
    counts = page_counts(q_pos, page_size, pages_per_row)
    table = page_table.astype(jnp.int32)
    opts = dict(page_size=page_size, scale=d**-0.5, dtype=dtype, precision=precision)
    if variant == "gpu":  # Triton wants power-of-two value shapes
        rows = max(MIN_DOT, next_pow2(q_len))
        q = jnp.pad(q, ((0, 0), (0, 0), (0, rows - q_len), (0, 0)))
        q_pos = jnp.pad(q_pos, ((0, 0), (0, rows - q_len)), constant_values=-1)
        qspec = pl.BlockSpec((None, None, rows, d), lambda i, h: (i, h, 0, 0))
        out = pl.pallas_call(
            functools.partial(paged_kernel_gpu, **opts),
            grid=(b, kvh),
            in_specs=[
                pl.no_block_spec,
                pl.no_block_spec,
                qspec,
                pl.BlockSpec((None, rows, 1), lambda i, h: (i, 0, 0)),
                pl.no_block_spec,
                pl.no_block_spec,
            ],
            out_specs=qspec,
            out_shape=jax.ShapeDtypeStruct((b, kvh, rows, d), jnp.float32),
            interpret=interpret,
            compiler_params=compiler_params(variant),
        )(table, counts, q, q_pos[:, :, None], k_pages, v_pages)
        return out[:, :, :q_len]

    def page_map(i, h, j, table_ref, count_ref):  # past the row's last page: stay on it (no new copy)
        last = jnp.maximum(count_ref[i] - 1, 0)
        return (h, table_ref[i, jnp.minimum(j, last)], 0, 0)

    qspec = pl.BlockSpec((None, None, q_len, d), lambda i, h, j, *_: (i, h, 0, 0))
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=2,
        grid=(b, kvh, pages_per_row),
        in_specs=[
            qspec,
            pl.BlockSpec((None, q_len, 1), lambda i, h, j, *_: (i, 0, 0)),
            pl.BlockSpec((None, None, page_size, d), page_map),
            pl.BlockSpec((None, None, page_size, d), page_map),
        ],
        out_specs=qspec,
        scratch_shapes=[
            pltpu.VMEM((q_len, 1), jnp.float32),
            pltpu.VMEM((q_len, 1), jnp.float32),
            pltpu.VMEM((q_len, d), jnp.float32),
        ],
    )
    return pl.pallas_call(
        functools.partial(paged_kernel_tpu, **opts),
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct((b, kvh, q_len, d), jnp.float32),
        interpret=interpret,
    )(table, counts, q, q_pos[:, :, None], k_pages, v_pages)
