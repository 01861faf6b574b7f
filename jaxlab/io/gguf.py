"""GGUF files -> jaxlab's parameter tree, with the `gguf` package.

Supported tensor types: F32, F16, BF16, Q8_0, Q4_0, Q4_1 (dequantized to float32 with
``gguf.quants.dequantize``). K-quants are refused: the ``gguf`` package cannot write them, so their
loading could not be tested here.

GGUF converters (llama.cpp's ``convert_hf_to_gguf.py``) permute the rows of the query and key
projections from the "rotate half" RoPE layout of Hugging Face checkpoints into llama.cpp's interleaved
layout. jaxlab's model uses the "rotate half" layout, so :func:`unpermute_qk` undoes that permutation.

:func:`write_gguf` writes the other way (tests make small files of every type with it;
:mod:`jaxlab.io.export` adds the tokenizer, for llama.cpp and ``transformers``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from jaxlab.errors import ConfigError, ModelFileError
from jaxlab.io.config import LlamaConfig, from_gguf_metadata, param_shapes

SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")
SUPPORTED_ARCHS = ("llama",)
_BIG_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type", "tokenizer.ggml.scores")


def permute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """HF "rotate half" rows -> llama.cpp interleaved rows (what the GGUF converter does). w: [out, in]."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Inverse of :func:`permute_qk`. w: [out, in] with out = n_heads * head_dim."""
    return w.reshape(n_heads, w.shape[0] // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@dataclass
class GGUFFile:
    """An opened, validated GGUF file: metadata plus lazily dequantized tensors."""

    path: Path
    reader: Any  # gguf.GGUFReader
    metadata: dict[str, Any]

    def field(self, key: str, default=None):
        """A metadata value, including the large tokenizer arrays left out of ``metadata``."""
        if key in self.metadata:
            return self.metadata[key]
        f = self.reader.fields.get(key)
        return default if f is None else f.contents()

    @property
    def tensors(self) -> dict[str, Any]:
        return {t.name: t for t in self.reader.tensors}

    def dequantize(self, name: str) -> np.ndarray:
        """Tensor ``name`` as float32, numpy shape (rows, cols) = reversed GGUF dims."""
        import gguf

        t = self.tensors.get(name)
        if t is None:
            raise ModelFileError(f"{self.path}: tensor {name} is missing")
        kind = t.tensor_type.name
        if kind not in SUPPORTED_TYPES:
            raise ModelFileError(
                f"{self.path}: tensor {name} has type {kind}, which jaxlab does not read "
                f"(supported: {', '.join(SUPPORTED_TYPES)}); re-export the model with one of those"
            )
        try:
            if kind == "F32":
                out = np.asarray(t.data, dtype=np.float32)
            else:
                out = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))
            return out.reshape(shape)
        except ModelFileError:
            raise
        except Exception as e:  # a broken block layout surfaces here
            raise ModelFileError(f"{self.path}: tensor {name} ({kind}) cannot be decoded: {e}") from None


class _Truncated(Exception):
    """Raised by :func:`_reader` when a tensor's data runs past the end of the file."""

    def __init__(self, name: str, end: int):
        super().__init__(name, end)
        self.name, self.end = name, end


def _reader(path: Path):
    """``gguf.GGUFReader`` that checks every tensor's byte range before slicing it: the stock reader
    fails on a truncated file with a bare numpy reshape error that names no tensor."""
    import gguf

    class Reader(gguf.GGUFReader):
        def _build_tensors(self, start_offs, fields):
            for field in fields:
                _, name_data, _, dims, raw_dtype, offset = field.parts
                try:
                    block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(int(raw_dtype[0]))]
                except (ValueError, KeyError):
                    continue  # an unknown type: the stock reader reports it
                end = int(start_offs) + int(offset[0]) + int(np.prod(dims, dtype=np.uint64)) * type_size // block
                if end > len(self.data):
                    raise _Truncated(bytes(name_data).decode("utf-8", "replace"), end)
            super()._build_tensors(start_offs, fields)

    return Reader(str(path))


def open_gguf(path: str | os.PathLike) -> GGUFFile:
    """Open and validate a GGUF file; every failure is a :class:`ModelFileError` naming the file."""
    path = Path(path)
    if not path.exists():
        raise ModelFileError(f"model file not found: {path}")
    if path.is_dir():
        raise ModelFileError(f"{path} is a folder, not a GGUF file")
    size = path.stat().st_size
    if size == 0:
        raise ModelFileError(f"{path} is empty (0 bytes); delete it and fetch the model again (`jaxlab fetch`)")
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic != b"GGUF":
        raise ModelFileError(f"{path} is not a GGUF file (it starts with {magic!r}, a GGUF file with b'GGUF')")
    try:
        reader = _reader(path)
    except _Truncated as e:
        raise ModelFileError(
            f"{path} is truncated: tensor {e.name} needs bytes up to {e.end}, the file has {size}; fetch it again"
        ) from None
    except Exception as e:
        raise ModelFileError(
            f"{path} is truncated or corrupt: the GGUF header cannot be read ({type(e).__name__}: {e})"
        ) from None
    for t in reader.tensors:
        end = int(t.data_offset) + int(t.n_bytes)
        if end > size or t.data.nbytes != t.n_bytes:
            raise ModelFileError(
                f"{path} is truncated: tensor {t.name} needs bytes up to {end}, the file has {size}; fetch it again"
            )
    metadata = {}
    for key, f in reader.fields.items():
        if key in _BIG_ARRAYS or key.startswith("GGUF."):
            continue
        try:
            metadata[key] = f.contents()
        except Exception as e:
            raise ModelFileError(f"{path}: metadata field {key} cannot be read ({e}); the file is corrupt") from None
    return GGUFFile(path, reader, metadata)


def _mapping(cfg: LlamaConfig) -> list[tuple[str, str, str | None]]:
    """(GGUF tensor name, canonical name, transform) for every parameter."""
    rows = [("token_embd.weight", "embed", None), ("output_norm.weight", "norm.weight", None)]
    if not cfg.tie_embeddings:
        rows.append(("output.weight", "lm_head", "T"))
    for i in range(cfg.n_layers):
        b, c = f"blk.{i}.", f"layers.{i}."
        rows += [
            (b + "attn_norm.weight", c + "attn_norm.weight", None),
            (b + "attn_q.weight", c + "attn.wq", "q"),
            (b + "attn_k.weight", c + "attn.wk", "k"),
            (b + "attn_v.weight", c + "attn.wv", "T"),
            (b + "attn_output.weight", c + "attn.wo", "T"),
            (b + "ffn_norm.weight", c + "mlp_norm.weight", None),
            (b + "ffn_gate.weight", c + "mlp.w_gate", "T"),
            (b + "ffn_up.weight", c + "mlp.w_up", "T"),
            (b + "ffn_down.weight", c + "mlp.w_down", "T"),
        ]
    return rows


def gguf_config(f: GGUFFile) -> LlamaConfig:
    arch = f.metadata.get("general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise ModelFileError(
            f"{f.path}: architecture {arch!r} is not supported; jaxlab runs {', '.join(SUPPORTED_ARCHS)} models"
        )
    embd = f.tensors.get("token_embd.weight")
    if embd is None:
        raise ModelFileError(f"{f.path}: tensor token_embd.weight is missing")
    name = str(f.metadata.get("general.name") or f.path.stem)
    try:
        cfg = from_gguf_metadata(f.metadata, vocab_size=int(embd.shape[-1]), name=name)
    except (ConfigError, TypeError, ValueError) as e:  # the file describes an impossible or incomplete model
        raise ModelFileError(f"{f.path}: {e}") from None
    return cfg.replace(tie_embeddings="output.weight" not in f.tensors)


def load_gguf(path: str | os.PathLike, config: LlamaConfig | None = None, progress: bool | None = None):
    """Read a GGUF file -> (config, {canonical name: float32 array}).

    ``config`` defaults to the one the file describes; a given config is checked tensor by tensor."""
    from tqdm.auto import tqdm

    f = open_gguf(path)
    file_cfg = gguf_config(f)
    cfg = config or file_cfg
    if config is not None and config.tie_embeddings != file_cfg.tie_embeddings:
        raise ModelFileError(
            f"{f.path}: the config says tie_embeddings={config.tie_embeddings}, the file "
            f"{'has' if not file_cfg.tie_embeddings else 'has no'} output.weight tensor"
        )
    shapes = param_shapes(cfg)
    flat = {}
    rows = _mapping(cfg)
    if progress is None:
        progress = False
    for gname, cname, how in tqdm(rows, desc=f"dequantizing {f.path.name}", unit="tensor", disable=not progress):
        w = f.dequantize(gname)
        if how == "q":
            w = unpermute_qk(w, cfg.n_heads) if w.shape[0] == cfg.n_heads * cfg.head_dim else w
        elif how == "k":
            w = unpermute_qk(w, cfg.n_kv_heads) if w.shape[0] == cfg.n_kv_heads * cfg.head_dim else w
        if how in ("q", "k", "T"):
            w = w.T
        if tuple(w.shape) != shapes[cname]:
            raise ModelFileError(
                f"{f.path}: tensor {gname} has shape {tuple(w.shape)} after mapping to {cname}, "
                f"the config {cfg.name!r} needs {shapes[cname]}"
            )
        flat[cname] = np.ascontiguousarray(w)
    return cfg, flat


def write_gguf(
    path,
    cfg: LlamaConfig,
    flat: dict[str, np.ndarray],
    qtype: str = "F32",
    extra_metadata: dict[str, Any] | None = None,
    progress: bool = False,
) -> None:
    """Write a Llama model as GGUF: matrices as ``qtype`` (any type ``gguf.quants`` writes: F32, F16, Q8_0...),
    norms as F32, as in real files. ``flat``: {canonical name: array} (jaxlab's [in, out] layout).

    Q/K are permuted the way llama.cpp's converter does, so a round trip exercises :func:`unpermute_qk`.
    ``extra_metadata`` adds key/values (str, bool, int, float, or a list of one of them), e.g. the tokenizer
    fields of :func:`jaxlab.io.export.gguf_tokenizer_metadata`; a matrix row that is not a whole number of
    ``qtype``'s blocks is a :class:`ConfigError` naming the tensor."""
    import gguf
    from tqdm.auto import tqdm

    qt = getattr(gguf.GGMLQuantizationType, str(qtype), None)
    if qt is None:
        raise ConfigError(f"unknown GGUF tensor type {qtype!r}; use one of F32, F16, BF16, Q8_0, Q4_0, Q4_1")
    block = gguf.GGML_QUANT_SIZES[qt][0]
    rows = _mapping(cfg)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(cfg.name)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    if hasattr(gguf.LlamaFileType, f"MOSTLY_{qtype}") or qtype == "F32":
        w.add_file_type(gguf.LlamaFileType.ALL_F32 if qtype == "F32" else gguf.LlamaFileType[f"MOSTLY_{qtype}"])
    w.add_vocab_size(cfg.vocab_size)
    w.add_block_count(cfg.n_layers)
    w.add_context_length(cfg.max_seq_len)
    w.add_embedding_length(cfg.dim)
    w.add_feed_forward_length(cfg.ffn_dim)
    w.add_head_count(cfg.n_heads)
    w.add_head_count_kv(cfg.n_kv_heads)
    w.add_key_length(cfg.head_dim)  # needed whenever head_dim != dim // n_heads (the reader's default)
    w.add_value_length(cfg.head_dim)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.norm_eps)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_bos_token_id(cfg.bos_id)
    w.add_eos_token_id(cfg.eos_id)
    w.add_pad_token_id(cfg.pad_id)
    for k, v in (extra_metadata or {}).items():
        if isinstance(v, str):
            w.add_string(k, v)
        elif isinstance(v, bool):  # before int: bool is an int in Python, and llama.cpp reads these as bool
            w.add_bool(k, v)
        elif isinstance(v, int):
            w.add_uint32(k, v)
        elif isinstance(v, float):
            w.add_float32(k, v)
        elif isinstance(v, list):
            w.add_array(k, v)
        else:
            raise ConfigError(f"GGUF metadata {k}: a {type(v).__name__} cannot be stored (str, bool, int, float, list)")
    for gname, cname, how in tqdm(rows, desc=f"writing {qtype} tensors", unit="tensor", disable=not progress):
        a = np.asarray(flat[cname], np.float32)
        if how in ("q", "k", "T"):
            a = a.T
        if how == "q":
            a = permute_qk(a, cfg.n_heads)
        elif how == "k":
            a = permute_qk(a, cfg.n_kv_heads)
        a = np.ascontiguousarray(a)
        if a.ndim == 1 or qtype == "F32":
            w.add_tensor(gname, a)  # norms stay F32, as in real files
        elif qtype == "F16":
            w.add_tensor(gname, a.astype(np.float16))
        else:
            if a.shape[-1] % block:
                raise ConfigError(
                    f"tensor {gname} has rows of {a.shape[-1]} values, not a multiple of {qtype}'s block of "
                    f"{block}; write this model as F32 or F16"
                )
            data = gguf.quants.quantize(a, qt)
            w.add_tensor(gname, data, raw_shape=data.shape, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
