"""How much a quantized model loses against float32: perplexity, KL divergence, token agreement, memory.

All of it is measured on the same tokens for every format, so the comparison is paired:

* **Perplexity** on an offline evaluation text (``data/eval/stdlib.txt``: Python standard-library
  docstrings and source, see ``data/eval/README.md``), cut into ``n`` windows of ``W`` tokens.
  ``ppl = exp(mean NLL)`` over the ``n (W - 1)`` tokens the windows predict (teacher-forced).
* **KL divergence** ``KL(p_ref || p_q) = sum_v p_ref(v) (log p_ref(v) - log p_q(v))`` of the next-token
  distributions at the same positions, averaged over positions; and **top-1 agreement**, the fraction of
  positions where both models' most likely next token is the same.
* **Greedy agreement** over chat prompts (``data/eval/prompts.json``): the reference's greedy
  continuation of each prompt, then the fraction of those tokens the quantized model also predicts when
  it is fed the reference's path (teacher-forced), plus how many free-running greedy continuations are
  identical (see :func:`greedy_agreement` for which is the headline and why).
* **Memory**: bytes of the weights and of a KV cache at a stated batch and length.

A KV cache format is measured by running the forward through that cache: with ``cache_dtype="int8"``
each chunk's keys and values are quantized before attention reads them (``jaxlab.engine.kvcache``).

The reference is the model as loaded, in float32. For the embedded SmolLM2 file that is its Q4_1
weights dequantized, not the original bf16 model: :func:`baseline_notes` says what that means for int4.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab import quant
from jaxlab.engine.generate import jit_decode_on_device
from jaxlab.engine.kvcache import cache_bytes, init_cache, left_pad, rollback
from jaxlab.engine.model import Params, forward
from jaxlab.engine.steps import GREEDY, jit_prefill
from jaxlab.io import assets

EVAL_DIR = assets.data_dir() / "eval"  # data/eval: in the wheel, or a clone's (JAXLAB_DATA overrides)
EVAL_TEXT = EVAL_DIR / "stdlib.txt"
PROMPTS = EVAL_DIR / "prompts.json"
MAX_PPL_INCREASE_PCT = 1.0  # the quality targets
MIN_GREEDY_AGREEMENT = 0.90


@dataclass(frozen=True)
class Sizes:
    """How much to evaluate. ``DEFAULT``: the whole report (float32 and 7 quantized variants) took 5
    minutes on 2 busy CPU cores, ~45 % of it int4; ``SMALL`` is for tests and ``jaxlab bench --quick``."""

    window: int = 128  # tokens per evaluation window
    windows: int = 16  # windows, evenly spaced over the text (16 x 128 = 2,048 of its ~9,900 tokens)
    batch: int = 4  # windows per forward pass
    prompts: int = 32  # chat prompts for greedy agreement
    new_tokens: int = 32  # greedy tokens per prompt
    prompt_batch: int = 8  # prompts per forward pass (bounds the [B, T, vocab] logits in memory)


DEFAULT = Sizes()
SMALL = Sizes(window=32, windows=2, batch=2, prompts=4, new_tokens=6, prompt_batch=4)


# --------------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------------


def eval_tokens(tokenizer, path: Path = EVAL_TEXT) -> list[int]:
    """The evaluation text as token ids (no BOS: windows start mid-text)."""
    return tokenizer.encode(Path(path).read_text(encoding="utf-8"))


def eval_windows(ids: Sequence[int], window: int, n: int) -> np.ndarray:
    """``n`` windows of ``window`` tokens at evenly spaced starts, first at 0, last ending near the end:
    ``[n, window]`` int32. They never overlap, so no token is scored twice."""
    ids = np.asarray(ids, np.int32)
    if window < 2 or n < 1:
        raise ValueError(f"need window >= 2 and n >= 1, got window={window}, n={n}")
    if n * window > len(ids):
        raise ValueError(f"{n} windows of {window} tokens need {n * window} tokens; the text has {len(ids)}")
    stride = (len(ids) - window) // max(n - 1, 1)  # >= window because n * window <= len(ids)
    return np.stack([ids[i * stride : i * stride + window] for i in range(n)])


def load_prompts(path: Path = PROMPTS) -> list[str]:
    return [p["text"] for p in json.loads(Path(path).read_text(encoding="utf-8"))["prompts"]]


def chat_ids(tokenizer, prompts: Sequence[str]) -> list[list[int]]:
    """Each prompt as one user turn through the model's chat template, ready for the assistant's reply."""
    return [
        tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True)
        for p in prompts
    ]


# --------------------------------------------------------------------------------------------------
# The maths (pure)
# --------------------------------------------------------------------------------------------------


def token_nll(logp: jax.Array, targets: jax.Array) -> jax.Array:
    """-log p(target): logp [..., V], targets [...] -> [...]."""
    return -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]


def kl_divergence(ref_logp: jax.Array, logp: jax.Array) -> jax.Array:
    """KL(p_ref || p) = sum_v p_ref (log p_ref - log p) per position: [..., V] x [..., V] -> [...].
    Computed from log-probabilities, so tokens with p_ref ~ 0 contribute ~0 instead of 0 * inf."""
    return jnp.sum(jnp.exp(ref_logp) * (ref_logp - logp), axis=-1)


def kv_format(cache_dtype) -> str:
    """None / "float32" / jnp.float32 -> "float32"; "int8" / jnp.int8 -> "int8"."""
    name = "float32" if cache_dtype is None else jnp.dtype(cache_dtype).name
    if name not in quant.KV_FORMATS:
        raise ValueError(f"KV cache format must be one of {', '.join(quant.KV_FORMATS)}, got {cache_dtype!r}")
    return name


# --------------------------------------------------------------------------------------------------
# Teacher-forced scoring on the evaluation text (jitted; one program per parameter format and shape)
# --------------------------------------------------------------------------------------------------


def _next_logp(params: Params, tokens: jax.Array, kv: str) -> jax.Array:
    """Log-probabilities of the next token at every position but the last: tokens [B, T] -> [B, T-1, V].
    ``kv="int8"`` runs the forward through an int8 cache, so attention reads quantized keys and values."""
    b, t = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    cache = init_cache(params.config, b, t, "int8") if kv == "int8" else None
    logits, _ = forward(params, tokens, positions, cache)
    return jax.nn.log_softmax(logits[:, :-1], axis=-1)


@partial(jax.jit, static_argnames=("kv",))
def _reference_pass(params, tokens, kv="float32"):
    logp = _next_logp(params, tokens, kv)
    return logp, token_nll(logp, tokens[:, 1:]), jnp.argmax(logp, axis=-1)


@partial(jax.jit, static_argnames=("kv",))
def _candidate_pass(params, tokens, ref_logp, kv="float32"):
    logp = _next_logp(params, tokens, kv)
    return token_nll(logp, tokens[:, 1:]), kl_divergence(ref_logp, logp), jnp.argmax(logp, axis=-1)


def score_windows(
    ref_params: Params, candidates: dict, windows: np.ndarray, batch: int = 4, progress: bool = False
) -> dict:
    """Teacher-forced scores of every candidate against the reference on the same windows [n, W].

    ``candidates``: {label: (params, cache_dtype)}. The reference's log-probabilities are computed once
    per batch of windows and shared by all candidates. Returns {"reference": {...}, label: {...}} with
    ``perplexity``, ``nll`` (mean), ``tokens`` and, for candidates, ``kl`` (mean) and ``top1_agreement``."""
    from tqdm.auto import tqdm

    sums = {label: np.zeros(3) for label in candidates}  # nll, kl, agreeing positions
    ref_nll, count = 0.0, 0
    steps = -(-len(windows) // batch)
    bar = tqdm(total=steps * (1 + len(candidates)), desc="eval text", unit="pass", disable=not progress, leave=False)
    for i in range(0, len(windows), batch):
        tokens = jnp.asarray(windows[i : i + batch])
        ref_logp, nll, top = _reference_pass(ref_params, tokens)
        ref_nll += float(jnp.sum(nll))
        count += nll.size
        top = np.asarray(top)
        bar.update(1)
        for label, (params, cache_dtype) in candidates.items():
            c_nll, kl, c_top = _candidate_pass(params, tokens, ref_logp, kv=kv_format(cache_dtype))
            sums[label] += (float(jnp.sum(c_nll)), float(jnp.sum(kl)), int(np.sum(np.asarray(c_top) == top)))
            bar.update(1)
        del ref_logp
    bar.close()
    out = {"reference": {"nll": ref_nll / count, "perplexity": float(np.exp(ref_nll / count)), "tokens": count}}
    for label, (nll, kl, agree) in sums.items():
        out[label] = {
            "nll": nll / count,
            "perplexity": float(np.exp(nll / count)),
            "kl": kl / count,
            "top1_agreement": agree / count,
            "tokens": count,
        }
    return out


def perplexity(params: Params, windows: np.ndarray, cache_dtype=None, batch: int = 4, progress: bool = False) -> float:
    """exp(mean NLL) of the tokens the windows [n, W] predict; ``cache_dtype="int8"`` measures the
    int8 KV cache too."""
    if kv_format(cache_dtype) == "float32":
        return score_windows(params, {}, windows, batch, progress)["reference"]["perplexity"]
    return score_windows(params, {"q": (params, cache_dtype)}, windows, batch, progress)["q"]["perplexity"]


def next_token_stats(
    ref_params: Params, params: Params, windows: np.ndarray, cache_dtype=None, batch: int = 4, progress: bool = False
) -> dict:
    """Mean KL(p_ref || p) and top-1 agreement of the next-token distributions over the windows
    (teacher-forced on the text; the reference runs in float32 without a cache)."""
    s = score_windows(ref_params, {"q": (params, cache_dtype)}, windows, batch, progress)["q"]
    return {"kl": s["kl"], "top1_agreement": s["top1_agreement"], "tokens": s["tokens"]}


# --------------------------------------------------------------------------------------------------
# Greedy agreement over chat prompts
# --------------------------------------------------------------------------------------------------


def _kv_cache(params: Params, batch: int, length: int, kv: str):
    return init_cache(params.config, batch, length, jnp.int8 if kv == "int8" else jnp.float32)


@partial(jax.jit, donate_argnums=(3,))
def _teacher_forced(params, tokens, positions, cache):
    """A scoring pass, not a step: tokens [B, T] through the cache -> (argmax at every position [B, T],
    cache). Every position is judged on the given context, whatever the model would have chosen."""
    logits, cache = forward(params, tokens, positions, cache)
    return jnp.argmax(logits, axis=-1).astype(jnp.int32), cache


def _prompt_width(prompts: Sequence[Sequence[int]]) -> int:
    return max(len(p) for p in prompts)


def greedy_continuations(
    params: Params, prompts: Sequence[Sequence[int]], n_tokens: int, cache_dtype=None, batch: int = 8
) -> np.ndarray:
    """Greedy continuations, EOS ignored: prompt ids -> [len(prompts), n_tokens] int32. Prompts are
    left-padded to the longest one, prefilled in one pass (the engine's prefill step) and decoded on
    device (``decode_on_device``)."""
    kv, width = kv_format(cache_dtype), _prompt_width(prompts)
    pad = params.config.pad_id
    out = []
    for i in range(0, len(prompts), batch):
        rows = list(prompts[i : i + batch])
        tokens, positions = left_pad(rows, pad, width)
        cache = _kv_cache(params, len(rows), width + n_tokens, kv)
        first, _, cache = jit_prefill(params, jnp.asarray(tokens), jnp.asarray(positions), cache, None, GREEDY)
        lens = jnp.asarray([len(p) for p in rows], jnp.int32)
        toks, _ = jit_decode_on_device(params, first, lens, cache, steps=n_tokens)
        out.append(np.asarray(toks))
    return np.concatenate(out)


def greedy_agreement(
    ref_params: Params,
    params: Params,
    tokenizer,
    prompts,
    n_tokens: int = 32,
    cache_dtype=None,
    batch: int = 8,
    reference: np.ndarray | None = None,
) -> dict:
    """How often the quantized model picks the reference's greedy tokens on chat prompts (EOS ignored).

    1. The reference (float32, float32 cache) continues each prompt greedily for ``n_tokens`` tokens
       (``reference``, if given, is that result, so a report computes it once).
    2. **Token agreement (the headline):** a batched forward (``batch`` prompts per pass) of prompt +
       reference continuation through the quantized model and a ``cache_dtype`` cache; the fraction of
       the ``n_tokens`` positions where its argmax equals the reference's token. Every position is
       judged on the same context (the reference's), so one early disagreement costs one token: the
       number is stable, and it measures what the issue asks, how often quantization changes the
       model's choice.
    3. **Identical continuations:** the quantized model's own free-running greedy continuation (its
       cache after step 2, rolled back to the prompt, then decoded on device): how many equal the
       reference's exactly. Free-running divergence compounds, since after the first different token
       the two models continue different texts, so this count is harsh and noisy (a single near-tie
       flips a whole row); it is reported beside the headline, not instead of it.

    ``prompts``: strings (sent through ``tokenizer``'s chat template) or token-id lists. Returns
    {token_agreement, identical, prompts, tokens, first_divergence (per prompt, None if identical)}."""
    ids = chat_ids(tokenizer, prompts) if prompts and isinstance(prompts[0], str) else [list(p) for p in prompts]
    if reference is None:
        reference = greedy_continuations(ref_params, ids, n_tokens, None, batch)
    kv, width = kv_format(cache_dtype), _prompt_width(ids)
    pad = params.config.pad_id
    agree, own = [], []
    for i in range(0, len(ids), batch):
        rows, ref = ids[i : i + batch], reference[i : i + batch]
        # prompt + reference continuation (its last token only ever is a target), padded so that every
        # row's last prompt token sits in column width - 1
        seqs = [p + r[:-1].tolist() for p, r in zip(rows, ref)]
        tokens, positions = left_pad(seqs, pad, width + n_tokens - 1)
        cache = _kv_cache(params, len(rows), width + n_tokens, kv)
        top, cache = _teacher_forced(params, jnp.asarray(tokens), jnp.asarray(positions), cache)
        predicted = np.asarray(top[:, width - 1 :])  # [B, n_tokens]: the predictions of ref[:, 0..n-1]
        agree.append(predicted == ref)
        cache = rollback(cache, width)  # forget the reference's continuation: free-run from the prompt
        lens = jnp.asarray([len(p) for p in rows], jnp.int32)
        toks, _ = jit_decode_on_device(params, top[:, width - 1], lens, cache, steps=n_tokens)
        own.append(np.asarray(toks))
    agree, own = np.concatenate(agree), np.concatenate(own)
    same = own == reference
    return {
        "token_agreement": float(agree.mean()),
        "identical": int(same.all(axis=1).sum()),
        "prompts": len(ids),
        "tokens": int(agree.size),
        "first_divergence": [None if s.all() else int(np.argmin(s)) for s in same],
    }


# --------------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------------


def label(weights: str, kv: str) -> str:
    return weights if kv == "float32" else f"{weights} + int8 KV"


def quality_status(ppl_increase_pct: float, greedy: float) -> str:
    """PASS when perplexity rises by at most 1 % and greedy token agreement is at least 90 %."""
    return "PASS" if ppl_increase_pct <= MAX_PPL_INCREASE_PCT and greedy >= MIN_GREEDY_AGREEMENT else "MISS"


def layer_error_rows(ref_params: Params, quantized: dict) -> list[dict]:
    """Relative Frobenius error |W_q - W| / |W| per format and matrix kind (wq, ..., w_down, embed):
    the mean and max over the layers (``quant.layer_errors``)."""
    rows = []
    for fmt, qparams in quantized.items():
        by_kind: dict[str, list[float]] = {}
        for name, err in quant.layer_errors(ref_params, qparams):
            by_kind.setdefault(name.rsplit(".", 1)[-1], []).append(err)
        for kind, errs in by_kind.items():
            rows.append(
                {
                    "format": fmt,
                    "matrix": kind,
                    "count": len(errs),
                    "mean": float(np.mean(errs)),
                    "max": float(np.max(errs)),
                }
            )
    return rows


def baseline_notes(source: str, kind: str, layer_rows: list[dict], group: int) -> list[str]:
    """What the float32 reference is, and what that means for int4 (from the measured layer errors)."""
    notes = [f"reference: {source} as loaded, computed in float32"]
    if kind == "gguf" and source in assets.EMBEDDED:
        notes.append(
            "the embedded GGUF stores SmolLM2-135M-Instruct quantized (Q4_1 layers, Q8_0 embedding), so "
            "'float32' here is those weights dequantized, not the original bf16 model"
        )
    elif kind == "gguf":
        notes.append(
            "GGUF weights are dequantized to float32 as stored: for a quantized file (Q4_*, Q8_0, ...) "
            "'float32' is those weights, not the original model"
        )
    int4 = [r["max"] for r in layer_rows if r["format"] == "int4" and r["matrix"] != "embed"]
    if int4 and max(int4) < 1e-5:
        notes.append(
            f"int4 (group {group}) lands on these weights: largest per-layer error {max(int4):.1e}, because "
            "they already lie on a 4-bit grid with one scale and offset per 32 inputs (Q4_1); int4's loss "
            "here comes from its int8 embedding and its kernel alone and says little about int4 on an "
            "original bf16 model. For that, evaluate the hub's bf16 weights: jaxlab bench --quant-only --quality "
            "--model HuggingFaceTB/SmolLM2-135M-Instruct (needs the network)"
        )
    return notes


def quality_report(
    model=None,
    formats: Sequence[str] = quant.FORMATS,
    kv_formats: Sequence[str] = quant.KV_FORMATS,
    sizes: Sizes = DEFAULT,
    *,
    loaded=None,
    quantized: dict | None = None,
    group: int = quant.DEFAULT_GROUP,
    kv_batch: int = 32,
    kv_len: int = 256,
    progress: bool = False,
    log=None,
) -> dict:
    """Quality and memory of float32 and every ``formats`` x ``kv_formats`` variant of a model.

    ``model``: anything :func:`jaxlab.load` accepts (default: the embedded SmolLM2-135M); ``loaded``: an
    already loaded :class:`~jaxlab.engine.loading.Model` instead; ``quantized``: {format: Params} already built
    (others are quantized here as ``jaxlab.load(quant=...)`` does, :func:`jaxlab.quant.quantize_model`:
    ``group`` for int4, W8A8 calibrated). Returns {"model", "notes", "sizes", "kv_cache",
    "rows", "layer_errors", "seconds"}; each row has weights/kv, bytes, perplexity (and its increase
    over float32 in %), KL, top-1 agreement, greedy token agreement, identical continuations and
    ``status`` (PASS/MISS against ppl +<= 1 % and agreement >= 90 %; "reference" for float32)."""
    from jaxlab.engine.loading import load, resolve

    log = log or (lambda msg: None)
    t0 = time.perf_counter()
    m = loaded if loaded is not None else load(model, dtype="float32")  # the float32 reference, on every backend
    kind = resolve(model)[0] if loaded is None else ("gguf" if str(m.path or "").endswith(".gguf") else "other")
    ref, tok = m.params, m.tokenizer
    quantized = dict(quantized or {})
    for fmt in formats:
        if fmt not in quantized:
            log(f"quality: quantizing to {fmt}")
            quantized[fmt] = quant.quantize_model(ref, tok, fmt, group)
    keys = [("float32", "float32")] + [(w, kv) for w in ("float32", *formats) for kv in kv_formats]
    variants = {(w, kv): (ref if w == "float32" else quantized[w], kv) for w, kv in keys}  # float32 first

    log(f"quality: evaluation text, {sizes.windows} windows of {sizes.window} tokens, {len(variants)} variants")
    windows = eval_windows(eval_tokens(tok), sizes.window, sizes.windows)
    text = score_windows(
        ref, {k: v for k, v in variants.items() if k != ("float32", "float32")}, windows, sizes.batch, progress
    )
    text[("float32", "float32")] = {**text["reference"], "kl": 0.0, "top1_agreement": 1.0}

    prompts = chat_ids(tok, load_prompts()[: sizes.prompts])
    log(f"quality: float32 greedy continuations of {len(prompts)} prompts, {sizes.new_tokens} tokens each")
    reference = greedy_continuations(ref, prompts, sizes.new_tokens, None, sizes.prompt_batch)
    from tqdm.auto import tqdm

    rows = []
    base_ppl = text["reference"]["perplexity"]
    for (w, kv), (params, _) in tqdm(variants.items(), desc="greedy agreement", disable=not progress, leave=False):
        log(f"quality: greedy agreement, {label(w, kv)}")
        g = greedy_agreement(ref, params, tok, prompts, sizes.new_tokens, kv, sizes.prompt_batch, reference)
        s = text[(w, kv)]
        inc = 100.0 * (s["perplexity"] / base_ppl - 1.0)
        rows.append(
            {
                "label": label(w, kv),
                "weights": w,
                "kv_cache": kv,
                "weight_bytes": params.nbytes(),
                "kv_cache_bytes": cache_bytes(ref.config, kv_batch, kv_len, kv_format(kv)),
                "perplexity": s["perplexity"],
                "ppl_increase_pct": inc,
                "kl": s["kl"],
                "top1_agreement": s["top1_agreement"],
                "greedy_agreement": g["token_agreement"],
                "identical": g["identical"],
                "prompts": g["prompts"],
                "first_divergence": g["first_divergence"],
                "status": "reference"
                if (w, kv) == ("float32", "float32")
                else quality_status(inc, g["token_agreement"]),
            }
        )
    layer_rows = layer_error_rows(ref, {f: quantized[f] for f in formats})
    return {
        "model": m.source,
        "notes": baseline_notes(m.source, kind, layer_rows, group),
        "sizes": asdict(sizes),
        "eval_text": str(EVAL_TEXT.relative_to(EVAL_DIR.parent.parent)),
        "eval_tokens": text["reference"]["tokens"],
        "kv_cache": {"batch": kv_batch, "length": kv_len},
        "targets": {"max_ppl_increase_pct": MAX_PPL_INCREASE_PCT, "min_greedy_agreement": MIN_GREEDY_AGREEMENT},
        "rows": rows,
        "layer_errors": layer_rows,
        "seconds": time.perf_counter() - t0,
    }
