"""One door to a model: a name or a path in; config, parameters and tokenizer out.

``load()`` accepts
* nothing or ``"smollm2-135m"`` — the embedded SmolLM2-135M-Instruct GGUF (Q4_1 weights, Q8_0 embedding);
* a path to a ``.gguf`` file;
* a local folder with ``config.json`` + ``*.safetensors`` (a Hugging Face checkpoint);
* a Hugging Face hub id such as ``HuggingFaceTB/SmolLM2-135M-Instruct`` (needs the network). The hub
  holds the original bf16 weights, so its outputs differ slightly from the embedded Q4_1 file.

GGUF weights are dequantized once and cached as a float32 safetensors file (see
:mod:`jaxlab.weights.store`), so later loads take well under 2 s.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import assets
from .errors import ModelFileError
from .model import Params, default_policy, params_from_flat
from .weights import store


@dataclass
class Model:
    """A loaded model: ``params`` (a pytree for :func:`jaxlab.model.forward`) and its ``tokenizer``."""

    params: Params
    tokenizer: Any
    source: str  # what was asked for
    path: Path | None  # the file or folder it came from

    @property
    def config(self):
        return self.params.config

    def __repr__(self):
        return f"Model({self.source!r}, {self.params!r})"


def resolve(model: str | os.PathLike | None) -> tuple[str, Path | str]:
    """-> (kind, location) with kind one of "gguf", "hf-folder", "hub"."""
    if model is None or str(model) in assets.EMBEDDED:
        return "gguf", assets.model_path(str(model or assets.DEFAULT_MODEL))
    p = Path(model).expanduser()
    if p.is_dir():
        return "hf-folder", p
    if p.suffix == ".gguf" or p.exists():
        if not p.exists():
            raise ModelFileError(f"model file not found: {p}")
        return "gguf", p
    text = str(model)
    if text.count("/") == 1 and not text.startswith((".", "/", "~")):
        return "hub", text
    raise ModelFileError(
        f"model {text!r} not found: give an embedded name ({', '.join(assets.EMBEDDED)}), "
        "a .gguf file, a folder with config.json + safetensors, or a hub id like HuggingFaceTB/SmolLM2-135M-Instruct"
    )


def load_params(model=None, dtype: str = "float32", progress: bool | None = None, use_cache: bool = True):
    """-> (Params, kind, location). Converted GGUF parameters are cached in the cache folder."""
    kind, loc = resolve(model)
    policy = default_policy(dtype)
    if kind == "gguf":
        from .weights.gguf import load_gguf

        cached = store.params_file(assets.cache_dir(), Path(loc)) if use_cache else None
        if cached is not None and cached.exists():
            cfg, flat = store.load(cached)
        else:
            cfg, flat = load_gguf(loc, progress=progress)
            if cached is not None:
                try:
                    store.save(cached, cfg, flat)
                except OSError:
                    pass  # read-only cache: still usable, just slower next time
    else:
        from .weights.hf import load_hf

        cfg, flat = load_hf(loc, progress=progress)
    return params_from_flat(cfg, flat, policy, source=str(loc)), kind, loc


def load_tokenizer(kind: str, loc):
    from .tokenizer import Tokenizer

    if kind == "gguf":
        return Tokenizer.from_gguf(loc)
    if kind == "hub":
        from .weights.hf import snapshot

        loc = snapshot(loc)
    return Tokenizer.from_hf(loc)


def load(model: str | os.PathLike | None = None, dtype: str = "float32", progress: bool | None = None) -> Model:
    """Load a model and its tokenizer (see the module docstring for what ``model`` may be)."""
    params, kind, loc = load_params(model, dtype=dtype, progress=progress)
    return Model(params=params, tokenizer=load_tokenizer(kind, loc), source=str(model or assets.DEFAULT_MODEL),
                 path=Path(loc) if kind != "hub" else None)
