"""Quantized parameters on disk: like the float parameters (:mod:`jaxlab.io.param_cache`), one safetensors file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from jaxlab.engine.model import params_from_flat
from jaxlab.errors import ConfigError, ModelFileError
from jaxlab.io.config import LlamaConfig
from jaxlab.quant.formats import STORE_VERSION, QuantizedMatrix, params_format


def save(path: Path, params) -> None:
    """Write quantized parameters: each matrix as ``<name>.q``, ``<name>.scale`` (, ``<name>.zero``,
    ``<name>.smooth``)."""
    from dataclasses import asdict

    from safetensors.numpy import save_file

    fmt = params_format(params)
    arrays, groups = {}, {}
    for name, value in params.flat().items():
        if isinstance(value, QuantizedMatrix):
            arrays[f"{name}.q"] = np.asarray(value.q)
            arrays[f"{name}.scale"] = np.asarray(value.scale)
            if value.zero is not None:
                arrays[f"{name}.zero"] = np.asarray(value.zero)
            if value.smooth is not None:
                arrays[f"{name}.smooth"] = np.asarray(value.smooth)
            groups[name] = [value.fmt, value.group]
        else:
            arrays[name] = np.asarray(value)
    meta = {
        "config": json.dumps(asdict(params.config)),
        "format": fmt or "float32",
        "groups": json.dumps(groups),
        "version": str(STORE_VERSION),
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".partial")
    save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, str(tmp), metadata=meta)
    os.replace(tmp, path)


def load(path: Path, policy=None):
    """Read what :func:`save` wrote -> :class:`~jaxlab.engine.model.Params`."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata()
            cfg = LlamaConfig(**json.loads(meta["config"]))
            groups = json.loads(meta["groups"])
            if meta.get("version") != str(STORE_VERSION):
                raise ValueError(f"store version {meta.get('version')}, expected {STORE_VERSION}")
            arrays = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:
        raise ModelFileError(f"quantized parameter file {path} is unreadable ({e}); delete it to rebuild") from None

    def part(key):  # host arrays: params_from_flat places them (jaxlab.engine.hugepages)
        return arrays.get(key)

    flat = {}
    for name, (mfmt, group) in groups.items():
        q, scale = part(f"{name}.q"), part(f"{name}.scale")
        if q is None or scale is None:
            raise ModelFileError(f"quantized parameter file {path} lacks {name}.q or .scale; delete it to rebuild")
        flat[name] = QuantizedMatrix(q, scale, part(f"{name}.zero"), mfmt, int(group), part(f"{name}.smooth"))
    stored = {f"{n}.{p}" for n in groups for p in ("q", "scale", "zero", "smooth")}
    flat.update((k, v) for k, v in arrays.items() if k not in stored)
    try:
        return params_from_flat(cfg, flat, policy, source=str(path))
    except ConfigError as e:
        raise ModelFileError(
            f"quantized parameter file {path} does not fit its config ({e}); delete it to rebuild"
        ) from None
