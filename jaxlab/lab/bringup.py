"""Notebook 18's measurements of the second architecture: what a Gated DeltaNet layer costs per decoded token as
the context grows (against full attention), and what the chunked form buys a prefill (against the recurrent one).

Every timing is the best of ``repeats`` synchronized calls of one compiled program, after a warm-up call
(:func:`jaxlab.tools.profile.time_fn`, or the same loop threading a donated cache); the sizes come from
:class:`jaxlab.io.config.Qwen35Config` presets with every layer of one kind, so a row is that kind's cost alone.
"""

from __future__ import annotations

import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.engine import qwen35
from jaxlab.io.config import Qwen35Config
from jaxlab.tools.profile import time_fn

KINDS = {"full_attention": "full attention (KV cache)", "linear_attention": "Gated DeltaNet (state)"}


def one_kind(cfg: Qwen35Config, kind: str) -> Qwen35Config:
    """``cfg`` with every layer of one kind ("full_attention" or "linear_attention")."""
    return cfg.replace(layer_types=(kind,) * cfg.n_layers)


def decode_cost_vs_context(cfg: Qwen35Config, contexts: Sequence[int], repeats: int = 5, seed: int = 0) -> list[dict]:
    """One decode step (batch 1) at each context length, for a model of only attention layers and one of only
    DeltaNet layers at ``cfg``'s sizes -> rows {kind, context, ms (the whole step, per token), cache_bytes (that
    kind's layers only)}. The attention step reads a KV cache of ``context`` slots; the DeltaNet step reads its
    fixed state whatever the context (the convolution's K-1 inputs and a [Dk, Dv] matrix per value head).

    The vocabulary is cut to 256 so the output head (49,152 x 576 at SmolLM2's) does not hide the layers."""
    rows = []
    step = jax.jit(qwen35.next_tokens, donate_argnums=(3,))  # as a decode loop runs it: the cache updated in place
    for kind in KINDS:
        c = one_kind(cfg, kind).replace(vocab_size=256)
        params = qwen35.init_params(c, seed)
        for n in contexts:
            cache = qwen35.init_hybrid_cache(c, 1, n)
            held = cache.kv.nbytes() if kind == "full_attention" else cache.nbytes() - cache.kv.nbytes()
            token = jnp.ones((1, 1), jnp.int32)
            positions = jnp.full((1, 1), n - 1, jnp.int32)  # the last slot: attention reads n keys
            _, _, cache = step(params, token, positions, cache)  # compiles; the cache comes back for the next call
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                _, _, cache = jax.block_until_ready(step(params, token, positions, cache))
                times.append(time.perf_counter() - t0)
            rows.append({"kind": kind, "context": n, "ms": min(times) * 1e3, "cache_bytes": held})
    return rows


def growth(rows: Sequence[dict], kind: str) -> float:
    """A kind's time per token at its longest context over its shortest: 1 is flat."""
    mine = sorted((r for r in rows if r["kind"] == kind), key=lambda r: r["context"])
    return mine[-1]["ms"] / mine[0]["ms"]


def faster_form(rows: Sequence[dict], tokens: int) -> tuple[str, float]:
    """The form that prefilled ``tokens`` fastest, and how many times faster than the other."""
    mine = sorted((r for r in rows if r["tokens"] == tokens), key=lambda r: r["ms"])
    return mine[0]["form"], mine[-1]["ms"] / mine[0]["ms"]


def prefill_forms(
    cfg: Qwen35Config, lengths: Sequence[int], forms=("recurrent", "chunked"), repeats: int = 3, seed: int = 0
) -> list[dict]:
    """A prefill of ``length`` tokens (batch 1) with the DeltaNet layers in each form -> rows {form, tokens, ms,
    tokens_per_s}. The forms give the same logits (tests/engine/test_qwen35.py); the recurrent form runs one
    rank-1 update per token in sequence, the chunked one a few matmuls per chunk of 64."""
    cfg = cfg.replace(vocab_size=256)  # the layers' cost, not the output head's
    params = qwen35.init_params(cfg, seed)
    step = jax.jit(qwen35.next_tokens, static_argnames="form")
    rows = []
    for t in lengths:
        tokens = jnp.asarray(np.random.default_rng(seed).integers(0, cfg.vocab_size, (1, t)), jnp.int32)
        positions = jnp.arange(t, dtype=jnp.int32)[None]
        for form in forms:
            cache = qwen35.init_hybrid_cache(cfg, 1, t)
            s = time_fn(step, params, tokens, positions, cache, form=form, repeats=repeats).min
            rows.append({"form": form, "tokens": t, "ms": s * 1e3, "tokens_per_s": t / s})
    return rows


def plot_decode_cost(rows: Sequence[dict], title: str):
    """Two panels: ms per decoded token and cache bytes against the context, one line per kind of layer."""
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    for kind, label in KINDS.items():
        mine = sorted((r for r in rows if r["kind"] == kind), key=lambda r: r["context"])
        x = [r["context"] for r in mine]
        a.plot(x, [r["ms"] for r in mine], "o-", label=label)
        b.plot(x, [r["cache_bytes"] / 2**20 for r in mine], "o-", label=label)
    for ax, ylabel in ((a, "ms per decoded token"), (b, "cache MiB (batch 1)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    a.legend()
    fig.suptitle(title)
    fig.tight_layout()
    return fig
