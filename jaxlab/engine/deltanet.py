"""The gated delta rule (Gated DeltaNet, Qwen3.5's linear-attention layers) as pure JAX functions.

A Gated DeltaNet head keeps a matrix state ``S`` [Dk, Dv] instead of a growing KV cache. For each token t, with
key ``k_t`` and query ``q_t`` [Dk] (l2-normalised), value ``v_t`` [Dv], log decay ``g_t <= 0`` and write strength
``beta_t`` in (0, 1)::

    S_t = S_{t-1} exp(g_t) + k_t (beta_t (v_t - exp(g_t) S_{t-1}^T k_t))^T        # [Dk, Dv]
    o_t = S_t^T q_t                                                                  # [Dv]

The state decays, then ``S^T k_t`` (what the decayed state already recalls for this key) is replaced by ``v_t``
with strength ``beta_t``: only the *correction* ``v_t - S^T k_t`` is written (the delta rule; with beta = 1 and a
unit key the key is re-bound exactly). Two forms compute the same sums:

* :func:`gated_delta_recurrent` — one token at a time (``lax.scan``): what a decode step runs (T = 1), and the
  reference the other forms are tested against;
* :func:`gated_delta_chunked` — chunks of C tokens: the writes inside a chunk depend on each other only through a
  unit lower-triangular C x C system, which is solved at once (the UT transform), so a chunk is a few matmuls and
  the scan runs T / C steps instead of T: what prefill runs.

The chunked form, within one chunk starting from the state ``S_0``, with cumulative log decay
``G_i = g_1 + ... + g_i``: unrolling the recurrence gives ``S_i = exp(G_i) S_0 + sum_{j<=i} exp(G_i - G_j) k_j u_j^T``
where ``u_j = beta_j (v_j - exp(g_j) S_{j-1}^T k_j)`` is the correction written at step j. Substituting ``S_{j-1}``
into that definition::

    u_i + beta_i sum_{j<i} exp(G_i - G_j) (k_i . k_j) u_j  =  beta_i v_i  -  beta_i exp(G_i) S_0^T k_i

i.e. ``(I + L) U = V_beta - W_0 S_0`` with ``L`` strictly lower triangular. Solving it for the chunk once
(``U = (I+L)^-1 V_beta``, ``W = (I+L)^-1 (beta exp(G) K)``, independent of ``S_0``) gives every correction of the
chunk as ``U - W S_0``: the "UT transform" (the WY representation of a product of Householder-like updates).
Outputs and the next state are then matmuls::

    O = exp(G) Q S_0 + ((Q K^T) * D) (U - W S_0)        D_ij = exp(G_i - G_j) for j <= i, else 0
    S_C = exp(G_C) S_0 + (exp(G_C - G) K)^T (U - W S_0)

Every exponent above is <= 0 (``G`` decreases), so nothing overflows; this is the same arithmetic as
``transformers``' ``torch_chunk_gated_delta_rule`` (tests/engine/test_deltanet.py: chunked == recurrent).

A token with ``g = 0`` and ``beta = 0`` leaves the state unchanged in both forms (no decay, no write): padding, and
the tail the chunked form adds to reach a multiple of C, are such tokens. :func:`causal_conv1d` (the short causal
convolution before the rule) skips padding tokens in the same sense, given their mask.

Shapes (the contract :mod:`jaxlab.engine.kernels.deltanet`'s Pallas kernel shares): q, k [B, T, H, Dk] already
l2-normalised, repeated to the H value heads, q already scaled by Dk**-0.5; v [B, T, H, Dv]; g, beta [B, T, H];
state [B, H, Dk, Dv] float32 (None: zeros). Both return (out [B, T, H, Dv] float32, state [B, H, Dk, Dv] float32).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array

#: float32 parity with the reference needs full-precision matmuls (TPU and recent GPUs default to bf16 / TF32 passes)
PRECISION = jax.lax.Precision.HIGHEST


def l2norm(x: Array, eps: float = 1e-6) -> Array:
    """x [..., D] / sqrt(sum(x^2) + eps) over the last axis, in float32 (the reference's ``l2norm``, FLA's eps)."""
    x = x.astype(jnp.float32)
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def initial_state(q: Array, v: Array, state: Array | None) -> Array:
    """The state a rule starts from: ``state`` as float32, or zeros [B, H, Dk, Dv] for q [B, T, H, Dk], v [B, T, H, Dv]."""
    b, _, h, dk = q.shape
    if state is None:
        return jnp.zeros((b, h, dk, v.shape[-1]), jnp.float32)
    return state.astype(jnp.float32)


def gated_delta_recurrent(
    q: Array, k: Array, v: Array, g: Array, beta: Array, state: Array | None = None
) -> tuple[Array, Array]:
    """The gated delta rule one token at a time (``lax.scan`` over T): what a decode step runs.

    q, k [B, T, H, Dk]; v [B, T, H, Dv]; g, beta [B, T, H]; state [B, H, Dk, Dv] or None
    -> (out [B, T, H, Dv] float32, state [B, H, Dk, Dv] float32). Per token (see the module docstring)::

        S <- S exp(g_t);  S <- S + k_t (beta_t (v_t - S^T k_t))^T;  o_t = S^T q_t
    """
    f32 = jnp.float32
    s0 = initial_state(q, v, state)

    def step(s, xs):  # s [B, H, Dk, Dv]; one token of each input, time axis removed
        q_t, k_t, v_t, g_t, b_t = xs  # [B, H, Dk], [B, H, Dk], [B, H, Dv], [B, H], [B, H]
        s = s * jnp.exp(g_t)[..., None, None]
        recalled = jnp.einsum("bhkv,bhk->bhv", s, k_t, precision=PRECISION)  # what the state holds for k_t
        delta = (v_t - recalled) * b_t[..., None]  # [B, H, Dv]: only the correction is written
        s = s + k_t[..., None] * delta[..., None, :]
        return s, jnp.einsum("bhkv,bhk->bhv", s, q_t, precision=PRECISION)

    time_major = [jnp.moveaxis(x.astype(f32), 1, 0) for x in (q, k, v, g, beta)]  # scan runs over axis 0
    s, out = jax.lax.scan(step, s0, time_major)
    return jnp.moveaxis(out, 0, 1), s  # [B, T, H, Dv], [B, H, Dk, Dv]


def gated_delta_chunked(
    q: Array, k: Array, v: Array, g: Array, beta: Array, state: Array | None = None, *, chunk: int = 64
) -> tuple[Array, Array]:
    """The gated delta rule over chunks of ``chunk`` tokens (the UT transform; see the module docstring): what
    prefill runs. Same arguments and results as :func:`gated_delta_recurrent`, for any T: the sequence is padded
    to a multiple of ``chunk`` with tokens of g = 0, beta = 0 (which leave the state as it is) and the padding's
    outputs dropped.

    Inside: the intra-chunk quantities for all chunks at once (a triangular solve per chunk), then a scan over the
    T / chunk chunks carrying the state [B, H, Dk, Dv]."""
    f32 = jnp.float32
    b, t, h, dk = q.shape
    dv = v.shape[-1]
    s0 = initial_state(q, v, state)
    pad = (-t) % chunk
    n = (t + pad) // chunk

    def chunks(x):  # [B, T, H, ...] -> [N, B, H, C, ...]: the chunk axis first, for the scan
        x = jnp.pad(x.astype(f32), [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
        x = x.reshape(b, n, chunk, h, *x.shape[3:])
        return jnp.moveaxis(jnp.moveaxis(x, 3, 2), 1, 0)

    q, k, v = chunks(q), chunks(k), chunks(v)  # [N, B, H, C, Dk or Dv]
    g, beta = chunks(g), chunks(beta)  # [N, B, H, C]; the padding has g = 0 and beta = 0
    cum = jnp.cumsum(g, axis=-1)  # G_i: log of the decay from the chunk's start through token i
    lower = jnp.tril(jnp.ones((chunk, chunk), bool))  # j <= i
    # D_ij = exp(G_i - G_j) for j <= i: masked before the exp, so the (positive) upper entries never overflow
    decay = jnp.exp(jnp.where(lower, cum[..., :, None] - cum[..., None, :], -jnp.inf))  # [N, B, H, C, C]
    k_beta = k * beta[..., None]
    v_beta = v * beta[..., None]
    mm = lambda spec, x, y: jnp.einsum(spec, x, y, precision=PRECISION)  # noqa: E731
    # (I + L): L strictly lower; the solve treats the diagonal as ones (unit_diagonal), whatever it holds
    system = mm("...id,...jd->...ij", k_beta, k) * decay
    solve = lambda rhs: jax.lax.linalg.triangular_solve(  # noqa: E731
        system, rhs, left_side=True, lower=True, unit_diagonal=True
    )
    u = solve(v_beta)  # [N, B, H, C, Dv]: the corrections if the chunk started from S_0 = 0
    w = solve(k_beta * jnp.exp(cum)[..., None])  # [N, B, H, C, Dk]: how each correction reads S_0
    attn = mm("...id,...jd->...ij", q, k) * decay  # [N, B, H, C, C] causal within the chunk, decayed
    q_read = q * jnp.exp(cum)[..., None]  # how each query reads S_0 (decayed from the chunk's start)
    k_write = k * jnp.exp(cum[..., -1:] - cum)[..., None]  # each key decayed to the chunk's end
    chunk_decay = jnp.exp(cum[..., -1])[..., None, None]  # [N, B, H, 1, 1]

    def step(s, xs):  # s [B, H, Dk, Dv]: the state at the chunk's start
        u_c, w_c, attn_c, q_c, k_c, d_c = xs
        corr = u_c - mm("bhck,bhkv->bhcv", w_c, s)  # [B, H, C, Dv]: the chunk's true corrections
        out = mm("bhck,bhkv->bhcv", q_c, s) + mm("bhij,bhjv->bhiv", attn_c, corr)
        s = s * d_c + mm("bhck,bhcv->bhkv", k_c, corr)
        return s, out

    s, out = jax.lax.scan(step, s0, (u, w, attn, q_read, k_write, chunk_decay))  # out [N, B, H, C, Dv]
    out = jnp.moveaxis(out, 0, 2).reshape(b, h, n * chunk, dv)[:, :, :t]
    return out.transpose(0, 2, 1, 3), s  # [B, T, H, Dv], [B, H, Dk, Dv]


def causal_conv1d(x: Array, weight: Array, state: Array, mask: Array | None = None) -> tuple[Array, Array]:
    """Depthwise causal convolution with SiLU, carrying its last inputs: one function for prefill and decode.

    x [B, T, C] (any T >= 1); weight [C, K] (``transformers``' conv1d weight [C, 1, K] squeezed; the last tap
    multiplies the current token); state [B, K-1, C] the K-1 inputs before x; mask [B, T] bool (True = a real
    token; None = all real) -> (y [B, T, C] float32, new state [B, K-1, C]). ``y_t = silu(sum_j weight[:, j] *
    u_{t-K+1+j})`` over the inputs u = (state, x), as ``causal_conv1d_fn`` (prefill) and ``causal_conv1d_update``
    (decode) compute it.

    A padding token (mask False) is as if it were not there: the real tokens are convolved with the real tokens
    and state before them, and the new state is the last K-1 real inputs. With left padding from an empty state
    this equals zero inputs at the padding (what the reference does); for padding after a non-empty state (a
    ragged batch continuing) only the skip is right. Done by a stable sort that moves each row's padding in
    front of (state, x); padding outputs are 0."""
    f32 = jnp.float32
    b, t, c = x.shape
    kk = weight.shape[-1]
    x = x.astype(f32)
    buf = jnp.concatenate([state.astype(f32), x if mask is None else x * mask[..., None]], axis=1)  # [B, K-1+T, C]
    if mask is not None:
        valid = jnp.concatenate([jnp.ones((b, kk - 1), bool), mask], axis=1)  # the state's inputs are real
        order = jnp.argsort(valid, axis=1, stable=True)  # padding first, then the real inputs in their order
        buf = jnp.take_along_axis(buf, order[..., None], axis=1)
    w = weight.astype(f32)
    y = sum(w[:, j] * buf[:, j : j + t] for j in range(kk))  # [B, T, C]: output i ends at buf[K-1+i]
    y = jax.nn.silu(y)
    if mask is not None:  # each real token's output sits where the sort put its input
        where = jnp.argsort(order, axis=1)[:, kk - 1 :] - (kk - 1)  # [B, T]; negative for padding
        y = jnp.take_along_axis(y, jnp.maximum(where, 0)[..., None], axis=1) * mask[..., None]
    return y, buf[:, t:].astype(state.dtype)
