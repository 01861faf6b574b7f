"""Gated DeltaNet (Qwen3.5's linear-attention layer) in Pallas: the chunked form, one chunk of tokens per step.

The recurrence, per batch row and head, one token ``t`` at a time (state S [Dk, Dv], q_t, k_t [Dk], v_t [Dv]):

    S <- exp(g_t) S                                  # the gate: forget a little (g_t <= 0 is a log decay)
    S <- S + k_t (beta_t (v_t - S^T k_t))^T          # the delta rule: write the part of v_t that S misses
    o_t = S^T q_t

The chunked form takes C tokens at once. With ``gc`` the cumulative log decay inside the chunk (gc_i = g_1 + ..
+ g_i), ``D_ij = exp(gc_i - gc_j)`` for i >= j, and ``kb = beta k``, ``vb = beta v`` (row-scaled):

    A  = strict_lower(kb k^T * D)                    # [C, C]: how each token's write depends on the earlier ones
    T  = (I + A)^-1                                  # the UT transform (unit lower triangular)
    u  = T vb,   w = T (exp(gc) kb)                  # [C, Dv], [C, Dk]: the chunk's writes, before the old state
    v' = u - w S                                     # [C, Dv]: ... less what the chunk-start state S predicts
    o  = (exp(gc) q) S + lower(q k^T * D) v'         # [C, Dv]: the old state read, plus the chunk's own tokens
    S <- exp(gc_C) S + (exp(gc_C - gc) k)^T v'       # [Dk, Dv]: the state after the chunk

So a chunk is about a dozen matmuls of C x C, C x Dk, C x Dv and Dk x Dv, and only the chunk-to-chunk scan is
sequential: the same maths as transformers' ``torch_chunk_gated_delta_rule`` and
:func:`jaxlab.engine.deltanet.gated_delta_chunked`.

**The UT transform by doubling the inverted blocks** (:func:`unit_lower_inverse`), not forward substitution.
``T`` is built from the inverses of its 1 x 1 diagonal blocks, then of its 2 x 2, 4 x 4, ... blocks: a pair of
inverted blocks joins into the inverse of their 2s x 2s block with two C x C matmuls, so C = 64 takes 10 matmuls
(two for each of the five doublings after the first, which needs none). Forward substitution (torch's
``solve_triangular``) is C - 1 = 63 dependent row updates, each a vector-matrix product using a sliver of the MXU
and a row read and written at a dynamic index; the doubling is a short, fixed chain of full matmuls with no
dynamic indexing, which Mosaic and Triton both lower. It is forward substitution by blocks: each step multiplies
inverses already exact for their blocks, so nothing grows that the true inverse does not hold. The
shorter-looking power series ``(I + A)^-1 = (I - A)(I + A^2)(I + A^4)...`` (``A^C = 0``) is not stable: with
near-parallel keys and beta near 1 its terms grow like binomial coefficients (about 1e18 at C = 64) and cancel;
measured, its outputs were 1e16 off where the block doubling's are within 4e-7 (the case is kept in
tests/engine/kernels/test_deltanet_kernel.py).

**Layout.** The wrapper moves heads before time (q, k [B*H, Tp, Dk], v [B*H, Tp, Dv]), pads T up to Tp, a
multiple of C, with g = 0 and beta = 0 (a padded step neither decays nor writes the state; its output is cut
off), and cumulates g inside each chunk (an XLA cumsum over [B*H, Tp / C, C], a few bytes a token), giving gc and
beta as columns [B*H, Tp, 1].

* **TPU** (Mosaic): grid (B*H, Tp / C), the head axis parallel (megacore may split it), the chunk axis
  sequential ("arbitrary"). Grid point (n, c) has in VMEM the chunk's blocks q, k [C, Dk], v [C, Dv], gc, beta
  [C, 1] (the pipeline prefetches the next chunk's while this one computes), the initial state [Dk, Dv] (one
  block per head, copied once), the output block [C, Dv], and a float32 scratch [Dk, Dv] holding the state
  across the chunk axis: loaded from the initial state at c = 0, written to the final-state output at the last
  chunk. VMEM use at C = 64, Dk = Dv = 128: a few hundred KiB, far below any TPU's. Sizes (measured by
  compiling for a v5e from this CPU with libtpu): C a multiple of 8, the sublane tile that the (8, 128) rule asks
  of the [C, .] blocks' second-minor dimension (Mosaic refuses C = 12 or 20), which :func:`check_sizes` says
  before Mosaic does; Dk and Dv of any size, since every block spans them whole (the rule's "or the whole
  dimension"). Multiples of 128, the lane width, keep the state, the blocks and the matmuls lane-dense: a smaller
  head dimension compiles but pads each vector register's lanes. Qwen3.5's heads are Dk = Dv = 128.
* **GPU** (Triton): grid (B*H,), the whole row's blocks, and a loop over the chunks inside the kernel with the
  state as its carry (a GPU runs grid points at once, so no grid axis can carry a state). Triton's rule: C, Dk,
  Dv powers of two, at least 16 (its smallest dot).

Why C = 64: per token, the chunk's own matmuls cost about 2 C (3 Dk + 2 Dv + 10 C) flops (the C x C part
grows with C: A, T, the scores) and the state's 6 Dk Dv (reading it, correcting by it, updating it), whatever C.
At Dk = Dv = 128, C = 64 gives 164k + 98k flops a token; C = 128 would be 492k + 98k. A smaller C lowers the
first term but feeds the MXU (128 x 128 on v5e) fewer rows and lengthens the sequential scan (T / C steps).
64 is also the reference's choice (transformers, flash-linear-attention), so the chunk boundaries match theirs.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from jaxlab.engine.kernels.common import MIN_DOT, check_variant, compiler_params, matmul_precision, variant_for

CHUNK = 64
TPU_SUBLANES = 8  # the second-minor side of a TPU vector register's (8, 128) tile: Mosaic's rule for blocks

_MATMUL = (((1,), (0,)), ((), ()))  # a [M, K] @ b [K, N]
_MATMUL_BT = (((1,), (1,)), ((), ()))  # a [M, K] @ b[N, K]^T
_MATMUL_AT = (((0,), (0,)), ((), ()))  # a[K, M]^T @ b [K, N]


def dot(a, b, dims=_MATMUL, *, precision):
    return jax.lax.dot_general(a, b, dims, precision=precision, preferred_element_type=jnp.float32)


def unit_lower_inverse(a, *, precision):
    """(I + a)^-1 for a [C, C] strictly lower triangular, by doubling the size of the inverted diagonal blocks.

    With ``t`` holding the inverses of the diagonal blocks of size s, a pair of them joins into the inverse of
    their block of size 2s, M = [[M11, 0], [M21, M22]]: M^-1 = t - t N t, where N holds M21 alone (N t N = 0, so
    the series stops after one term). Every pair at once is two [C, C] matmuls with N masked out of ``a``."""
    c = a.shape[0]
    rows = jax.lax.broadcasted_iota(jnp.int32, (c, c), 0)
    cols = jax.lax.broadcasted_iota(jnp.int32, (c, c), 1)

    def joining(level):  # a's entries below the diagonal blocks of size 2^level, inside those of 2^(level + 1)
        same_pair = (rows >> (level + 1)) == (cols >> (level + 1))
        return jnp.where(same_pair & ((rows >> level) != (cols >> level)), a, 0.0)

    t = jnp.where(rows == cols, 1.0, 0.0) - joining(0)  # blocks of 1 are 1: their pairs need no matmul
    for level in range(1, math.ceil(math.log2(c))):
        t = t - dot(t, dot(joining(level), t, precision=precision), precision=precision)
    return t


def chunk_step(q, k, v, gc, beta, state, *, precision):
    """One chunk of the recurrence (the module docstring's formulas): q, k [C, Dk], v [C, Dv], gc (cumulative
    log decay) and beta [C, 1], state [Dk, Dv], all float32 -> (out [C, Dv], the state after the chunk)."""
    c = q.shape[0]
    rows = jax.lax.broadcasted_iota(jnp.int32, (c, c), 0)
    cols = jax.lax.broadcasted_iota(jnp.int32, (c, c), 1)
    gc_row = gc.T  # [1, C]
    # the chunk's last gc by a masked sum, not gc[-1:]: Triton has no lowering for slicing a value
    last = jax.lax.broadcasted_iota(jnp.int32, (c, 1), 0) == c - 1
    gc_last = jnp.sum(jnp.where(last, gc, 0.0), axis=0, keepdims=True)  # [1, 1]
    # exp only where i >= j: above the diagonal gc_i - gc_j > 0 could overflow, and those entries are dropped
    lower = rows >= cols
    decay = jnp.where(lower, jnp.exp(jnp.where(lower, gc - gc_row, 0.0)), 0.0)  # [C, C]
    kb = k * beta  # [C, Dk]
    a = jnp.where(rows > cols, dot(kb, k, _MATMUL_BT, precision=precision) * decay, 0.0)  # [C, C]
    t = unit_lower_inverse(a, precision=precision)
    u = dot(t, v * beta, precision=precision)  # [C, Dv]
    w = dot(t, kb * jnp.exp(gc), precision=precision)  # [C, Dk]
    v_new = u - dot(w, state, precision=precision)  # [C, Dv]
    scores = dot(q, k, _MATMUL_BT, precision=precision) * decay  # [C, C], causal (decay is 0 above)
    out = dot(q * jnp.exp(gc), state, precision=precision) + dot(scores, v_new, precision=precision)
    k_to_end = k * jnp.exp(gc_last - gc)  # [C, Dk]: each key decayed to the chunk's end
    state = state * jnp.exp(gc_last) + dot(k_to_end, v_new, _MATMUL_AT, precision=precision)
    return out, state


def as_f32(*refs):
    return [r[...].astype(jnp.float32) for r in refs]


def deltanet_kernel_tpu(q_ref, k_ref, v_ref, g_ref, b_ref, s0_ref, o_ref, s_ref, state_sc, *, precision):
    c = pl.program_id(1)

    @pl.when(c == 0)
    def _():
        state_sc[...] = s0_ref[...]

    out, state = chunk_step(*as_f32(q_ref, k_ref, v_ref, g_ref, b_ref), state_sc[...], precision=precision)
    o_ref[...] = out
    state_sc[...] = state

    @pl.when(c == pl.num_programs(1) - 1)
    def _():
        s_ref[...] = state


def deltanet_kernel_gpu(q_ref, k_ref, v_ref, g_ref, b_ref, s0_ref, o_ref, s_ref, *, chunk, precision):
    def body(c, state):
        at = pl.ds(pl.multiple_of(c * chunk, chunk), chunk)
        blocks = [r[at, :].astype(jnp.float32) for r in (q_ref, k_ref, v_ref, g_ref, b_ref)]
        out, state = chunk_step(*blocks, state, precision=precision)
        o_ref[at, :] = out
        return state

    s_ref[...] = jax.lax.fori_loop(0, q_ref.shape[0] // chunk, body, s0_ref[...])


def check_sizes(variant: str, chunk: int, dk: int, dv: int) -> None:
    """Refuse, in words, the sizes a compiled variant cannot take (interpret mode takes any)."""
    if variant == "tpu":
        if chunk % TPU_SUBLANES:
            raise ValueError(
                f"the TPU Gated DeltaNet kernel needs a chunk that is a multiple of {TPU_SUBLANES} (the sublane tile of"
                f" its [chunk, D] blocks); got chunk = {chunk}"
            )
        return
    bad = [f"{name} = {n}" for name, n in (("chunk", chunk), ("Dk", dk), ("Dv", dv)) if n < MIN_DOT or n & (n - 1)]
    if bad:
        raise ValueError(
            f"the GPU (Triton) Gated DeltaNet kernel needs chunk, Dk and Dv powers of two, at least {MIN_DOT};"
            f" got {', '.join(bad)}"
        )


def gated_delta_pallas(q, k, v, g, beta, state=None, *, chunk: int = CHUNK, variant: str | None = None, interpret=None):
    """Gated DeltaNet over a sequence, in chunks of ``chunk`` tokens: the contract of
    :func:`jaxlab.engine.deltanet.gated_delta_chunked`.

    q, k [B, T, H, Dk] (l2-normalised, repeated to the H value heads, q scaled by Dk**-0.5), v [B, T, H, Dv],
    g [B, T, H] log decay (<= 0), beta [B, T, H] in (0, 1), state [B, H, Dk, Dv] float32 or None (zeros)
    -> (out [B, T, H, Dv] float32, state [B, H, Dk, Dv] float32)."""
    b, t, h, dk = q.shape
    dv = v.shape[-1]
    auto_variant, auto_interpret = variant_for()
    variant = check_variant(variant or auto_variant)
    interpret = auto_interpret if interpret is None else interpret
    if not interpret:
        check_sizes(variant, chunk, dk, dv)
    precision = matmul_precision(jnp.float32)
    n_chunks = -(-t // chunk)
    tp = n_chunks * chunk

    def heads_first(x):  # [B, T, H, ...] -> [B*H, Tp, ...], padded with zeros (g = beta = 0: a step that does nothing)
        x = jnp.moveaxis(x, 2, 1)
        x = jnp.pad(x, [(0, 0), (0, 0), (0, tp - t)] + [(0, 0)] * (x.ndim - 3))
        return x.reshape(b * h, tp, *x.shape[3:])

    gc = jnp.cumsum(heads_first(g.astype(jnp.float32)).reshape(b * h, n_chunks, chunk), axis=2)
    columns = (gc.reshape(b * h, tp, 1), heads_first(beta.astype(jnp.float32))[:, :, None])  # [B*H, Tp, 1] each
    s0 = jnp.zeros((b * h, dk, dv), jnp.float32) if state is None else state.astype(jnp.float32).reshape(b * h, dk, dv)
    args = (heads_first(q), heads_first(k), heads_first(v), *columns, s0)
    out_shape = (
        jax.ShapeDtypeStruct((b * h, tp, dv), jnp.float32),
        jax.ShapeDtypeStruct((b * h, dk, dv), jnp.float32),
    )
    state_spec = pl.BlockSpec((None, dk, dv), lambda n, *_: (n, 0, 0))
    if variant == "tpu":

        def rows(width):  # chunk c of head n
            return pl.BlockSpec((None, chunk, width), lambda n, c: (n, c, 0))

        out, state = pl.pallas_call(
            functools.partial(deltanet_kernel_tpu, precision=precision),
            grid=(b * h, n_chunks),
            in_specs=[rows(dk), rows(dk), rows(dv), rows(1), rows(1), state_spec],
            out_specs=[rows(dv), state_spec],
            out_shape=out_shape,
            scratch_shapes=[pltpu.VMEM((dk, dv), jnp.float32)],
            compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
            interpret=interpret,
        )(*args)
    else:

        def rows(width):  # the head's whole padded sequence; the kernel walks its chunks
            return pl.BlockSpec((None, tp, width), lambda n: (n, 0, 0))

        out, state = pl.pallas_call(
            functools.partial(deltanet_kernel_gpu, chunk=chunk, precision=precision),
            grid=(b * h,),
            in_specs=[rows(dk), rows(dk), rows(dv), rows(1), rows(1), state_spec],
            out_specs=[rows(dv), state_spec],
            out_shape=out_shape,
            interpret=interpret,
            compiler_params=compiler_params(variant),
        )(*args)
    out = jnp.moveaxis(out[:, :t].reshape(b, h, t, dv), 2, 1)  # [B, T, H, Dv]
    return out, state.reshape(b, h, dk, dv)
