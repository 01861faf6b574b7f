"""Checks for notebook 09's exercises: per-channel int8 weights, packing two 4-bit codes per byte, and
the W8A8 integer matmul with per-token activation scales.

* ``my_quantize_int8(w [out, in])`` -> ``(q int8 [out, in], scale float32 [out])``: symmetric per output
  channel, ``scale = max |w[o]| / 127`` (1.0 for an all-zero row), ``q = round(w / scale)``.
  Reference: :func:`jaxlab.quant.quantize_matrix` (``"int8"``).
* ``my_pack_int4(codes uint8 [R, 2n])`` -> ``packed uint8 [R, n]`` (input ``2j`` in the low nibble of byte
  ``j``, input ``2j + 1`` in the high one) and ``my_unpack_int4(packed)`` -> ``codes``: jaxlab's int4
  layout (:class:`jaxlab.quant.QuantizedMatrix`).
* ``my_w8a8_matmul(x [R, I], q int8 [O, I], w_scale [O])`` -> ``y [R, O]``: each row of ``x`` quantized
  to int8 with its own scale ``max |x[r]| / 127``, an integer matmul (int32 sums), then both scales.
  Reference: :meth:`jaxlab.quant.QuantizedMatrix.dot` (``"w8a8"``).

Random inputs keep every value a safe distance from a rounding tie (``k + u`` steps, ``|u| <= 0.4``), so
any correct rounding (NumPy's, JAX's, float32 or float64) gives exactly the reference's integers.
"""

from __future__ import annotations

import numpy as np

from jaxlab.lab.exercises import check_function


def _on_grid(rng, rows: int, cols: int, scales: np.ndarray) -> np.ndarray:
    """Rows ``scale[r] * (k + u)``, k integer in [-126, 126], |u| <= 0.4, one entry per row at exactly
    +-127 steps (the row's maximum, so its scale is ``scale[r]``)."""
    steps = rng.integers(-126, 127, size=(rows, cols)) + rng.uniform(-0.4, 0.4, size=(rows, cols))
    steps[np.arange(rows), rng.integers(0, cols, size=rows)] = rng.choice([-127.0, 127.0], size=rows)
    return (scales[:, None] * steps).astype(np.float32)


# -- 1. per-channel int8 ---------------------------------------------------------------------------


def reference_quantize_int8(w):
    from jaxlab.quant import quantize_matrix

    m = quantize_matrix(np.asarray(w, np.float32), "int8")
    return np.asarray(m.q), np.asarray(m.scale)


def _int8_inputs(rng):
    o, i = int(rng.integers(3, 12)), int(rng.integers(4, 40))
    w = _on_grid(rng, o, i, 10.0 ** rng.uniform(-4, 0, size=o))
    if rng.random() < 0.5:
        w[int(rng.integers(0, o))] = 0.0  # an all-zero row: its scale is 1.0
    return (w,)


def _int8_output(result):
    q, scale = result
    q = np.asarray(q)
    if q.dtype != np.int8:
        raise TypeError(f"q has dtype {q.dtype}; store it as int8 (that is the point: 1 byte per weight)")
    return q, np.asarray(scale, np.float32)


def check_quantize_int8(fn, trials: int = 8) -> bool:
    return check_function(
        lambda w: _int8_output(fn(w.copy())),
        reference_quantize_int8,
        _int8_inputs,
        name="per-channel int8 weights",
        trials=trials,
        atol=0.0,
        rtol=1e-6,
    )


# -- 2. two 4-bit codes per byte ------------------------------------------------------------------


def reference_pack_int4(codes):
    codes = np.asarray(codes, np.uint8)
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)


def reference_unpack_int4(packed):
    packed = np.asarray(packed, np.uint8)
    return np.stack([packed & 15, packed >> 4], axis=-1).reshape(packed.shape[0], -1)


def _codes_inputs(rng):
    return (rng.integers(0, 16, size=(int(rng.integers(1, 6)), 2 * int(rng.integers(1, 10)))).astype(np.uint8),)


def _packed_inputs(rng):
    return (rng.integers(0, 256, size=(int(rng.integers(1, 6)), int(rng.integers(1, 10)))).astype(np.uint8),)


def _u8(x):
    x = np.asarray(x)
    if x.dtype != np.uint8:
        raise TypeError(f"got dtype {x.dtype}; return uint8 (bytes)")
    return x


def check_pack_int4(pack, unpack, trials: int = 8) -> bool:
    """Both directions; ``unpack`` must undo ``pack``. Prints a line for each."""
    ok_pack = check_function(
        lambda c: _u8(pack(c.copy())),
        reference_pack_int4,
        _codes_inputs,
        name="int4 packing (two codes per byte)",
        trials=trials,
    )
    ok_unpack = check_function(
        lambda p: np.asarray(unpack(p.copy())).astype(np.int64),
        lambda p: reference_unpack_int4(p).astype(np.int64),
        _packed_inputs,
        name="int4 unpacking",
        trials=trials,
    )
    return ok_pack and ok_unpack


# -- 3. the W8A8 matmul ---------------------------------------------------------------------------


def reference_w8a8_matmul(x, q, w_scale):
    import jax.numpy as jnp

    from jaxlab.quant import QuantizedMatrix

    m = QuantizedMatrix(jnp.asarray(q, jnp.int8), jnp.asarray(w_scale, jnp.float32), None, "w8a8")
    return np.asarray(m.dot(jnp.asarray(x, jnp.float32)))


def _w8a8_inputs(rng):
    r, i, o = int(rng.integers(1, 6)), int(rng.integers(8, 65)), int(rng.integers(3, 17))
    x = _on_grid(rng, r, i, 10.0 ** rng.uniform(-3, 0, size=r))  # rows of very different sizes
    q = rng.integers(-127, 128, size=(o, i)).astype(np.int8)
    return x, q, rng.uniform(1e-3, 1e-2, size=o).astype(np.float32)


def check_w8a8_matmul(fn, trials: int = 8) -> bool:
    return check_function(
        lambda x, q, s: np.asarray(fn(x.copy(), q.copy(), s.copy()), np.float32),
        reference_w8a8_matmul,
        _w8a8_inputs,
        name="W8A8 matmul (per-token int8 activations)",
        trials=trials,
        atol=1e-12,
        rtol=1e-5,
    )
