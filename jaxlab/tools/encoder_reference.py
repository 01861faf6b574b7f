"""The encoder's reference: ``transformers``' PyTorch ``BertModel`` on the same all-MiniLM-L6-v2 folder, with
sentence-transformers' pooling (mean over real tokens, then L2 normalisation) and its truncation (256 tokens), and
the golden file made from it (``data/reference/all_minilm_l6_v2.json``), so a notebook checks parity without torch.

``scripts/make_reference.py`` writes the file; ``tests/engine/test_encoder.py`` regenerates it in memory and fails
when the stored copy is stale. torch and transformers are imported only inside the functions that need them.
"""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path
from typing import Sequence

import numpy as np

from jaxlab.io.assets import data_dir, data_file

GOLDEN_NAME = "all_minilm_l6_v2.json"
#: Empty, short, accented, CJK, emoji, over-long (truncated at 256 tokens), code, and two paraphrases.
GOLDEN_TEXTS = (
    "",
    "Hello world",
    "Café déjà vu: a naïve façade in Zürich, São Paulo and Kraków.",
    "日本語のテキストです。中文句子也可以。한국어 문장.",
    "Launch day 🚀🔥 — the party starts at 8 🎉",
    "The lighthouse keeper climbed the stairs at dusk and trimmed the wicks. " * 30,
    "def greet(name):\n    return f'Hello, {name}!'",
    "jax.jit compiles a Python function with XLA.",
    "XLA compiles the function when you wrap it in jax.jit.",
)
DECIMALS = 7
#: Largest |ours - reference| per embedding element: float32 everywhere, full-precision matmuls (stated, not tuned).
TOLERANCE = {"cpu": 1e-5, "gpu": 1e-4, "tpu": 1e-4}


def reference_embeddings(folder, texts: Sequence[str], max_length: int = 256) -> tuple[list[list[int]], np.ndarray]:
    """(token ids per text, [N, D] embeddings) from ``transformers``: ``AutoTokenizer`` and ``BertModel`` loaded
    from ``folder``, float32 on the CPU, mean pooling over the attention mask, L2 normalisation."""
    import torch
    from transformers import AutoTokenizer, BertModel
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    tok = AutoTokenizer.from_pretrained(str(folder))
    model = BertModel.from_pretrained(str(folder), dtype=torch.float32).eval()
    enc = tok(list(texts), padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**enc).last_hidden_state
    mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    emb = torch.nn.functional.normalize(pooled, p=2, dim=1).numpy()
    ids = [row[m.bool()].tolist() for row, m in zip(enc["input_ids"], enc["attention_mask"])]
    return ids, emb


def make_golden(texts: Sequence[str] = GOLDEN_TEXTS) -> dict:
    from jaxlab.io import assets

    folder = assets.encoder_dir()
    ids, emb = reference_embeddings(folder, texts)
    spec = assets.ENCODERS[assets.DEFAULT_ENCODER]
    return {
        "about": "Golden sentence embeddings of Hugging Face transformers' BertModel (PyTorch, float32, CPU) on the "
        "embedded all-MiniLM-L6-v2, mean-pooled and L2-normalised as its sentence-transformers config says, "
        "truncated at 256 tokens. Made by scripts/make_reference.py; tests/engine/test_encoder.py fails when stale.",
        "weights_sha256": spec["files"]["model.safetensors"][0],
        "made_with": {k: metadata.version(k) for k in ("transformers", "torch")},
        "max_seq_length": 256,
        "texts": [
            {"text": t, "ids": i, "embedding": [round(float(x), DECIMALS) for x in e]}
            for t, i, e in zip(texts, ids, emb)
        ],
    }


def golden_path() -> Path:
    return data_dir() / "reference" / GOLDEN_NAME


def write_golden(data: dict, path: Path | None = None) -> Path:
    path = path or golden_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def load_golden(path: Path | None = None) -> dict:
    """The stored golden file (jaxlab's data: the wheel's, a clone's, or ``$JAXLAB_DATA``)."""
    return json.loads(Path(path or data_file("reference", GOLDEN_NAME)).read_text(encoding="utf-8"))


def check_golden(embedder, golden: dict | None = None, backend: str | None = None) -> dict:
    """Our token ids and embeddings against the golden file: {ids_equal, max_abs, tolerance, ok, texts}."""
    import jax

    golden = golden or load_golden()
    backend = backend or jax.default_backend()
    texts = [row["text"] for row in golden["texts"]]
    ids_equal = embedder.tokenize(texts) == [row["ids"] for row in golden["texts"]]
    ours = embedder.embed(texts)
    want = np.asarray([row["embedding"] for row in golden["texts"]], np.float32)
    max_abs = float(np.abs(ours - want).max())
    tol = TOLERANCE.get(backend, 1e-4)
    return {"ids_equal": ids_equal, "max_abs": max_abs, "tolerance": tol, "ok": ids_equal and max_abs <= tol,
            "texts": len(texts), "backend": backend}  # fmt: skip
