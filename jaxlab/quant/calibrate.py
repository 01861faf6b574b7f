"""Calibration and quantizing a model: activation statistics, SmoothQuant factors, and
:func:`quantize_params` / :func:`quantize_model`, which turn float parameters into quantized ones."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxlab.engine import hugepages
from jaxlab.engine.model import Params, forward, param_name
from jaxlab.errors import ConfigError
from jaxlab.io.assets import data_file
from jaxlab.quant.formats import (
    DEFAULT_GROUP,
    QuantizedMatrix,
    check_format,
    check_groups,
    embedding_format,
    quantize_matrix,
    quantized_names,
)

Array = jax.Array


class _Probe:
    """Calibration stand-in for a float matrix ``W [out, in]``: computes ``x W^T`` and records the
    largest ``|x|`` seen on each input channel. Eager only (see :func:`activation_stats`)."""

    def __init__(self, w_oi: Array, name: str, stats: dict):
        self.w, self.name, self.stats = w_oi, name, stats

    def dot(self, x: Array, policy=None) -> Array:
        a = np.abs(np.asarray(x, np.float32)).reshape(-1, x.shape[-1]).max(0)
        prev = self.stats.get(self.name)
        self.stats[self.name] = a if prev is None else np.maximum(prev, a)
        return jnp.einsum("...i,oi->...o", x, self.w, precision=jax.lax.Precision.HIGHEST)

    def rows(self, ids: Array) -> Array:
        return jnp.take(self.w, ids, axis=0)


def activation_stats(params, tokens, positions) -> dict[str, np.ndarray]:
    """``{matrix name: max |input| per input channel}`` over a calibration batch (one eager forward).

    The embedding's entry is the input of the tied output head (the final norm's output)."""

    names = set(quantized_names(params))
    stats: dict[str, np.ndarray] = {}
    out = []
    for path, var in nnx.to_flat_state(params.state):
        name, value = param_name(path), var.get_value()
        if name in names:
            value = _Probe(value if name == "embed" else value.T, name, stats)
        out.append((path, var.replace(value)))
    with jax.disable_jit():
        forward(Params(params.graphdef, nnx.from_flat_state(out)), jnp.asarray(tokens), jnp.asarray(positions))
    return stats


def smoothing_factors(act_max: np.ndarray, w_oi: np.ndarray, alpha: float) -> np.ndarray:
    """SmoothQuant's per-input-channel factors ``s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)``:
    ``x W^T = (x / s)(W s)^T`` exactly, and with ``alpha`` ~ 0.5 the outlier channels of ``x`` are
    shared with ``W``, so one int8 scale per token no longer has to span them."""
    w_max = np.abs(w_oi).max(axis=0)
    s = np.power(np.maximum(act_max, 1e-5), alpha) / np.power(np.maximum(w_max, 1e-5), 1 - alpha)
    return np.clip(s, 1e-4, 1e4).astype(np.float32)


SMOOTH_ALPHA = 0.5  # SmoothQuant's default; the lowest KL of 0.3 / 0.4 / 0.5 / 0.55 / 0.7 (NOTES.md §8)


CALIBRATION_WINDOW = 256


def calibration_text() -> str:
    """The text W8A8's activation statistics are fitted on (``data/calibration/calibration.txt``): prose,
    a chat exchange, code, numbers; written for jaxlab and distinct from the evaluation text."""

    return data_file("calibration", "calibration.txt").read_text(encoding="utf-8")


def calibration_stats(params, tokenizer, text: str | None = None, window: int = CALIBRATION_WINDOW) -> dict:
    """:func:`activation_stats` over ``text`` (default :func:`calibration_text`) cut into windows."""
    ids = tokenizer.encode(text if text is not None else calibration_text())
    n = max(1, len(ids) // window)
    if len(ids) < window:
        window = len(ids)
    tokens = np.array([ids[i * window : (i + 1) * window] for i in range(n)], np.int32)
    positions = np.broadcast_to(np.arange(window, dtype=np.int32), tokens.shape)
    return activation_stats(params, tokens, positions)


def quantize_model(params, tokenizer, fmt: str, group: int = DEFAULT_GROUP, *, progress: bool | None = None):
    """What ``jaxlab.load(quant=...)`` and the CLI use: :func:`quantize_params`, with W8A8 calibrated
    on :func:`calibration_text` and smoothed (SmoothQuant, ``alpha`` = :data:`SMOOTH_ALPHA`)."""
    check_format(fmt, group)
    stats = calibration_stats(params, tokenizer) if fmt == "w8a8" else None
    return quantize_params(params, fmt, group, calibration=stats, progress=progress)


def quantize_params(
    params,
    fmt: str,
    group: int = DEFAULT_GROUP,
    *,
    embed: str | None = None,
    calibration: dict | None = None,
    alpha: float = SMOOTH_ALPHA,
    progress: bool | None = None,
):
    """Float :class:`~jaxlab.engine.model.Params` -> the same model with quantized matrices (same graph,
    so ``forward`` and ``Generator`` take them unchanged). ``embed``: the embedding's format
    (default :func:`embedding_format`; "float32" keeps it float)."""

    check_format(fmt, group)
    embed = embed or embedding_format(fmt)
    if embed != "float32":
        check_format(embed, group)
    if params.policy.dtype != "float32":
        raise ConfigError(f"quantize float32 parameters (load with dtype='float32'); these are {params.policy.dtype}")
    names = set(quantized_names(params))
    flat_state = nnx.to_flat_state(params.state)
    already = [param_name(p) for p, v in flat_state if isinstance(v.get_value(), QuantizedMatrix)]
    if already:
        raise ConfigError(f"parameters are already quantized ({already[0]} ...); quantize float parameters")
    bar = _progress(len(names), f"quantizing to {fmt}", progress)

    def quantize(name, value, mfmt):
        if mfmt != "float32":
            w = np.asarray(value) if name == "embed" else np.asarray(value).T
            smooth = None
            if mfmt == "w8a8" and calibration is not None:
                smooth = smoothing_factors(calibration[name], w, alpha)
                w = w * smooth
            value = quantize_matrix(w, mfmt, group, name)
            if smooth is not None:
                value = dataclasses.replace(value, smooth=jnp.asarray(smooth))
        bar.update(1)
        return value

    out = _each_matrix(params, fmt, embed, quantize)
    bar.close()
    return Params(out.graphdef, hugepages.put(out.state))  # on a CPU in 2 MB pages, as loaded weights are


def quantized_shapes(params, fmt: str, group: int = DEFAULT_GROUP, *, embed: str | None = None):
    """:func:`quantize_params`' result as shapes only, from float parameters that may be shapes themselves
    (``jax.eval_shape``): what a quantized model of any size holds, with no weights (``jaxlab compile``)."""
    check_format(fmt, group)
    f32, sds = jnp.float32, jax.ShapeDtypeStruct

    def shapes(name, value, mfmt):
        if mfmt == "float32":
            return value
        o, n_in = value.shape if name == "embed" else value.shape[::-1]  # stored [out, in], as quantize_matrix
        if mfmt != "int4":
            return QuantizedMatrix(sds((o, n_in), jnp.int8), sds((o,), f32), None, mfmt)
        check_groups(name, n_in, group)
        groups = sds((o, n_in // group), f32)
        return QuantizedMatrix(sds((o, n_in // 2), jnp.uint8), groups, groups, mfmt, group)

    return _each_matrix(params, fmt, embed or embedding_format(fmt), shapes)


def _each_matrix(params, fmt: str, embed: str, fn) -> Params:
    """The model with each matrix :func:`quantized_names` lists replaced by ``fn(name, value, its format)`` (the
    embedding's format is ``embed``, the others' ``fmt``; "float32" means left float)."""
    names = set(quantized_names(params))
    out = []
    for path, var in nnx.to_flat_state(params.state):
        name, value = param_name(path), var.get_value()
        if name in names:
            value = fn(name, value, embed if name == "embed" else fmt)
        out.append((path, var.replace(value)))
    return Params(params.graphdef, nnx.from_flat_state(out))


def _progress(total: int, desc: str, progress: bool | None):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="matrix", disable=not progress, leave=False)
