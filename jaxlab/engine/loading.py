"""One door to a model: a name or a path in; config, parameters and tokenizer out.

``load()`` accepts
* nothing or ``"smollm2-135m"`` — the embedded SmolLM2-135M-Instruct GGUF (Q4_1 weights, Q8_0 embedding);
* a path to a ``.gguf`` file;
* a local folder with ``config.json`` + ``*.safetensors`` (a Hugging Face checkpoint);
* a Hugging Face hub id such as ``HuggingFaceTB/SmolLM2-135M-Instruct`` (needs the network). The hub
  holds the original bf16 weights, so its outputs differ slightly from the embedded Q4_1 file.

GGUF weights are dequantized once and cached as a float32 safetensors file (see
:mod:`jaxlab.io.param_cache`), so later loads take well under 2 s.

``dtype="auto"`` (the default) is the backend's default (:func:`jaxlab.engine.model.backend_default_dtype`):
float32 on a CPU (the parity path), bfloat16 on TPU and on GPUs of compute capability >= 8.0, float32 on
older GPUs; "float32" or "bfloat16" override it.

``quant="int8" | "int4" | "w8a8"`` (:mod:`jaxlab.quant`) quantizes the float32 parameters once and
caches the result beside the float file (GGUF files and local folders; a hub id is quantized on every
load), so a later load reads the quantized file without touching the float weights. A quantized model
computes in float32 on every backend (:data:`jaxlab.quant.COMPUTES_IN`), so ``dtype="auto"`` with
``quant`` means float32.

:class:`ModelOptions` is what the faces ask for (``jaxlab generate``/``chat``/``serve``, ``jaxlab bench``): the
model and how to run it, checked once when built, each problem named by its flag; :func:`load_model` loads it.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jaxlab import quant as quantization
from jaxlab.engine.model import Params, backend_default_dtype, default_policy, params_from_flat
from jaxlab.errors import ConfigError, InvalidRequestError, ModelFileError
from jaxlab.io import assets, param_cache


@dataclass
class Model:
    """A loaded model: ``params`` (a pytree for :func:`jaxlab.engine.model.forward`) and its ``tokenizer``."""

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


def resolve_dtype(dtype: str = "auto", quant: str | None = None, backend: str | None = None) -> str:
    """The dtype a load will use: ``dtype`` itself, or for "auto" the backend's default — float32 when
    ``quant`` is set, since a quantized model computes in float32 on every backend."""
    if dtype != "auto":
        return dtype
    return "float32" if quant is not None else backend_default_dtype(backend)


def check_quant(quant: str | None, group_size: int = quantization.DEFAULT_GROUP, dtype: str = "auto") -> None:
    """Raise :class:`ConfigError` for a quantization request that cannot run."""
    quantization.check_format(quant, group_size)
    if quant is not None and dtype not in ("float32", "auto"):
        raise ConfigError(
            f"quantization ({quant}) starts from float32 parameters and computes in "
            f"{quantization.COMPUTES_IN[quant]}; load with dtype='float32' (drop dtype={dtype!r}); "
            "dtype='auto' loads float32 with quant"
        )


def quant_cache_key(quant: str, group_size: int = quantization.DEFAULT_GROUP) -> str:
    """The ``extra`` part of a quantized parameter file's cache key: the group size counts for int4 only
    (int8 and w8a8 are per channel), so int8 files never differ by group."""
    group = f"-g{group_size}" if quant == "int4" else ""
    if quant == "w8a8":  # calibrated: a changed calibration text or alpha must not serve stale factors
        import hashlib

        text = hashlib.sha256(quantization.calibration_text().encode()).hexdigest()[:12]
        group = f"-a{quantization.SMOOTH_ALPHA}-c{text}"
    return f"quant-{quant}{group}-v{quantization.STORE_VERSION}"


def _folder_identity(folder: Path) -> str:
    """The files a checkpoint folder is read from, with sizes and times: a folder's own mtime does not
    change when a file in it is rewritten in place."""
    files = sorted(folder.glob("*.safetensors")) + [folder / "config.json"]
    return "|".join(f"{f.name}:{st.st_size}:{st.st_mtime_ns}" for f in files if f.exists() for st in [f.stat()])


def _float_params(kind, loc, policy, progress, use_cache):
    if kind == "gguf":
        from jaxlab.io.gguf import load_gguf

        cached = param_cache.params_file(assets.cache_dir(), Path(loc)) if use_cache else None
        if cached is not None and cached.exists():
            cfg, flat = param_cache.load(cached)
        else:
            cfg, flat = load_gguf(loc, progress=progress)
            if cached is not None:
                try:
                    param_cache.save(cached, cfg, flat)
                except OSError:
                    pass  # read-only cache: still usable, just slower next time
    else:
        from jaxlab.io.hf import load_hf

        cfg, flat = load_hf(loc, progress=progress)
    return params_from_flat(cfg, flat, policy, source=str(loc))


def load_params(
    model=None,
    dtype: str = "auto",
    progress: bool | None = None,
    use_cache: bool = True,
    quant: str | None = None,
    group_size: int = quantization.DEFAULT_GROUP,
):
    """-> (Params, kind, location). Converted GGUF parameters are cached in the cache folder, and so are
    quantized ones (``quant``: one of :data:`jaxlab.quant.FORMATS`; ``group_size``: int4 only).
    ``dtype``: "auto" (the backend's default, see :func:`resolve_dtype`), "float32" or "bfloat16"."""
    check_quant(quant, group_size, dtype)
    kind, loc = resolve(model)
    policy = default_policy(resolve_dtype(dtype, quant))
    qfile = None
    if quant is not None and use_cache and kind != "hub":
        extra = quant_cache_key(quant, group_size)
        if kind == "hf-folder":
            extra += "|" + _folder_identity(Path(loc))
        qfile = param_cache.params_file(assets.cache_dir(), Path(loc), extra=extra)
        if qfile.exists():
            return quantization.load(qfile, policy), kind, loc
    params = _float_params(kind, loc, policy, progress, use_cache)
    if quant is not None:
        tokenizer = load_tokenizer(kind, loc) if quant == "w8a8" else None  # w8a8 is calibrated on a text
        params = quantization.quantize_model(params, tokenizer, quant, group_size, progress=progress)
        if qfile is not None:
            try:
                quantization.save(qfile, params)
            except OSError:
                pass  # read-only cache: still usable, just slower next time
    return params, kind, loc


def load_tokenizer(kind: str, loc):
    from jaxlab.io.tokenizer import Tokenizer

    if kind == "gguf":
        return Tokenizer.from_gguf(loc)
    if kind == "hub":
        from jaxlab.io.hf import snapshot

        loc = snapshot(loc)
    return Tokenizer.from_hf(loc)


def load(
    model: str | os.PathLike | None = None,
    dtype: str = "auto",
    progress: bool | None = None,
    quant: str | None = None,
    group_size: int = quantization.DEFAULT_GROUP,
) -> Model:
    """Load a model and its tokenizer (see the module docstring for what ``model`` may be);
    ``dtype="auto"`` is the backend's default (float32 on a CPU, bfloat16 on TPU and GPUs with bfloat16
    tensor cores); ``quant`` ("int8", "int4", "w8a8") gives quantized parameters, cached after the
    first load, computing in float32."""
    params, kind, loc = load_params(model, dtype=dtype, progress=progress, quant=quant, group_size=group_size)
    return Model(
        params=params,
        tokenizer=load_tokenizer(kind, loc),
        source=str(model or assets.DEFAULT_MODEL),
        path=Path(loc) if kind != "hub" else None,
    )


@dataclass(frozen=True)
class ModelOptions:
    """The model and how to run it: the model flags of ``jaxlab generate``, ``chat`` and ``serve`` (and the model
    of ``jaxlab bench``), checked when built. A combination that cannot work raises
    :class:`~jaxlab.errors.InvalidRequestError` naming the flag to drop, before anything loads."""

    model: str | None = None  # --model: embedded name, .gguf file, HF folder or hub id (None: the embedded one)
    dtype: str = "auto"  # --dtype: "auto" (see resolve_dtype), "float32" or "bfloat16"
    quant: str | None = None  # --quant: one of jaxlab.quant.FORMATS, or None (float weights)
    group_size: int | None = None  # --group-size: int4 only (None: jaxlab.quant.DEFAULT_GROUP)
    kv_cache: str | None = None  # --kv-cache: one of jaxlab.quant.KV_FORMATS (None: the parameters' dtype)
    attention: str = "xla"  # --attention: one of jaxlab.engine.model.ATTENTIONS
    adapter: str | None = None  # --adapter: a LoRA adapter folder, merged into the float weights
    mesh: str | None = None  # --mesh: a device mesh spec such as "data=2,model=4" (sharded, float only)
    speculative: str | None = None  # --speculative: "ngram" or "draft"
    draft_k: int = 4  # --draft-k: draft tokens verified per call (with --speculative)

    def __post_init__(self):
        self.check()

    def check(self) -> None:
        """Raise :class:`InvalidRequestError` for flags that cannot work (together): one line saying what to do."""
        from jaxlab.engine.model import ATTENTIONS
        from jaxlab.io.config import DTYPES

        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise InvalidRequestError(
                f"unknown --dtype {self.dtype!r}; choose one of auto, {', '.join(sorted(DTYPES))}"
            )
        if self.quant is not None and self.quant not in quantization.FORMATS:
            raise InvalidRequestError(
                f"unknown --quant {self.quant!r}; choose one of {', '.join(quantization.FORMATS)}"
            )
        if self.kv_cache is not None and self.kv_cache not in quantization.KV_FORMATS:
            raise InvalidRequestError(
                f"unknown --kv-cache {self.kv_cache!r}; choose one of {', '.join(quantization.KV_FORMATS)}"
            )
        if self.attention not in ATTENTIONS:
            raise InvalidRequestError(f"unknown --attention {self.attention!r}; choose one of {', '.join(ATTENTIONS)}")
        if self.group_size is not None and self.quant != "int4":
            raise InvalidRequestError(
                f"--group-size applies to --quant int4 only; drop --group-size (got --quant {self.quant or '(none)'})"
            )
        if self.quant and self.dtype not in ("float32", "auto"):
            raise InvalidRequestError(
                f"--quant {self.quant} computes in float32; drop --dtype {self.dtype} (or pass --dtype float32 or auto)"
            )
        quantization.check_format(self.quant, self.group)
        dtype = self.param_dtype
        kv = self.kv_cache if self.kv_cache not in (None, dtype) else None  # a cache unlike the parameters
        if self.mesh and (self.quant or kv):
            drop = [f for f, on in (("--quant", self.quant), (f"--kv-cache {kv}", kv)) if on]
            raise InvalidRequestError(
                f"--mesh shards float parameters with a KV cache of their dtype; drop {' and '.join(drop)}"
            )
        if self.attention == "pallas" and (kv == "int8" or self.mesh):
            raise InvalidRequestError(
                "--attention pallas runs on one device with a float KV cache; drop --kv-cache int8 and --mesh"
            )
        if self.speculative and kv == "int8":
            # measured: the verify pass computes k+1 keys/values at once, and rounding them to int8 turns its
            # float round-off into different cache entries, so near-ties go the other way than in plain greedy
            raise InvalidRequestError(
                "--speculative gives plain greedy's tokens only with a float KV cache; drop --kv-cache int8"
            )
        if self.speculative and kv:
            raise InvalidRequestError(
                f"--speculative keeps its KV cache in the --dtype ({dtype}); drop --kv-cache {kv}"
            )
        if self.mesh and self.speculative:
            raise InvalidRequestError("--mesh and --speculative cannot be combined")
        if self.speculative and self.draft_k < 1:
            raise InvalidRequestError(f"--draft-k must be >= 1, got {self.draft_k}")
        if self.adapter and self.quant:
            raise InvalidRequestError(
                "--adapter with --quant is not supported: the adapter is merged into float weights "
                "(export the merged model, then quantize it, or drop --quant)"
            )

    @property
    def group(self) -> int:
        """The int4 group size to load with (--group-size, else the default)."""
        return quantization.DEFAULT_GROUP if self.group_size is None else self.group_size

    @property
    def param_dtype(self) -> str:
        """The parameters' dtype: --dtype, with "auto" resolved for this backend (:func:`resolve_dtype`)."""
        return resolve_dtype(self.dtype, self.quant)

    @property
    def cache_dtype(self):
        """The KV cache's dtype: --kv-cache, else the parameters' dtype."""
        import jax.numpy as jnp

        return jnp.dtype(self.kv_cache or self.param_dtype)

    def dtype_note(self) -> str | None:
        """A line for the user where ``--dtype auto`` with --quant loads float32 although this backend's default
        is another dtype; else None."""
        backend = backend_default_dtype()
        if self.dtype != "auto" or not self.quant or backend == self.param_dtype:
            return None
        return (
            f"--quant {self.quant} computes in {quantization.COMPUTES_IN[self.quant]}: "
            f"loading float32 parameters, not this backend's default {backend}"
        )

    def replace(self, **changes) -> ModelOptions:
        """A copy with ``changes``, checked again."""
        return dataclasses.replace(self, **changes)


def load_model(options: ModelOptions, progress: bool | None = None) -> Model:
    """The model ``options`` ask for (:func:`load`), computing attention with ``options.attention``. The adapter
    (``options.adapter``) is not merged here: merging is training's (``jaxlab.train.lora.merge_folder``)."""
    from jaxlab.engine.model import with_attention

    m = load(options.model, dtype=options.param_dtype, quant=options.quant, group_size=options.group, progress=progress)
    return dataclasses.replace(m, params=with_attention(m.params, options.attention))
