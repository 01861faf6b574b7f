"""The peer the float32 rows are measured against: Hugging Face ``transformers`` (PyTorch eager, float32,
CPU) running ``generate`` on the same GGUF weights, the same prompts and batch sizes, greedy, EOS ignored.
torch and transformers are imported only when a peer runs."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Sequence

from jaxlab.bench.options import Options

#: What the peer is, as the report says it.
WHAT = "transformers AutoModelForCausalLM.generate, PyTorch eager, float32, CPU, greedy, EOS ignored"

PEERS: dict[str, Any] = {}  # gguf path -> loaded transformers model (one load per process)


def load_peer(model_path):
    """:func:`jaxlab.tools.reference.hf_model` (no tokenizer: the bench feeds token ids) for a GGUF file (or a Hugging
    Face folder or hub id), loaded once per process (kept in :data:`PEERS`)."""
    key = str(Path(model_path).resolve()) if Path(model_path).exists() else str(model_path)
    if key not in PEERS:
        from jaxlab.tools.reference import hf_model

        PEERS[key] = hf_model(key, "float32")
    return PEERS[key]


def start_peer(opts: Options, row0: Sequence[int], log) -> tuple[Any, str | None]:
    """(the warmed-up peer, None), or (None, why there is none)."""
    if not opts.peer:
        return None, "disabled (--no-peer)" if opts.float else "not run (--quant-only)"
    try:
        import importlib

        importlib.import_module("torch")
        importlib.import_module("transformers")
    except ImportError as e:
        return None, f"torch/transformers not importable ({e})"
    from jaxlab.io import assets

    log("loading the peer: transformers (PyTorch eager, float32) on the same model file")
    peer = load_peer(opts.model or assets.model_path())
    log("peer warm-up (batch 1, 2 tokens)")
    peer_generate(peer, [row0], 2)
    return peer, None


def peer_generate(model, rows: Sequence[Sequence[int]], n: int) -> dict:
    """transformers ``generate``: greedy, EOS ignored (as :func:`jaxlab.tools.reference.reference_greedy`), equal-
    length rows. A logits processor stamps the time after every forward pass, so decode time is the
    span between the first and the last stamp (n - 1 decode steps), as in our ``decode_seconds``."""
    import copy

    import torch
    from transformers import LogitsProcessor, LogitsProcessorList

    class Stamps(LogitsProcessor):
        def __init__(self):
            self.t: list[float] = []

        def __call__(self, input_ids, scores):
            self.t.append(time.perf_counter())
            return scores

    gc = copy.deepcopy(model.generation_config)
    gc.eos_token_id = None  # ignore EOS: always n tokens
    gc.pad_token_id = model.config.pad_token_id if model.config.pad_token_id is not None else 2
    gc.do_sample = False
    gc.max_new_tokens = n
    gc.min_new_tokens = None
    gc.temperature = None
    gc.top_p = None
    gc.top_k = None
    stamps = Stamps()
    x = torch.tensor([list(r) for r in rows], dtype=torch.long)
    mask = torch.ones_like(x)
    with torch.no_grad():
        t0 = time.perf_counter()
        out = model.generate(
            x, generation_config=gc, attention_mask=mask, logits_processor=LogitsProcessorList([stamps])
        )
        total = time.perf_counter() - t0
    p = x.shape[1]
    return {
        "tokens": out[:, p:].tolist(),
        "total_s": total,
        "decode_s": stamps.t[-1] - stamps.t[0] if len(stamps.t) > 1 else None,
        "prefill_s": stamps.t[0] - t0 if stamps.t else None,
    }
