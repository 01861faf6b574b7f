"""Quantization: formats, calibration, storage and quality, plugged into the engine's linear layers
through one hook (:class:`~jaxlab.quant.formats.QuantizedMatrix`; see :mod:`jaxlab.quant.formats`).

* :mod:`~jaxlab.quant.formats` — the quantized matrix, its matmuls, ``quantize_matrix`` (what the engine imports)
* :mod:`~jaxlab.quant.calibrate` — activation statistics, SmoothQuant, ``quantize_params`` / ``quantize_model``
* :mod:`~jaxlab.quant.quant_cache` — quantized parameters on disk (the quantized-parameter cache)
* :mod:`~jaxlab.quant.quality` — perplexity, KL and greedy agreement of a quantized model against float32

The formats are imported here; the other modules load on first use of one of their names, because they
build on the engine, which itself imports :mod:`jaxlab.quant.formats` (an eager import would be a cycle).
"""

from __future__ import annotations

import importlib

from jaxlab.quant.formats import (
    COMPUTES_IN,
    DEFAULT_GROUP,
    FORMATS,
    KERNELS,
    KV_FORMATS,
    STORE_VERSION,
    QuantizedMatrix,
    check_format,
    embedding_format,
    join_split,
    layer_errors,
    params_format,
    quantize_activations,
    quantize_matrix,
    quantized_names,
    split_activations,
    unpack_int4,
)

_LAZY = {
    "activation_stats": "calibrate",
    "smoothing_factors": "calibrate",
    "SMOOTH_ALPHA": "calibrate",
    "CALIBRATION_WINDOW": "calibrate",
    "calibration_text": "calibrate",
    "calibration_stats": "calibrate",
    "quantize_model": "calibrate",
    "quantize_params": "calibrate",
    "quantized_shapes": "calibrate",
    "save": "quant_cache",
    "load": "quant_cache",
}
__all__ = [
    "FORMATS",
    "KV_FORMATS",
    "DEFAULT_GROUP",
    "STORE_VERSION",
    "KERNELS",
    "COMPUTES_IN",
    "check_format",
    "QuantizedMatrix",
    "quantize_activations",
    "split_activations",
    "join_split",
    "quantize_matrix",
    "quantized_names",
    "embedding_format",
    "params_format",
    "layer_errors",
    "unpack_int4",
    *_LAZY,
]


def __getattr__(name: str):
    if name in ("calibrate", "quant_cache", "quality"):
        return importlib.import_module(f"jaxlab.quant.{name}")
    if name in _LAZY:
        return getattr(importlib.import_module(f"jaxlab.quant.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'jaxlab.quant' has no attribute {name!r}")
