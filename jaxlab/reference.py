"""The reference implementation (Hugging Face ``transformers`` on PyTorch) and the golden files made from it.

jaxlab's logits, greedy tokens and token ids must equal the reference's on the same GGUF file. Tests
compare against ``transformers`` directly; notebooks compare against ``data/reference/*.json``, golden
outputs written by ``scripts/make_reference.py`` (which calls :func:`make_golden`), so a notebook runs
without torch. A test regenerates the golden data and fails when the stored file is stale.

torch and transformers are imported only inside the functions that need them.
"""

from __future__ import annotations

import json
import os
from importlib import metadata
from pathlib import Path

import numpy as np

from .assets import data_dir

GOLDEN_DIR = data_dir() / "reference"
GOLDEN_FILE = GOLDEN_DIR / "smollm2_135m.json"
GOLDEN_PROMPTS = (
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "Explain in one sentence what a KV cache is.",
    "List three primary colors.",
    "Translate 'good morning' into Spanish.",
    "What is 17 times 23?",
)
GREEDY_TOKENS = 32
TOP = 10
LOGIT_DECIMALS = 3


def load_reference(gguf_path, dtype: str = "float32"):
    """(model, tokenizer) of ``transformers`` loaded from the same GGUF file, in float32 on the CPU."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    folder, name = os.path.split(os.path.abspath(gguf_path))
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=getattr(torch, dtype))
    model.eval()
    return model, tok


def reference_logits(model, ids: list[int]) -> np.ndarray:
    """Logits [T, V] of the reference for one sequence of token ids."""
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def reference_greedy(model, ids: list[int], n: int = GREEDY_TOKENS) -> list[int]:
    """``transformers.generate`` greedy continuation of ``n`` tokens, EOS ignored."""
    import torch

    # generate() fills unset fields of the generation config it is given from the model's own
    # defaults, so an eos_token_id of None in a passed config comes back as EOS; switch it off on the
    # model's config itself for the duration of the call.
    gc = model.generation_config
    saved = (gc.eos_token_id, gc.do_sample, gc.temperature, gc.top_p, gc.top_k)
    try:
        gc.eos_token_id, gc.do_sample, gc.temperature, gc.top_p, gc.top_k = None, False, None, None, None
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 max_new_tokens=n, min_new_tokens=None, pad_token_id=2)
    finally:
        gc.eos_token_id, gc.do_sample, gc.temperature, gc.top_p, gc.top_k = saved
    tokens = out[0, len(ids):].tolist()
    if len(tokens) != n:
        raise RuntimeError(f"the reference generated {len(tokens)} tokens, expected {n} with EOS ignored")
    return tokens


def chat_ids(tokenizer, prompt: str) -> list[int]:
    """Token ids of one user message through the chat template (reference tokenizer)."""
    out = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True)
    if hasattr(out, "keys"):
        out = out["input_ids"]
    return list(map(int, out))


def logit_summary(logits_row: np.ndarray, top: int = TOP) -> dict:
    """A CPU-independent summary of one position's logits: the top ids and their rounded values."""
    order = np.argsort(-logits_row, kind="stable")[:top]
    return {
        "top_ids": [int(i) for i in order],
        "top_logits": [round(float(logits_row[i]), LOGIT_DECIMALS) for i in order],
        "max_abs": round(float(np.abs(logits_row).max()), LOGIT_DECIMALS),
    }


def make_golden(gguf_path, prompts=GOLDEN_PROMPTS, reference=None) -> dict:
    """Golden outputs of the reference for ``prompts``: ids, greedy continuation, logit summaries.

    ``reference`` is an already loaded ``(model, tokenizer)``; loaded from ``gguf_path`` if None."""
    model, tok = reference or load_reference(gguf_path)
    rows = []
    for p in prompts:
        ids = chat_ids(tok, p)
        greedy = reference_greedy(model, ids)
        rows.append({
            "prompt": p,
            "prompt_ids": ids,
            "greedy_ids": greedy,
            "greedy_text": tok.decode(greedy),
            "last_logits": logit_summary(reference_logits(model, ids)[-1]),
        })
    from .assets import sha256_file

    return {
        "about": "Golden outputs of Hugging Face transformers (PyTorch, float32, CPU) on the embedded "
                 "SmolLM2-135M-Instruct Q4_1 GGUF. Made by scripts/make_reference.py; "
                 "tests/test_reference.py fails when they are stale.",
        "model_sha256": sha256_file(Path(gguf_path)),
        "made_with": {k: metadata.version(k) for k in ("transformers", "torch")},
        "greedy_tokens": GREEDY_TOKENS,
        "eos_ignored": True,
        "prompts": rows,
    }


def write_golden(data: dict, path: Path = GOLDEN_FILE) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    return path


def load_golden(path: Path = GOLDEN_FILE) -> dict:
    if not Path(path).exists():
        from .errors import AssetError

        raise AssetError(f"golden reference file {path} not found: it lives in the repository's data/ folder; "
                         "run from a clone, or set JAXLAB_DATA to a clone's data/ folder")
    return json.loads(Path(path).read_text())


def compare_logits(ours_row: np.ndarray, summary: dict, rtol: float = 1e-4) -> tuple[bool, str]:
    """Our last-position logits against a golden summary -> (ok, one-line verdict).

    Passes when the top ids agree and every top logit is within ``rtol * max|logit|`` plus the
    rounding of the stored values."""
    ours_top = logit_summary(ours_row, len(summary["top_ids"]))
    same_ids = ours_top["top_ids"] == summary["top_ids"]
    ref = np.asarray(summary["top_logits"])
    ours = np.asarray([ours_row[i] for i in summary["top_ids"]])
    tol = rtol * summary["max_abs"] + 0.5 * 10 ** -LOGIT_DECIMALS
    err = float(np.abs(ours - ref).max())
    ok = same_ids and err <= tol
    verdict = "PASS" if ok else "FAIL"
    return ok, f"{verdict}: top-{len(ref)} ids {'identical' if same_ids else 'differ'}, logits within tolerance: {err <= tol}"
