"""A first Pallas kernel: RMSNorm, one block of rows per grid point.

``x`` [N, D] is cut into blocks of ``block_rows`` rows; grid point ``i`` gets the refs of block ``i`` of
``x`` and of the output, and the whole weight [1, D]. The body reads its block, computes in float32 and
writes its block: what XLA would fuse anyway, written by hand, so the machinery (grid, ``BlockSpec``,
refs) is seen on something small. Equal to :class:`jaxlab.engine.model.RMSNorm`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from jaxlab.engine.kernels.common import check_variant, compiler_params, variant_for


def rms_norm_kernel(x_ref, w_ref, o_ref, *, eps: float):
    x = x_ref[...].astype(jnp.float32)  # [block_rows, D]
    y = x * jax.lax.rsqrt(jnp.mean(x * x, axis=1, keepdims=True) + eps)
    o_ref[...] = (w_ref[...].astype(jnp.float32) * y).astype(o_ref.dtype)


def rms_norm(x, weight, eps: float = 1e-5, *, block_rows: int = 8, variant: str | None = None, interpret=None):
    """x [N, D] (N a multiple of ``block_rows``), weight [D] -> [N, D] in x's dtype."""
    n, d = x.shape
    if n % block_rows:
        raise ValueError(f"{n} rows do not split into blocks of {block_rows}: pad the rows or pick a divisor")
    auto_variant, auto_interpret = variant_for()
    variant = check_variant(variant or auto_variant)
    return pl.pallas_call(
        functools.partial(rms_norm_kernel, eps=eps),
        grid=(n // block_rows,),
        in_specs=[pl.BlockSpec((block_rows, d), lambda i: (i, 0)), pl.BlockSpec((1, d), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((block_rows, d), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        interpret=auto_interpret if interpret is None else interpret,
        compiler_params=compiler_params(variant),
    )(x, weight.reshape(1, d))
