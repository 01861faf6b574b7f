"""Flash attention in Pallas: the scores never exist as a whole [Q, S] matrix.

Layout, as the model's contiguous cache holds it: ``N`` = batch x KV heads independent problems; q [N, Q, D]
(the ``G`` query heads of a KV head stacked over the T tokens: Q = G x T), k [N, S, D], v [N, S, D] or
[N, D, S] (``v_transposed``: the cache's value layout), and integer positions q_pos [N, Q], k_pos [N, S].
A query at position ``p`` sees the keys at positions ``0..p``; position -1 is padding (left padding, an
empty cache slot). So causal masking, padding and a cache are all one rule, the model's.

Grid: (N, Q / block_q). Grid point (n, i) takes block ``i`` of the queries and loops over key blocks of
``block_k`` inside the kernel with :func:`~jaxlab.engine.kernels.common.online_update` — only from the first
to the last key block any of its queries can see (``bounds``, computed before the kernel), so causal
prefill skips the blocks above the diagonal and left padding. The loop runs inside the kernel on both
chips: a GPU runs grid points at once, so a reduction over the grid is not available there.

On a TPU the bounds are scalar-prefetched into SMEM; on a GPU they are an ordinary input read one scalar at
a time. Block shapes are powers of two (Triton's rule; at least 16, its smallest dot) and the rows are padded
to a whole number of blocks.
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

BLOCK_Q = 64
BLOCK_K = 128


def flash_kernel(
    bounds_ref, q_ref, k_ref, v_ref, qpos_ref, kpos_ref, o_ref, *, block_k, scale, dtype, precision, v_transposed
):
    n, i = pl.program_id(0), pl.program_id(1)
    lo, hi = bounds_ref[n, 2 * i], bounds_ref[n, 2 * i + 1]  # the key blocks these queries can see
    q = q_ref[...]  # [bq, D]
    qp = qpos_ref[...]  # [bq, 1]

    def body(j, carry):
        start = pl.multiple_of(j * block_k, block_k)
        k = k_ref[pl.ds(start, block_k), :]  # [bk, D]
        v = v_ref[:, pl.ds(start, block_k)] if v_transposed else v_ref[pl.ds(start, block_k), :]
        kp = kpos_ref[:, pl.ds(start, block_k)]  # [1, bk]
        visible = (kp >= 0) & (kp <= qp)  # [bq, bk]
        return online_update(
            *carry, q, k, v, visible, scale=scale, dtype=dtype, precision=precision, v_transposed=v_transposed
        )

    bq, d = q.shape
    init = (jnp.full((bq, 1), -1e30, jnp.float32), jnp.zeros((bq, 1), jnp.float32), jnp.zeros((bq, d), jnp.float32))
    _, total, acc = jax.lax.fori_loop(lo, hi, body, init)
    o_ref[...] = finish(total, acc).astype(o_ref.dtype)


def key_block_bounds(q_pos, k_pos, block_q: int, block_k: int):
    """[N, 2 x query blocks] int32: for each block of queries, the first key block and one past the last
    that hold a key any of them sees (0, 0 when none does: an all-padding block)."""
    n, qp = q_pos.shape
    s = k_pos.shape[1]
    qmax = q_pos.reshape(n, qp // block_q, block_q).max(axis=2)  # [N, nq]
    seen = (k_pos[:, None, :] >= 0) & (k_pos[:, None, :] <= qmax[:, :, None])  # [N, nq, S]
    idx = jnp.arange(s)
    first = jnp.min(jnp.where(seen, idx, s), axis=2)
    last = jnp.max(jnp.where(seen, idx, -1), axis=2)
    lo = jnp.where(last >= 0, first // block_k, 0)
    hi = jnp.where(last >= 0, last // block_k + 1, 0)
    return jnp.stack([lo, hi], axis=2).reshape(n, -1).astype(jnp.int32)


def _pad(x, axis: int, size: int, value=0):
    extra = size - x.shape[axis]
    if not extra:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths, constant_values=value)


def flash_attention(
    q,
    k,
    v,
    q_pos,
    k_pos,
    *,
    v_transposed: bool = False,
    dtype=None,
    precision=None,
    block_q: int = BLOCK_Q,
    block_k: int = BLOCK_K,
    variant: str | None = None,
    interpret=None,
):
    """Attention of q [N, Q, D] at q_pos [N, Q] over k, v [N, S, D] (v [N, D, S] with ``v_transposed``) at
    k_pos [N, S] -> [N, Q, D] float32. ``dtype``/``precision``: the matmuls' inputs and precision (the model's
    policy; default q's dtype, highest). A query that sees no key (padding) gets zeros."""
    n, q_len, d = q.shape
    s = k.shape[1]
    auto_variant, auto_interpret = variant_for()
    variant = check_variant(variant or auto_variant)
    interpret = auto_interpret if interpret is None else interpret
    dtype = dtype or q.dtype
    precision = matmul_precision(dtype, precision)
    bq, bk = min(block_q, next_pow2(q_len)), min(block_k, next_pow2(s))
    if variant == "gpu":  # Triton's dot needs at least 16 rows and columns
        bq, bk = max(bq, MIN_DOT), max(bk, MIN_DOT)
    qp_len, sp = -(-q_len // bq) * bq, -(-s // bk) * bk
    q = _pad(q, 1, qp_len)
    q_pos = _pad(q_pos.astype(jnp.int32), 1, qp_len, -1)
    k = _pad(k, 1, sp)
    v = _pad(v, 2 if v_transposed else 1, sp)
    k_pos = _pad(k_pos.astype(jnp.int32), 1, sp, -1)
    bounds = key_block_bounds(q_pos, k_pos, bq, bk)
    kernel = functools.partial(
        flash_kernel, block_k=bk, scale=d**-0.5, dtype=dtype, precision=precision, v_transposed=v_transposed
    )
    v_block = (None, d, sp) if v_transposed else (None, sp, d)
    specs = [
        pl.BlockSpec((None, bq, d), lambda b, i, *_: (b, i, 0)),  # q
        pl.BlockSpec((None, sp, d), lambda b, i, *_: (b, 0, 0)),  # k: the whole row; the kernel slices blocks
        pl.BlockSpec(v_block, lambda b, i, *_: (b, 0, 0)),  # v
        pl.BlockSpec((None, bq, 1), lambda b, i, *_: (b, i, 0)),  # q_pos
        pl.BlockSpec((None, 1, sp), lambda b, i, *_: (b, 0, 0)),  # k_pos
    ]
    out_spec = pl.BlockSpec((None, bq, d), lambda b, i, *_: (b, i, 0))
    grid = (n, qp_len // bq)
    out_shape = jax.ShapeDtypeStruct((n, qp_len, d), jnp.float32)
    args = (q, k, v, q_pos[:, :, None], k_pos[:, None, :])
    if variant == "tpu":  # the bounds in SMEM before the grid starts
        grid_spec = pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=grid, in_specs=specs, out_specs=out_spec)
        out = pl.pallas_call(kernel, grid_spec=grid_spec, out_shape=out_shape, interpret=interpret)(bounds, *args)
    else:
        out = pl.pallas_call(
            kernel,
            grid=grid,
            in_specs=[pl.no_block_spec, *specs],
            out_specs=out_spec,
            out_shape=out_shape,
            interpret=interpret,
            compiler_params=compiler_params(variant),
        )(bounds, *args)
    return out[:, :q_len]
