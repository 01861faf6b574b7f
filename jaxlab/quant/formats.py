"""Quantized weights, and the one hook that plugs them into the model's linear layers.

Formats (``FORMATS``):

* ``int8`` — weight-only, per output channel: ``W[o, i] ~ scale[o] * q[o, i]``, ``q`` int8 in
  [-127, 127]. Activations stay (almost) float: see "How the matmuls run" below.
* ``int4`` — weight-only, group-wise along the input axis (``group`` inputs share a scale and an
  offset, as in llama.cpp's Q4_1): ``W[o, i] ~ scale[o, g] * (q[o, i] - 8) + zero[o, g]`` with
  ``q`` in [0, 15], packed two per byte and unpacked inside the jitted matmul.
* ``w8a8`` — int8 weights per channel (as ``int8``) times int8 activations quantized per token at
  run time (symmetric, dynamic), accumulated in int32.

The hook: :class:`QuantizedMatrix` is a pytree that sits where a float kernel sits in the parameter
tree. ``jaxlab.engine.model.dense`` sees it and calls :meth:`QuantizedMatrix.dot` instead of ``einsum``; the
embedding lookup calls :meth:`QuantizedMatrix.rows`. There is no second model: ``forward``, ``jit``,
``Generator`` and the CLI run quantized parameters unchanged. :func:`quantize_params` builds them
from float :class:`~jaxlab.engine.model.Params`. The int8 KV cache lives in :mod:`jaxlab.engine.kvcache`
(``init_cache(..., dtype="int8")``) and the attention in :mod:`jaxlab.engine.model`.

Storage is output-major, ``q[o, i]``: the contraction runs over the minor axis, which is what XLA's
CPU int8 kernels read fastest, and the tied embedding ``[vocab, dim]`` already has that layout (one
quantized matrix serves the lookup and the output head).

How the matmuls run — chosen by measurement on XLA:CPU (``benchmarks/NOTES.md`` §5). XLA's CPU
backend has a fast int8 x int8 -> int32 matrix kernel, but only for two or more rows (one row fell to a
path ~7x slower), and "convert the weights to float, then a float dot" materializes the float matrix
on every call (5x slower than float32 at batch 1). So:

* ``w8a8`` quantizes each activation row to int8 and runs the int8 kernel (a single row is padded to
  two);
* ``int8`` (weight-only) writes each activation row as two int8 rows, ``x ~ s * (hi + lo / 254)``
  (about 15 bits: the error is at most ``max|x| / 64516``, far below the weights' own rounding), and
  runs the same int8 kernel over twice the rows, so weight-only int8 costs one int8 matmul;
* ``int4`` unpacks the nibbles to int8 and runs one int8 matmul per group (a batched ``dot_general``
  over groups), using the same two-row activations. XLA:CPU runs this slowly (short contractions and
  a per-step unpack); it is the memory format, and the benchmark says what it costs.

On TPU/GPU the trade-offs differ (the bench reports whatever the backend does).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.engine.kernels import cpu as cpu_kernels
from jaxlab.errors import ConfigError

Array = jax.Array
FORMATS = ("int8", "int4", "w8a8")
KV_FORMATS = ("float32", "int8")
DEFAULT_GROUP = 32
STORE_VERSION = 2  # bump when the on-disk layout of quantized parameters changes
KERNELS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down", "lm_head")  # [in, out] float kernels
# What a quantized model computes in, on every backend: the matrices run as int8 x int8 -> int32 matmuls
# (quant.py's "How the matmuls run"); norms, RoPE, attention, the residual stream and logits stay float32.
COMPUTES_IN = {
    "int8": "float32 activations (int8 weights; matmuls on 15-bit split activations, int32 accumulation)",
    "int4": "float32 activations (int4 weights; matmuls on 15-bit split activations, int32 accumulation)",
    "w8a8": "float32 activations between layers (int8 weights x int8 activations, int32 accumulation)",
}
_SPLIT = 254.0  # int8 weight-only: x ~ s * (hi + lo / _SPLIT)


def check_format(fmt: str | None, group: int = DEFAULT_GROUP) -> None:
    if fmt is not None and fmt not in FORMATS:
        raise ConfigError(f"unknown quantization format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if fmt == "int4" and (not isinstance(group, (int, np.integer)) or group < 2 or group % 2):
        raise ConfigError(f"int4 group size must be an even integer >= 2, got {group!r} (try 32 or 64)")


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class QuantizedMatrix:
    """A quantized matrix ``W [out, in]`` (output-major). For a model kernel ``[in, out]`` this is its
    transpose; for the tied embedding ``[vocab, dim]`` it is the embedding itself.

    ``q``: int8 ``[out, in]`` (int8, w8a8) or uint8 ``[out, in / 2]`` (int4, two 4-bit values per byte:
    input ``2j`` in the low nibble, ``2j + 1`` in the high one). ``scale``: float32 ``[out]`` or
    ``[out, groups]``. ``zero``: float32 ``[out, groups]`` (int4) or None."""

    q: Array
    scale: Array
    zero: Array | None
    fmt: str = field(metadata=dict(static=True))
    group: int = field(default=0, metadata=dict(static=True))
    smooth: Array | None = None  # w8a8 with calibration: per-input-channel factors (SmoothQuant)

    @property
    def shape(self) -> tuple[int, int]:
        o, n = self.q.shape
        return (o, n * 2) if self.fmt == "int4" else (o, n)

    @property
    def dtype(self):  # what the matrix computes in
        return jnp.dtype(jnp.float32)

    @property
    def nbytes(self) -> int:
        return sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(self))

    def __repr__(self):
        g = f", group={self.group}" if self.fmt == "int4" else ""
        return f"QuantizedMatrix({self.fmt}, shape={self.shape}{g}, {self.nbytes / 1e6:.2f} MB)"

    # -- the matmul: x [..., in] -> [..., out] -------------------------------------------------

    def dot(self, x: Array, policy=None) -> Array:
        """x [..., in] -> [..., out] float32. ``policy`` (the model's :class:`~jaxlab.engine.model.Policy`, passed by
        the linear-layer hook) is not used: a quantized matrix always computes as described above."""
        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.shape[-1]).astype(jnp.float32)
        if self.fmt == "w8a8":
            if self.smooth is not None:  # x W^T = (x / s)(W s)^T: move activation outliers into W
                x2 = x2 / self.smooth
            y = _w8a8_dot(x2, self.q, self.scale)
        elif self.fmt == "int8":
            y = _int8_dot(x2, self.q, self.scale)
        else:
            y = _int4_dot(x2, self.q, self.scale, self.zero, self.group)
        return y.reshape(*lead, y.shape[-1])

    # -- row lookup (the embedding) and full dequantization -----------------------------------

    def rows(self, ids: Array) -> Array:
        """``W[ids]`` as float32: ``ids [...] -> [..., in]``."""
        q, scale = jnp.take(self.q, ids, axis=0), jnp.take(self.scale, ids, axis=0)
        if self.fmt != "int4":
            w = q.astype(jnp.float32) * scale[..., None]
            return w if self.smooth is None else w / self.smooth
        zero = jnp.take(self.zero, ids, axis=0)
        w = (unpack_int4(q) - 8).astype(jnp.float32)  # [..., in]
        w = w.reshape(*w.shape[:-1], -1, self.group) * scale[..., None] + zero[..., None]
        return w.reshape(*w.shape[:-2], -1)

    def dequantize(self) -> Array:
        """The float32 matrix ``[out, in]`` this one stands for."""
        return self.rows(jnp.arange(self.shape[0]))


# --------------------------------------------------------------------------------------------------
# The matmuls (pure jnp/lax; run under the caller's jit)
# --------------------------------------------------------------------------------------------------


def _xla_int8_matmul(xq: Array, q: Array) -> Array:
    return jax.lax.dot_general(xq, q, (((1,), (1,)), ((), ())), preferred_element_type=jnp.int32)


def _int8_matmul(xq: Array, q: Array) -> Array:
    """[R, I] int8 x [O, I] int8 -> [R, O] float32 (exact int32 accumulation). A few rows lowered for a CPU run on
    jaxlab's own kernel (:mod:`jaxlab.engine.kernels.cpu`: the same integers, at the memory bandwidth)."""
    if xq.ndim == 2 and cpu_kernels.uses_int8_matmul(xq.shape[0]):
        acc = jax.lax.platform_dependent(xq, q, cpu=cpu_kernels.int8_matmul, default=_xla_int8_matmul)
    else:
        acc = _xla_int8_matmul(xq, q)
    return acc.astype(jnp.float32)


def _row_scale(x2: Array) -> Array:
    s = jnp.max(jnp.abs(x2), axis=-1, keepdims=True) / 127.0
    return jnp.where(s > 0, s, 1.0)


def quantize_activations(x2: Array) -> tuple[Array, Array]:
    """Per-row symmetric int8: ``x [R, I] ~ s [R, 1] * xq``."""
    s = _row_scale(x2)
    return jnp.clip(jnp.round(x2 / s), -127, 127).astype(jnp.int8), s


def split_activations(x: Array) -> tuple[Array, Array]:
    """``x [..., R, K] ~ s * (hi + lo / 254)``, hi and lo int8 stacked as rows ``[..., 2R, K]``;
    returns (rows, s [..., R, 1]). The error is at most ``max|x| / (127 * 254 * 2)`` per row."""
    s = _row_scale(x)
    t = x / s  # in [-127, 127]
    hi = jnp.round(t)
    lo = jnp.round((t - hi) * _SPLIT)  # (t - hi) in [-0.5, 0.5] -> [-127, 127]
    return jnp.concatenate([hi, lo], axis=-2).astype(jnp.int8), s


def join_split(acc: Array, r: int) -> Array:
    """Recombine an int matmul over split rows ``[..., 2R, N]`` -> ``[..., R, N]`` (before scaling)."""
    return acc[..., :r, :] + acc[..., r:, :] / _SPLIT


def _w8a8_dot(x2, q, scale):
    r = x2.shape[0]
    xq, s = quantize_activations(x2)
    if r == 1:  # XLA:CPU's one-row int8 dot is ~7x slower than two rows (NOTES.md §5)
        xq = jnp.pad(xq, ((0, 1), (0, 0)))
    return _int8_matmul(xq, q)[:r] * s * scale


def _xla_split_matmul(x2, q):
    rows, s = split_activations(x2)
    return _xla_int8_matmul(rows, q), s


def _int8_dot(x2, q, scale):
    """A few rows lowered for a CPU are split and multiplied in one call of jaxlab's kernel (the same integers and
    scales as XLA's program, without its small fusions before every product); the join and the scaling stay here,
    where XLA fuses them with what follows alike at every row count."""
    r = x2.shape[0]
    if cpu_kernels.uses_int8_matmul(2 * r):
        acc, s = jax.lax.platform_dependent(x2, q, cpu=cpu_kernels.int8_split_matmul, default=_xla_split_matmul)
    else:
        acc, s = _xla_split_matmul(x2, q)
    return join_split(acc.astype(jnp.float32), r) * s * scale


def unpack_int4(packed: Array) -> Array:
    """uint8 [..., n] -> int8 [..., 2n] in [0, 15] (low nibble first)."""
    lo = (packed & 15).astype(jnp.int8)
    hi = (packed >> 4).astype(jnp.int8)
    return jnp.stack([lo, hi], axis=-1).reshape(*packed.shape[:-1], -1)


def _int4_dot(x2, packed, scale, zero, group):
    # W[o, i] = scale[o, g] * (q[o, i] - 8) + zero[o, g], i in group g
    r, n_in = x2.shape
    o, groups = scale.shape
    q = (unpack_int4(packed) - 8).reshape(o, groups, group)  # int8 in [-8, 7]
    rows, s = split_activations(x2)
    acc = jax.lax.dot_general(
        rows.reshape(2 * r, groups, group), q, (((2,), (2,)), ((1,), (1,))), preferred_element_type=jnp.int32
    )  # [G, 2R, O]
    acc = jnp.einsum("gro,og->ro", acc.astype(jnp.float32), scale, precision=jax.lax.Precision.HIGHEST)
    y = join_split(acc, r) * s
    group_sums = x2.reshape(r, groups, group).sum(-1)  # [R, G]
    return y + jnp.einsum("rg,og->ro", group_sums, zero, precision=jax.lax.Precision.HIGHEST)


# --------------------------------------------------------------------------------------------------
# Quantizing (numpy, once; the result is cached)
# --------------------------------------------------------------------------------------------------


def check_groups(name: str, n_in: int, group: int) -> None:
    """An int4 matrix's inputs split into whole groups, or a clear error."""
    if n_in % group:
        raise ConfigError(
            f"{name}: input size {n_in} is not a multiple of the int4 group size {group}; "
            f"choose a group size that divides it (e.g. 32 or 64)"
        )


def quantize_matrix(w: np.ndarray, fmt: str, group: int = DEFAULT_GROUP, name: str = "matrix") -> QuantizedMatrix:
    """Quantize a float matrix ``w [out, in]`` (output-major) to ``fmt``."""
    check_format(fmt, group)
    w = np.asarray(w, np.float32)
    if w.ndim != 2:
        raise ConfigError(f"{name}: can only quantize a 2-D matrix, got shape {w.shape}")
    if fmt in ("int8", "w8a8"):
        s = np.abs(w).max(axis=1) / 127.0
        s = np.where(s > 0, s, 1.0).astype(np.float32)
        q = np.clip(np.rint(w / s[:, None]), -127, 127).astype(np.int8)
        return QuantizedMatrix(jnp.asarray(q), jnp.asarray(s), None, fmt)
    o, n_in = w.shape
    check_groups(name, n_in, group)
    g = w.reshape(o, n_in // group, group)
    lo, hi = g.min(-1), g.max(-1)
    d = (hi - lo) / 15.0
    d = np.where(d > 0, d, 1.0).astype(np.float32)
    q = np.clip(np.rint((g - lo[..., None]) / d[..., None]), 0, 15).astype(np.uint8).reshape(o, n_in)
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8)
    zero = (lo + 8 * d).astype(np.float32)
    return QuantizedMatrix(jnp.asarray(packed), jnp.asarray(d), jnp.asarray(zero), "int4", int(group))


def quantized_names(params) -> list[str]:
    """Canonical names of the matrices :func:`quantize_params` quantizes: every linear kernel and the
    embedding (norm weights stay float32)."""
    return [n for n in params.flat() if n == "embed" or n.rsplit(".", 1)[-1] in KERNELS]


def embedding_format(fmt: str) -> str:
    """The format the embedding (and tied output head) gets: int8 for int4, as llama.cpp keeps token
    embeddings and the output matrix at higher precision; otherwise the same format."""
    return "int8" if fmt == "int4" else fmt


def params_format(params) -> str | None:
    """ "int8" / "int4" / "w8a8": the format of the layers' matrices; None for float parameters."""
    for name, value in params.flat().items():
        if isinstance(value, QuantizedMatrix) and name != "embed":
            return value.fmt
    return None


def layer_errors(float_params, quant_params) -> list[tuple[str, float]]:
    """Relative Frobenius error ``|W_q - W| / |W|`` of every quantized matrix, in parameter-tree order
    (the embedding first)."""
    f, q = float_params.flat(), quant_params.flat()
    out = []
    for name, value in q.items():
        if isinstance(value, QuantizedMatrix):
            w = np.asarray(f[name], np.float32)
            w = w if name == "embed" else w.T
            d = np.asarray(value.dequantize())
            out.append((name, float(np.linalg.norm(d - w) / max(np.linalg.norm(w), 1e-30))))
    return out
