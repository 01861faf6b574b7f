"""Converted parameters, cached: a model file is dequantized once, later loads read a safetensors file.

Dequantizing the embedded GGUF takes a few seconds; reading the converted float32 file back
(memory-mapped safetensors) takes well under a second. The file's name carries a hash of the source
file's identity and of this converter's version, so a changed source or converter never serves stale
weights. Stored in ``<cache folder>/params/``.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from jaxlab.errors import ModelFileError
from jaxlab.io.config import LlamaConfig

FORMAT_VERSION = 1  # bump when the mapping from model files to parameters changes


def source_key(path: Path, extra: str = "", cache: Path | None = None) -> str:
    """The source file's identity: where it is, its size and time, the converter's version. A source inside the
    cache folder (the embedded model's copy) is named relative to it, so a cache folder copied whole (a
    classroom's wheelhouse, with times kept) still finds its converted files."""
    p = Path(path).resolve()
    st = p.stat()
    where = str(p)
    if cache is not None and p.is_relative_to(Path(cache).resolve()):
        where = "cache:" + p.relative_to(Path(cache).resolve()).as_posix()
    ident = f"{where}|{st.st_size}|{st.st_mtime_ns}|v{FORMAT_VERSION}|{extra}"
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def params_file(cache: Path, source: Path, extra: str = "") -> Path:
    return cache / "params" / f"{Path(source).stem}-{source_key(source, extra, cache)}.safetensors"


def save(path: Path, cfg: LlamaConfig, flat: dict[str, np.ndarray]) -> None:
    from dataclasses import asdict

    from safetensors.numpy import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".partial")
    save_file(
        {k: np.ascontiguousarray(v, np.float32) for k, v in flat.items()},
        str(tmp),
        metadata={"config": json.dumps(asdict(cfg))},
    )
    os.replace(tmp, path)


def load(path: Path) -> tuple[LlamaConfig, dict[str, np.ndarray]]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            cfg = LlamaConfig(**json.loads(f.metadata()["config"]))
            flat = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:
        raise ModelFileError(f"cached parameter file {path} is unreadable ({e}); delete it to rebuild") from None
    return cfg, flat
