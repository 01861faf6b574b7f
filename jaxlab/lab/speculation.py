"""Speculative decoding, measured: acceptance and speed-up by task type (:func:`measure`, the bench's own, from
:mod:`jaxlab.bench.speculative`), how well an
early exit of the model guesses (:func:`early_exit_agreement`), the cost model (:func:`step_costs`,
:func:`expected_speedup`), the rejection rule's output distribution (:func:`first_token_frequencies`),
and the rounds shown and plotted for notebook 10 and ``jaxlab bench``.
The decoder itself is :mod:`jaxlab.engine.speculative`."""

from __future__ import annotations

import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.bench.speculative import TASK_PROMPTS, TASK_TYPES, measure  # noqa: F401  (notebook 10 reads them here)
from jaxlab.engine.kvcache import left_pad
from jaxlab.engine.model import Params, forward
from jaxlab.engine.sampling import SamplingParams
from jaxlab.engine.speculative import (
    DEFAULT_DRAFT_LAYERS,
    DEFAULT_K,
    SpecResult,
    SpeculativeDecoder,
    speculative_sample,
)
from jaxlab.errors import InvalidRequestError
from jaxlab.io.tokenizer import prompt_ids


def chat_prompt(tokenizer, text: str) -> list[int]:
    """A user message rendered with the model's chat template, ready for the assistant's reply
    (:func:`jaxlab.io.tokenizer.prompt_ids`)."""
    return prompt_ids(tokenizer, text)


def _exit_tokens(params: Params, tokens, positions, layers: tuple, n_score: int):
    """Greedy tokens of the model cut after each of ``layers`` (one pass of ``forward(..., upto=layers)``:
    the final norm and output embedding read each exit's output), at the last ``n_score`` positions but
    one: [len(layers), B, n_score]."""
    logits, _ = forward(params, tokens, positions, upto=layers)  # one [B, T, V] per exit
    return jnp.stack([jnp.argmax(x[:, -n_score - 1 : -1], axis=-1) for x in logits])


_jit_exit_tokens = jax.jit(_exit_tokens, static_argnames=("layers", "n_score"))


def early_exit_agreement(
    params: Params,
    prompts: Sequence[Sequence[int]],
    generated: Sequence[Sequence[int]],
    layers: Sequence[int] | None = None,
) -> dict[int, float]:
    """How often would a draft made of the first L layers guess the model's next greedy token?

    For each L, the fraction of the ``generated`` tokens (all but the first) that the model cut after
    L layers predicts from the true context: exactly the chance that such a draft's token is accepted
    when the tokens before it were right (the per-token acceptance rate). One forward pass scores every
    L (``forward(..., upto=layers)``: one exit per L); the full depth must give 1.0, which checks the probe itself. ``generated`` rows must have equal
    lengths (e.g. greedy runs with EOS ignored)."""
    cfg = params.config
    layers = tuple(sorted(set(layers or range(1, cfg.n_layers + 1))))
    g = {len(x) for x in generated}
    if len(g) != 1 or min(g) < 2:
        raise InvalidRequestError("give generated rows of one length >= 2")
    n_score = g.pop() - 1
    seqs = [list(p) + list(x) for p, x in zip(prompts, generated)]
    tokens, positions = left_pad(seqs, cfg.pad_id)
    picks = np.asarray(_jit_exit_tokens(params, jnp.asarray(tokens), jnp.asarray(positions), layers, n_score))
    truth = np.asarray([list(x)[1:] for x in generated])  # [B, n_score]
    return {L: float((picks[j] == truth).mean()) for j, L in enumerate(layers)}


def step_costs(
    params: Params,
    k: int = DEFAULT_K,
    batch: int = 1,
    draft_layers: int | None = DEFAULT_DRAFT_LAYERS,
    prompt_len: int = 128,
    max_new_tokens: int = 32,
    repeats: int = 5,
) -> dict[str, float]:
    """Seconds (best of ``repeats``) of one plain decode step (T=1), one verify step (T=k+1) and, with
    ``draft_layers``, one draft round (k tokens of the draft model), with the same programs and shapes
    a generation of ``batch`` prompts of ``prompt_len`` tokens uses (the decoder's own, already compiled
    if a run of that shape came first)."""
    dec = SpeculativeDecoder(params, method="draft" if draft_layers else "ngram", k=k, draft_layers=draft_layers or 1)
    cache_len = dec.plan([prompt_len] * batch, max_new_tokens).cache_len
    samp = SamplingParams().state()
    key = jax.random.key(0)
    pos = np.full((batch,), prompt_len, np.int32)

    def best(call, cache):
        times = []
        for _ in range(repeats + 1):  # the first call may compile
            t0 = time.perf_counter()
            out, cache = call(cache)
            jax.block_until_ready(out)
            times.append(time.perf_counter() - t0)
        return min(times[1:])

    def verify(t):
        toks = np.ones((batch, t), np.int32)
        positions = pos[:, None] + np.arange(t, dtype=np.int32)[None]
        return lambda c: (lambda o: (o[0], o[2]))(dec.verify(toks, positions, c, prompt_len, None, key, samp))

    costs = {
        "decode_s": best(verify(1), dec.init_caches(batch, cache_len)[0]),
        "verify_s": best(verify(k + 1), dec.init_caches(batch, cache_len)[0]),
    }
    if draft_layers:
        ones = np.ones((batch,), np.int32)
        costs["draft_s"] = best(
            lambda c: (lambda o: (o[0], o[2]))(dec.draft(ones, ones, pos, c, prompt_len - 1, key, samp)),
            dec.init_caches(batch, cache_len)[1],
        )
    return costs


def first_token_frequencies(p, q, n: int = 100_000, seed: int = 0, rule=None) -> np.ndarray:
    """Frequencies of the first token emitted by a rejection ``rule`` (default
    :func:`jaxlab.engine.speculative.speculative_sample`) over ``n`` independent rounds with one draft
    token drawn from ``q`` [V] and target ``p`` [V]. With a correct rule they approach ``p``, whatever
    ``q`` is."""
    rule = rule or speculative_sample
    p = jnp.asarray(p, jnp.float32)
    q = jnp.asarray(q, jnp.float32)
    k_d, k_r = jax.random.split(jax.random.key(seed))
    drafts = jax.random.categorical(k_d, jnp.log(q), shape=(n, 1)).astype(jnp.int32)
    pp = jnp.broadcast_to(jnp.stack([p, p]), (n, 2, p.shape[-1]))  # position 0 and the bonus position
    qq = jnp.broadcast_to(q[None], (n, 1, q.shape[-1]))
    out, _ = jax.jit(rule)(pp, qq, drafts, k_r)
    return np.bincount(np.asarray(out[:, 0]), minlength=p.shape[-1]) / n


def expected_tokens_per_call(alpha, k: int):
    """Expected tokens per verify call when each draft token is accepted with probability ``alpha``
    (independently): 1 + alpha + ... + alpha^k = (1 - alpha^(k+1)) / (1 - alpha)."""
    alpha = np.asarray(alpha, np.float64)
    return np.where(alpha < 1, (1 - alpha ** (k + 1)) / np.where(alpha < 1, 1 - alpha, 1), k + 1.0)


def expected_speedup(alpha, k: int, verify_cost: float, draft_cost: float = 0.0):
    """Predicted speed-up over plain decoding: tokens per round / cost of a round, where a round costs
    one verify step (``verify_cost`` plain decode steps) plus k draft steps (``draft_cost`` each)."""
    return expected_tokens_per_call(alpha, k) / (verify_cost + k * draft_cost)


# --------------------------------------------------------------------------------------------------
# Showing the rounds
# --------------------------------------------------------------------------------------------------


def _piece(tokenizer, t: int) -> str:
    """A token's text for a table cell: newlines escaped, a token of spaces shown as ␣."""
    if tokenizer is None:
        return str(t)
    text = tokenizer.decode([t])
    return "␣" * len(text) if text and not text.strip(" ") else text.replace("\n", "\\n")


def describe_rounds(result: SpecResult, tokenizer=None, max_rounds: int = 6) -> list[dict]:
    """The first rounds of a run as table rows: what was drafted, how much of it the model kept, the
    model's own token (correction or bonus), and the text emitted."""
    rows = []
    for r, (drafts, out, _own, n) in enumerate(result.rounds[:max_rounds], 1):
        rows.append(
            {
                "round": r,
                "drafted": "|".join(_piece(tokenizer, t) for t in drafts) if drafts else "(no draft)",
                "kept": n if drafts else 0,
                "model's token": _piece(tokenizer, out[n]),
                "emitted": "".join(_piece(tokenizer, t) for t in out[: n + 1]),
            }
        )
    return rows


def plot_rounds(result: SpecResult, tokenizer=None, max_rounds: int = 8, ax=None):
    """Draw the rounds: drafted tokens in green (kept) or red (the first wrong one; later ones grey,
    never looked at), then the model's own token in blue. Returns the matplotlib axes."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    rounds = result.rounds[:max_rounds]
    k = result.k
    if ax is None:
        _, ax = plt.subplots(figsize=(1.5 * (k + 1) + 1, 0.55 * len(rounds) + 0.8))
    for r, (drafts, out, _own, n) in enumerate(rounds):
        y = len(rounds) - 1 - r
        if drafts is None:  # no n-gram recurred: a plain decode step
            ax.add_patch(Rectangle((0, y + 0.1), k - 0.05, 0.8, facecolor="white", edgecolor="gray"))
            ax.text(k / 2, y + 0.5, "no draft: a plain decode step", ha="center", va="center", fontsize=8, color="gray")
            cells = [None] * k
        else:
            cells = [
                (_piece(tokenizer, d), "#8fd694" if j < n else ("#f08080" if j == n else "#dddddd"))
                for j, d in enumerate(drafts)
            ]
        cells.append((_piece(tokenizer, out[n]), "#8ab6f9"))
        for j, cell in enumerate(cells):
            if cell is None:
                continue
            x = j + (0.3 if j == k else 0)
            ax.add_patch(Rectangle((x, y + 0.1), 0.95, 0.8, facecolor=cell[1], edgecolor="gray"))
            ax.text(x + 0.475, y + 0.5, cell[0][:10], ha="center", va="center", fontsize=8)
    ax.set_xlim(0, k + 1.3)
    ax.set_ylim(0, len(rounds))
    ax.set_yticks([len(rounds) - 1 - r + 0.5 for r in range(len(rounds))])
    ax.set_yticklabels([f"round {r + 1}" for r in range(len(rounds))])
    ax.set_xticks([j + 0.475 for j in range(k)] + [k + 0.775])
    ax.set_xticklabels([f"draft {j + 1}" for j in range(k)] + ["model"])
    ax.set_xlabel("draft tokens, then the model's own token")
    ax.set_ylabel("round")
    ax.grid(False)
    ax.set_title("green: kept, red: first wrong guess, grey: not used, blue: the model's own token", fontsize=9)
    return ax


def plot_speedup(costs: dict, k: int, measured: Sequence[dict] = (), ax=None):
    """Speed-up against tokens per verify call: the cost model ``speed-up = tokens per call / cost of a
    round`` (in plain decode steps) with this machine's measured step costs (:func:`step_costs`), for
    n-gram drafts (free) and the draft model (k draft steps per round), next to the ideal of a verify
    step that costs one decode step (a memory-bound step on a GPU or TPU comes close); ``measured``
    rows (from :func:`measure`) are drawn as points. Returns the matplotlib axes."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots()
    x = np.linspace(1, k + 1, 50)
    verify = costs["verify_s"] / costs["decode_s"]
    ax.plot(x, x, "k--", label="ideal: verify costs 1 decode step")
    ax.plot(x, x / verify, label=f"n-gram drafts (verify = {verify:.1f} decode steps)")
    if "draft_s" in costs:
        draft = costs["draft_s"] / costs["decode_s"]
        ax.plot(x, x / (verify + draft), label=f"draft model ({k} draft tokens = {draft:.1f} decode steps)")
    for i, r in enumerate(measured):
        ax.plot(r["tokens/call"], r["speed-up"], "o", color="C0" if r["method"] == "ngram" else "C1")
        ax.annotate(
            r["task"],
            (r["tokens/call"], r["speed-up"]),
            fontsize=7,
            xytext=(5, 4 if i % 2 else -10),
            textcoords="offset points",
        )
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_title("Speed-up: the cost model with this machine's step costs, and the measured prompts", fontsize=9)
    ax.set_xlabel("tokens per verify call")
    ax.set_ylabel("speed-up over plain decoding")
    ax.legend(fontsize=7)
    return ax
