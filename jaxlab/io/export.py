"""A jaxlab model back to the ecosystem: float ``Params`` + the ``Tokenizer`` -> a Hugging Face folder or a GGUF file.

* :func:`export_hf` writes ``model.safetensors`` + ``config.json`` + ``generation_config.json``
  (:func:`jaxlab.io.hf.write_hf`) and the tokenizer files ``transformers`` reads: ``tokenizer.json``,
  ``tokenizer_config.json`` (chat template, bos/eos/pad), ``special_tokens_map.json``.
* :func:`export_gguf` writes one GGUF file (:func:`jaxlab.io.gguf.write_gguf`, matrices F32, F16 or Q8_0, norms
  F32) carrying the tokenizer as llama.cpp stores it (``tokenizer.ggml.*``, the chat template), so llama.cpp and
  ``transformers`` (``from_pretrained(folder, gguf_file=...)``) load it alone.

Both tokenizers are derived from the jaxlab ``Tokenizer`` itself, not copied from the file it came from, so a
tokenizer loaded from a Hugging Face folder exports to GGUF too. ``tokenizer.json`` is the serialization of the
``tokenizers`` object jaxlab encodes with, so the exported folder encodes exactly as jaxlab does. The GGUF
vocabulary is its tokens by id, a type per token (3 = control for the special ones, 4 = user-defined for the
other added ones, 1 = normal) and its merges, written as ``"left right"``. Only the *name* of the pre-tokenizer
(``tokenizer.ggml.pre``, which llama.cpp maps to its own regular expressions) cannot be derived exactly: it is
copied from the source GGUF when there is one, else read off the pre-tokenizer's structure.

Only float parameters can be exported: a quantized model (``jaxlab.quant``) would have to be dequantized with
its rounding baked in; load the float model (without ``quant``) and export that.

A compiled program as a file (``jax.export`` of the decode step) is :mod:`jaxlab.tools.program_export`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from jaxlab.errors import ExportError
from jaxlab.io.gguf import write_gguf
from jaxlab.io.hf import write_hf
from jaxlab.io.tokenizer import CONTROL, USER_DEFINED, read_gguf_metadata

FORMATS = ("hf", "gguf")
GGUF_QTYPES = ("F32", "F16", "Q8_0")  # what llama.cpp, transformers and jaxlab all read
HF_DTYPES = ("float32", "float16", "bfloat16")
NORMAL, UNUSED = 1, 5  # llama.cpp's token types besides CONTROL and USER_DEFINED
# Source-GGUF metadata worth keeping in an export: who made the model and its licence (general.name is the config's)
GENERAL_KEYS = (
    "general.organization",
    "general.basename",
    "general.finetune",
    "general.size_label",
    "general.license",
    "general.languages",
)
# Files that would shadow an export in a folder it overwrites: load_hf reads every *.safetensors (or a shard
# index), and a chat_template.jinja wins over tokenizer_config.json's template.
_SHADOWING = ("*.safetensors", "model.safetensors.index.json", "chat_template.jinja")


def check_export(fmt: str, qtype: str | None = None, dtype: str | None = None) -> None:
    """Raise :class:`ExportError` for a format, GGUF type or checkpoint dtype that cannot be written."""
    if fmt not in FORMATS:
        raise ExportError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if qtype is not None and (fmt != "gguf" or qtype not in GGUF_QTYPES):
        raise ExportError(
            f"GGUF tensor type {qtype!r} cannot be exported; choose one of {', '.join(GGUF_QTYPES)}"
            if fmt == "gguf"
            else f"a tensor type ({qtype}) is for --format gguf; a Hugging Face folder takes a dtype "
            f"({', '.join(HF_DTYPES)})"
        )
    if dtype is not None and (fmt != "hf" or dtype not in HF_DTYPES):
        raise ExportError(
            f"checkpoint dtype {dtype!r} cannot be exported; choose one of {', '.join(HF_DTYPES)}"
            if fmt == "hf"
            else f"a dtype ({dtype}) is for --format hf; a GGUF file takes a tensor type ({', '.join(GGUF_QTYPES)})"
        )


def check_params(params) -> None:
    """Raise :class:`ExportError` unless ``params`` are float parameters."""
    if params.quant is not None:
        raise ExportError(
            f"the parameters are quantized ({params.quant}); export float parameters: load without --quant "
            "(quant=None) and export those"
        )


def check_vocab(tokenizer, vocab_size: int) -> None:
    """Raise :class:`ExportError` when the tokenizer has ids the model's embedding has no row for."""
    if tokenizer.vocab_size > vocab_size:
        raise ExportError(
            f"{tokenizer.source}: the tokenizer has {tokenizer.vocab_size} tokens, the model's embedding only "
            f"{vocab_size} rows; export with the tokenizer the model was trained with"
        )


def _source_metadata(tokenizer, source) -> dict[str, Any]:
    """The metadata of the GGUF the model came from (``source``, else the tokenizer's file), or {}."""
    where = source if source is not None else getattr(tokenizer, "source", None)
    if where is None or not str(where).endswith(".gguf") or not Path(where).is_file():
        return {}
    return read_gguf_metadata(where)


def check_output(fmt: str, out: str | os.PathLike, overwrite: bool = False) -> Path:
    """Raise :class:`ExportError` if ``out`` cannot take a ``fmt`` export (nothing is written) -> the path."""
    out = Path(out).expanduser()
    flag = "pass overwrite=True (--overwrite) to replace it, or choose another path"
    if fmt == "hf":
        if out.exists() and not out.is_dir():
            raise ExportError(f"{out} is a file; a Hugging Face export is a folder: choose a folder path")
        if out.is_dir() and any(out.iterdir()) and not overwrite:
            raise ExportError(f"{out} exists and is not empty; {flag}")
    else:
        if out.is_dir():
            raise ExportError(f"{out} is a folder; a GGUF export is one file: give a file path like model.gguf")
        if out.exists() and not overwrite:
            raise ExportError(f"{out} exists; {flag}")
    return out


def _output(fmt: str, out, overwrite: bool) -> Path:
    """The checked output path, its folder made; a folder overwritten loses the files that would shadow the export."""
    out = check_output(fmt, out, overwrite)
    if fmt == "hf":
        if out.is_dir():
            for pattern in _SHADOWING:
                for f in out.glob(pattern):
                    f.unlink()
        out.mkdir(parents=True, exist_ok=True)
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
    return out


# --------------------------------------------------------------------------------------------------------------
# The tokenizer, for transformers and for llama.cpp
# --------------------------------------------------------------------------------------------------------------


def _added(tokenizer) -> dict[int, Any]:
    """{id: tokenizers.AddedToken} of the tokenizer's added (special and user-defined) tokens."""
    return tokenizer.backend.get_added_tokens_decoder()


def _adds(tokenizer) -> tuple[bool, bool]:
    """(add_bos, add_eos): whether ``encode(..., add_special_tokens=True)`` puts BOS in front / EOS behind."""
    plain, marked = tokenizer.encode("a"), tokenizer.encode("a", add_special_tokens=True)
    n = len(plain)
    add_bos = marked[:1] == [tokenizer.bos_id] and marked[1 : 1 + n] == plain
    add_eos = marked[-1:] == [tokenizer.eos_id] and marked[-1 - n : -1] == plain
    return add_bos, add_eos


def hf_tokenizer_files(tokenizer, max_len: int, unk_id: int | None = None) -> dict[str, str]:
    """{file name: text} of the tokenizer files of a Hugging Face folder (``tokenizer.json``,
    ``tokenizer_config.json``, ``special_tokens_map.json``); ``max_len`` is the model's context."""
    name = tokenizer.id_to_token
    added = _added(tokenizer)
    named = {"bos_token": tokenizer.bos_id, "eos_token": tokenizer.eos_id, "pad_token": tokenizer.pad_id}
    if unk_id is not None:
        named["unk_token"] = unk_id
    named = {k: name(i) for k, i in named.items() if i is not None}
    extra = [name(i) for i in sorted(tokenizer.special_ids) if name(i) not in named.values()]
    add_bos, add_eos = _adds(tokenizer)
    config: dict[str, Any] = {
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(i): {
                "content": t.content,
                "lstrip": t.lstrip,
                "normalized": t.normalized,
                "rstrip": t.rstrip,
                "single_word": t.single_word,
                "special": t.special,
            }
            for i, t in sorted(added.items())
        },
        "additional_special_tokens": extra,
        **named,
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(max_len),
        # The generic fast tokenizer: it runs tokenizer.json as it is. A model-specific class (GPT2Tokenizer)
        # may rebuild the pre-tokenizer from its own defaults and lose, say, SmolLM2's digit split.
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    if tokenizer.chat_template is not None:
        config["chat_template"] = tokenizer.chat_template
    special_map = {**named, "additional_special_tokens": extra}
    dump = lambda obj: json.dumps(obj, indent=2, ensure_ascii=False) + "\n"  # noqa: E731
    return {
        "tokenizer.json": tokenizer.backend.to_str(pretty=True),
        "tokenizer_config.json": dump(config),
        "special_tokens_map.json": dump(special_map),
    }


def _pre_name(pre: dict | None) -> str | None:
    """llama.cpp's name (``tokenizer.ggml.pre``) for a ``tokenizer.json`` pre-tokenizer, or None."""
    if pre is None:
        return None
    steps = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    kinds = [s.get("type") for s in steps]
    if kinds == ["ByteLevel"] and steps[0].get("use_regex", True):
        return "gpt2"
    if kinds == ["Digits", "ByteLevel"] and steps[0].get("individual_digits") and steps[1].get("use_regex", True):
        return "smollm"
    if kinds == ["Split", "ByteLevel"] and "(?i:'s|'t|'re|'ve|'m|'ll|'d)" in json.dumps(steps[0]):
        return "llama-bpe"
    return None


def gguf_tokenizer_metadata(tokenizer, vocab_size: int, source_meta: dict | None = None) -> dict[str, Any]:
    """The ``tokenizer.ggml.*`` fields (and ``tokenizer.chat_template``) of a GGUF file for ``tokenizer``, its
    vocabulary padded with unused ``[PAD{i}]`` tokens to the model's ``vocab_size`` embedding rows (llama.cpp
    wants one token per row). ``source_meta``: the source GGUF's metadata, for the pre-tokenizer's name and the
    unknown token. bos/eos/pad ids are the config's (written by :func:`jaxlab.io.gguf.write_gguf`)."""
    source_meta = source_meta or {}
    spec = json.loads(tokenizer.backend.to_str())
    model = spec.get("model", {})
    if model.get("type") != "BPE" or (spec.get("decoder") or {}).get("type") != "ByteLevel":
        raise ExportError(
            f"{tokenizer.source}: the tokenizer is not byte-level BPE ({model.get('type')} model, decoder "
            f"{(spec.get('decoder') or {}).get('type')}); jaxlab writes only llama.cpp's 'gpt2' tokenizer to GGUF: "
            "export this model as a Hugging Face folder (--format hf)"
        )
    pre = source_meta.get("tokenizer.ggml.pre") or _pre_name(spec.get("pre_tokenizer"))
    if pre is None:
        raise ExportError(
            f"{tokenizer.source}: llama.cpp has no name for the pre-tokenizer {spec.get('pre_tokenizer')}; "
            "export from the model's GGUF file, or export a Hugging Face folder (--format hf)"
        )
    check_vocab(tokenizer, vocab_size)
    n = tokenizer.vocab_size
    tokens: list[str | None] = [None] * n
    for token, i in model["vocab"].items():
        tokens[i] = token
    added = _added(tokenizer)
    for i, t in added.items():
        tokens[i] = t.content
    holes = [i for i, t in enumerate(tokens) if t is None]
    if holes:
        raise ExportError(f"{tokenizer.source}: token ids {holes[:5]} have no token; the tokenizer is incomplete")
    types = [CONTROL if i in tokenizer.special_ids else USER_DEFINED if i in added else NORMAL for i in range(n)]
    tokens += [f"[PAD{i}]" for i in range(n, vocab_size)]
    types += [UNUSED] * (vocab_size - n)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    add_bos, add_eos = _adds(tokenizer)
    meta: dict[str, Any] = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": str(pre),
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.add_bos_token": add_bos,
        "tokenizer.ggml.add_space_prefix": False,
    }
    if add_eos:  # llama.cpp's converter writes it only when set
        meta["tokenizer.ggml.add_eos_token"] = True
    if source_meta.get("tokenizer.ggml.unknown_token_id") is not None:
        meta["tokenizer.ggml.unknown_token_id"] = int(source_meta["tokenizer.ggml.unknown_token_id"])
    if tokenizer.chat_template is not None:
        meta["tokenizer.chat_template"] = tokenizer.chat_template
    return meta


# --------------------------------------------------------------------------------------------------------------
# The two exports
# --------------------------------------------------------------------------------------------------------------


def export_hf(
    params,
    tokenizer,
    out: str | os.PathLike,
    *,
    dtype: str = "float32",
    source: str | os.PathLike | None = None,
    overwrite: bool = False,
    progress: bool = False,
) -> Path:
    """Write float ``params`` (and ``tokenizer``, unless None) as a Hugging Face folder ``out`` -> its path.

    ``dtype``: the checkpoint's float32, float16 or bfloat16. ``source``: the GGUF file the model came from
    (default: the tokenizer's), whose unknown token is kept. An existing non-empty folder is refused unless
    ``overwrite`` (which also removes the files that would shadow the export: other ``*.safetensors``, a shard
    index, ``chat_template.jinja``)."""
    check_export("hf", dtype=dtype)
    check_params(params)
    cfg = params.config
    if tokenizer is not None:
        check_vocab(tokenizer, cfg.vocab_size)
    out = _output("hf", out, overwrite)
    write_hf(out, cfg, params.flat(), dtype=dtype, progress=progress)
    if tokenizer is not None:
        unk = _source_metadata(tokenizer, source).get("tokenizer.ggml.unknown_token_id")
        for name, text in hf_tokenizer_files(tokenizer, cfg.max_seq_len, unk).items():
            (out / name).write_text(text, encoding="utf-8")
    return out


def export_gguf(
    params,
    tokenizer,
    out: str | os.PathLike,
    *,
    qtype: str = "F16",
    source: str | os.PathLike | None = None,
    overwrite: bool = False,
    progress: bool = False,
) -> Path:
    """Write float ``params`` (and ``tokenizer``, unless None) as one GGUF file ``out`` -> its path.

    ``qtype``: the matrices' F32, F16 or Q8_0 (norms are F32). ``source``: the GGUF the model came from
    (default: the tokenizer's), whose pre-tokenizer name, unknown token and ``general.*`` facts (licence,
    organization...) are kept. The file is written beside ``out`` and renamed into place, so an interrupted
    export leaves no half file under that name; an existing file is refused unless ``overwrite``."""
    check_export("gguf", qtype=qtype)
    check_params(params)
    cfg = params.config
    meta = _source_metadata(tokenizer, source)
    extra = {k: meta[k] for k in GENERAL_KEYS if k in meta}
    if tokenizer is not None:  # before anything is written: a tokenizer that does not fit is refused here
        extra |= gguf_tokenizer_metadata(tokenizer, cfg.vocab_size, meta)
    out = _output("gguf", out, overwrite)
    partial = out.with_name(out.name + ".partial")
    try:
        write_gguf(partial, cfg, params.flat(), qtype, extra_metadata=extra, progress=progress)
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)
    return out


def export(fmt: str, params, tokenizer, out, *, qtype=None, dtype=None, **kwargs) -> Path:
    """:func:`export_hf` (``fmt="hf"``, ``dtype``) or :func:`export_gguf` (``fmt="gguf"``, ``qtype``), with their
    defaults (float32, F16) for a None; ``kwargs``: source, overwrite, progress."""
    check_export(fmt, qtype=qtype, dtype=dtype)
    if fmt == "hf":
        return export_hf(params, tokenizer, out, dtype=dtype or "float32", **kwargs)
    return export_gguf(params, tokenizer, out, qtype=qtype or "F16", **kwargs)


def size_on_disk(path: str | os.PathLike) -> int:
    """Bytes of a file, or of every file in a folder."""
    path = Path(path)
    return path.stat().st_size if path.is_file() else sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
