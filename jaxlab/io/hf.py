"""Hugging Face Llama checkpoints (``config.json`` + ``*.safetensors``) -> jaxlab's parameter tree.

``load_hf(folder_or_repo_id)`` reads a local folder, or downloads a hub repository with
``huggingface_hub.snapshot_download`` (only ``config.json``, the other JSON files and the safetensors
shards). Single files and sharded checkpoints (``model.safetensors.index.json``) both load; float32,
float16 and bfloat16 tensors are read with ``safetensors`` (bfloat16 through ``ml_dtypes``) and
converted to float32, like the GGUF loader's output.

Names map one to one (``model.layers.{i}.self_attn.q_proj.weight`` -> ``layers.{i}.attn.wq`` ...) and
every projection is transposed from PyTorch's ``[out, in]`` to jaxlab's ``[in, out]``. There is no Q/K
permutation: Hugging Face checkpoints already use the "rotate half" RoPE layout of jaxlab's model (the
permutation only exists in GGUF files, see :mod:`jaxlab.io.gguf`).

:func:`write_hf` is the way back (``model.safetensors`` in float32, float16 or bfloat16, ``config.json``,
``generation_config.json``); :mod:`jaxlab.io.export` adds the tokenizer files.

The hub models ``HuggingFaceTB/SmolLM2-135M-Instruct`` and ``HuggingFaceTB/SmolLM2-360M-Instruct`` hold
the ORIGINAL bfloat16 weights. The lab's embedded model is a Q4_1 GGUF quantization of the 135M one,
so its outputs differ slightly from the hub checkpoint's (logits by a few percent, and greedy
continuations can part ways after some tokens): compare like with like.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from jaxlab.errors import ConfigError, ModelFileError
from jaxlab.io.config import LlamaConfig, from_hf_config, param_shapes

HUB_PATTERNS = ["config.json", "*.safetensors", "*.json"]
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)  # a buffer some old checkpoints saved; recomputed by the model
_FLOAT_DTYPES = ("float32", "float16", "bfloat16")


def _mapping(cfg: LlamaConfig) -> list[tuple[str, str, bool]]:
    """(HF tensor name, canonical name, transpose) for every parameter."""
    rows = [("model.embed_tokens.weight", "embed", False), ("model.norm.weight", "norm.weight", False)]
    if not cfg.tie_embeddings:
        rows.append(("lm_head.weight", "lm_head", True))
    for i in range(cfg.n_layers):
        h, c = f"model.layers.{i}.", f"layers.{i}."
        rows += [
            (h + "input_layernorm.weight", c + "attn_norm.weight", False),
            (h + "self_attn.q_proj.weight", c + "attn.wq", True),
            (h + "self_attn.k_proj.weight", c + "attn.wk", True),
            (h + "self_attn.v_proj.weight", c + "attn.wv", True),
            (h + "self_attn.o_proj.weight", c + "attn.wo", True),
            (h + "post_attention_layernorm.weight", c + "mlp_norm.weight", False),
            (h + "mlp.gate_proj.weight", c + "mlp.w_gate", True),
            (h + "mlp.up_proj.weight", c + "mlp.w_up", True),
            (h + "mlp.down_proj.weight", c + "mlp.w_down", True),
        ]
    return rows


def _looks_like_repo_id(s: str) -> bool:
    """ "org/name" (or "name"): no leading ./ ~ /, no backslash, at most one slash."""
    return bool(s) and not s.startswith((".", "/", "~")) and "\\" not in s and s.count("/") <= 1


def _download(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError:  # pragma: no cover - a pinned dependency
        raise ModelFileError("huggingface_hub is not installed; install it or use the embedded model") from None
    hint = "offline, use the embedded model (the default) or a local folder with config.json + *.safetensors"
    try:
        return Path(snapshot_download(repo_id, allow_patterns=HUB_PATTERNS))
    except KeyboardInterrupt:
        raise
    except Exception as e:
        kind = type(e).__name__
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        if kind in ("RepositoryNotFoundError", "GatedRepoError", "RevisionNotFoundError", "HFValidationError"):
            what = f"the Hugging Face hub has no accessible repository {repo_id!r}"
        else:
            what = (
                f"{repo_id!r} is not a local folder and the Hugging Face hub could not be reached "
                "(or the repository does not exist)"
            )
        raise ModelFileError(f"{what} ({kind}: {msg}); {hint}") from None


def resolve_folder(folder_or_repo_id: str | os.PathLike) -> tuple[Path, str]:
    """(local checkpoint folder, model name), downloading ``folder_or_repo_id`` from the hub when it is a
    repo id rather than an existing folder."""
    path = Path(folder_or_repo_id).expanduser()
    if path.is_dir():
        return path, path.resolve().name or "hf"
    if path.exists():
        raise ModelFileError(
            f"{path} is a file; load_hf expects the folder holding config.json and *.safetensors "
            "(use load_gguf for a .gguf file)"
        )
    s = str(folder_or_repo_id)
    if not _looks_like_repo_id(s):
        raise ModelFileError(f"model folder not found: {path}")
    return _download(s), s.rsplit("/", 1)[-1]


def _read_config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    if not path.is_file():
        raise ModelFileError(
            f"{folder} has no config.json; a Hugging Face checkpoint folder holds config.json and *.safetensors"
        )
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelFileError(f"{path} cannot be read as JSON ({e}); the file is corrupt") from None
    if not isinstance(raw, dict):
        raise ModelFileError(f"{path} does not hold a JSON object")
    return raw


def hf_config(folder: Path, name: str | None = None, raw: dict[str, Any] | None = None) -> LlamaConfig:
    """The :class:`LlamaConfig` described by ``folder/config.json``; a non-Llama or unsupported model is a
    :class:`ModelFileError` naming the file."""
    raw = _read_config(folder) if raw is None else raw
    path = folder / "config.json"
    for key in ("attention_bias", "mlp_bias"):
        if raw.get(key):
            raise ModelFileError(f"{path}: {key}=true, but jaxlab's Llama model has no bias terms")
    rope = raw.get("rope_parameters") or {}
    if rope.get("rope_type", "default") not in (None, "default"):
        raise ModelFileError(f"{path}: rope_parameters {rope} are not supported by jaxlab's model (default RoPE only)")
    try:
        return from_hf_config(raw, name=name or folder.name or "hf")
    except ConfigError as e:
        raise ModelFileError(f"{path}: {e}") from None
    except (KeyError, TypeError, ValueError) as e:
        raise ModelFileError(f"{path}: a required field is missing or invalid ({type(e).__name__}: {e})") from None


def _shard_files(folder: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file that holds it."""
    import ml_dtypes  # noqa: F401  (registers numpy's "bfloat16" dtype, which safetensors' numpy backend needs)
    from safetensors import safe_open

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as e:
            raise ModelFileError(f"{index} cannot be read ({type(e).__name__}: {e}); the file is corrupt") from None
        where = {name: folder / fname for name, fname in weight_map.items()}
        for shard in sorted(set(where.values())):
            if not shard.is_file():
                raise ModelFileError(f"{index} lists shard {shard.name}, which is missing from {folder}")
        return where
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelFileError(
            f"{folder} has no *.safetensors files (only safetensors checkpoints are read; "
            "convert a pytorch_model.bin with transformers' save_pretrained(safe_serialization=True))"
        )
    where = {}
    for file in files:
        try:
            with safe_open(str(file), framework="numpy") as f:
                for name in f.keys():
                    where[name] = file
        except Exception as e:
            raise ModelFileError(f"{file} is not a readable safetensors file ({type(e).__name__}: {e})") from None
    return where


class _Reader:
    """Keeps each shard open once while tensors are read."""

    def __init__(self):
        self._open: dict[Path, Any] = {}

    def get(self, file: Path, name: str) -> np.ndarray:
        from safetensors import safe_open

        try:
            if file not in self._open:
                self._open[file] = safe_open(str(file), framework="numpy")
            arr = self._open[file].get_tensor(name)
        except Exception as e:
            raise ModelFileError(
                f"{file}: tensor {name} cannot be read ({type(e).__name__}: {e}); the file is corrupt"
            ) from None
        if arr.dtype.name not in _FLOAT_DTYPES:
            raise ModelFileError(
                f"{file}: tensor {name} has dtype {arr.dtype.name}; jaxlab reads {', '.join(_FLOAT_DTYPES)} checkpoints"
            )
        return arr.astype(np.float32)


def load_hf(folder_or_repo_id: str | os.PathLike, config: LlamaConfig | None = None, progress: bool | None = None):
    """Read a Hugging Face Llama checkpoint -> (config, {canonical name: float32 array}).

    ``folder_or_repo_id`` is a local folder or a hub repo id such as ``HuggingFaceTB/SmolLM2-135M-Instruct``.
    ``config`` defaults to the one ``config.json`` describes; a given config is checked tensor by tensor."""
    from tqdm.auto import tqdm

    folder, name = resolve_folder(folder_or_repo_id)
    file_cfg = hf_config(folder, name)
    cfg = config or file_cfg
    where = _shard_files(folder)
    if config is not None and config.tie_embeddings != file_cfg.tie_embeddings:
        raise ModelFileError(
            f"{folder}: the config says tie_embeddings={config.tie_embeddings}, config.json says "
            f"tie_word_embeddings={file_cfg.tie_embeddings}"
        )
    shapes = param_shapes(cfg)
    rows = _mapping(cfg)
    expected = {h for h, _, _ in rows} | {"lm_head.weight"}
    extra = sorted(n for n in where if n not in expected and not n.endswith(_IGNORED_SUFFIXES))
    if extra:
        raise ModelFileError(
            f"{folder}: the checkpoint has tensors jaxlab's Llama model does not use, e.g. "
            f"{', '.join(extra[:5])}{'...' if len(extra) > 5 else ''} (a different architecture, or more layers "
            f"than the config's {cfg.n_layers}?)"
        )
    reader = _Reader()
    flat = {}
    for hname, cname, transpose in tqdm(rows, desc=f"reading {folder.name}", unit="tensor", disable=not progress):
        file = where.get(hname)
        if file is None:
            raise ModelFileError(f"{folder}: tensor {hname} is missing from the checkpoint")
        w = reader.get(file, hname)
        want = shapes[cname][::-1] if transpose else shapes[cname]  # in the checkpoint's [out, in] layout
        if tuple(w.shape) != tuple(want):
            raise ModelFileError(
                f"{file}: tensor {hname} has shape {tuple(w.shape)}, the config {cfg.name!r} needs {tuple(want)}"
            )
        flat[cname] = np.ascontiguousarray(w.T) if transpose else w
    if cfg.tie_embeddings and "lm_head.weight" in where:
        head = reader.get(where["lm_head.weight"], "lm_head.weight")
        if head.shape != flat["embed"].shape or not np.array_equal(head, flat["embed"]):
            raise ModelFileError(
                f"{folder}: config.json ties the embeddings, but lm_head.weight differs from "
                "model.embed_tokens.weight; set tie_word_embeddings=false in config.json"
            )
    return cfg, flat


def _shortest(x: float) -> float:
    """A float32 value as the shortest decimal that reads back as it (GGUF's 9.999999747e-06 -> 1e-05)."""
    return float(str(np.float32(x)))


def hf_config_json(cfg: LlamaConfig, dtype: str = "float32") -> dict[str, Any]:
    """The ``config.json`` of a ``LlamaForCausalLM`` for ``cfg``: what ``transformers`` 5 writes, plus the
    top-level ``rope_theta`` that older readers (transformers 4, llama.cpp's converter) look for."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": cfg.bos_id,
        "eos_token_id": cfg.eos_id,
        "pad_token_id": cfg.pad_id,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "hidden_size": cfg.dim,
        "initializer_range": 0.02,
        "intermediate_size": cfg.ffn_dim,
        "max_position_embeddings": cfg.max_seq_len,
        "mlp_bias": False,
        "num_attention_heads": cfg.n_heads,
        "num_hidden_layers": cfg.n_layers,
        "num_key_value_heads": cfg.n_kv_heads,
        "pretraining_tp": 1,
        "rms_norm_eps": _shortest(cfg.norm_eps),
        "rope_theta": _shortest(cfg.rope_theta),
        "rope_parameters": {"rope_theta": _shortest(cfg.rope_theta), "rope_type": "default"},
        "tie_word_embeddings": cfg.tie_embeddings,
        "dtype": dtype,
        "use_cache": True,
        "vocab_size": cfg.vocab_size,
    }


def write_hf(
    folder: str | os.PathLike,
    cfg: LlamaConfig,
    flat: dict[str, np.ndarray],
    dtype: str = "float32",
    progress: bool = False,
) -> list[Path]:
    """Write a Hugging Face Llama checkpoint -> the files written: ``model.safetensors`` (HF names, PyTorch's
    [out, in] layout, ``dtype`` one of float32, float16, bfloat16), ``config.json`` and
    ``generation_config.json``. The inverse of :func:`load_hf`; ``folder`` must exist."""
    import ml_dtypes
    from safetensors.numpy import save_file
    from tqdm.auto import tqdm

    if dtype not in _FLOAT_DTYPES:
        raise ConfigError(f"unknown checkpoint dtype {dtype!r}; choose one of {', '.join(_FLOAT_DTYPES)}")
    np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    folder = Path(folder)
    tensors = {}
    for hname, cname, transpose in tqdm(_mapping(cfg), desc="converting", unit="tensor", disable=not progress):
        w = np.asarray(flat[cname], np.float32)
        tensors[hname] = np.ascontiguousarray((w.T if transpose else w).astype(np_dtype))
    if progress:
        print(f"writing {folder / 'model.safetensors'}", file=sys.stderr)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})  # "pt": transformers asks
    gen = {"bos_token_id": cfg.bos_id, "eos_token_id": cfg.eos_id, "pad_token_id": cfg.pad_id}
    for name, obj in (("config.json", hf_config_json(cfg, dtype)), ("generation_config.json", gen)):
        (folder / name).write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")
    return [folder / n for n in ("model.safetensors", "config.json", "generation_config.json")]
