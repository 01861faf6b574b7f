"""What notebook 17 needs beside the engine: a grammar walked token by token (how many tokens each step allows),
its plot, the stored bench's quality as bars, and the vocabulary's tokens that cross a JSON boundary."""

from __future__ import annotations

import numpy as np

from jaxlab.engine.grammar import Constraint, Matcher, allow_all


def allowed_count(row: np.ndarray, vocab: int) -> int:
    """Tokens a bitmask row [ceil(vocab / 32)] int32 allows."""
    return int(np.unpackbits(row.view(np.uint8), bitorder="little")[:vocab].sum())  # bit i of word w: token 32w + i


def walk(constraint: Constraint, tokenizer, vocab: int, token_ids) -> list[tuple[str, int]]:
    """Feed ``token_ids`` (a reply that matches ``constraint``) through its matcher: before each token, how many of
    the ``vocab`` tokens the grammar allowed -> [(the token's text, allowed count)]."""
    m, row = Matcher(constraint, tokenizer, vocab), allow_all(1, vocab)[0]
    out = []
    for t in token_ids:
        m.fill(row)
        if not (row[t // 32] >> (t % 32)) & 1:
            raise ValueError(f"token {t} ({tokenizer.decode([t])!r}) is not allowed here: the reply breaks the grammar")
        out.append((tokenizer.decode([t]), allowed_count(row, vocab)))
        m.advance(t)
    return out


def plot_allowed(steps: list[tuple[str, int]], vocab: int, title: str = ""):
    """Allowed tokens per step (log scale), each step labelled with the token chosen there."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(min(12, 1.5 + 0.33 * len(steps)), 3.4))
    counts = [c for _, c in steps]
    ax.bar(range(len(steps)), counts, color=["tab:red" if c == 1 else "tab:blue" for c in counts])
    ax.set_yscale("log")
    ax.axhline(vocab, color="gray", lw=0.8, ls="--")
    ax.text(len(steps) - 0.5, vocab, f"vocabulary {vocab:,}", ha="right", va="bottom", fontsize=8, color="gray")
    ax.set_xticks(range(len(steps)), [repr(p)[1:-1] for p, _ in steps], rotation=90, fontsize=8)
    ax.set_ylabel("tokens allowed")
    ax.set_title(title or "the grammar's mask at each step (red: exactly one token allowed)", fontsize=9)
    fig.tight_layout()
    return fig


def plot_quality(rows: list[dict], title: str = ""):
    """``jaxlab bench --structured``'s rows as grouped bars: schema-valid, whole-object match and fields right, for
    each weights x schema setting (the form the mask fixes beside the content it does not)."""
    import matplotlib.pyplot as plt

    metrics = (("schema_valid", "schema-valid"), ("match", "object matches"), ("field_exact", "fields right"))
    fig, ax = plt.subplots(figsize=(8, 3.4))
    width = 0.8 / len(rows)
    for j, r in enumerate(rows):
        vals = [100 * r[k] for k, _ in metrics]
        label = f"{r['weights']}, {'with' if r['schema'] else 'without'} the schema"
        bars = ax.bar(np.arange(len(metrics)) + (j - (len(rows) - 1) / 2) * width, vals, width, label=label,
                      hatch="//" if r["schema"] else None, edgecolor="white")  # fmt: skip
        ax.bar_label(bars, fmt="%.0f", fontsize=7)
    ax.set_xticks(range(len(metrics)), [name for _, name in metrics])
    ax.set_ylabel("% of test items")
    ax.set_ylim(0, 112)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title(title or "the mask fixes the form; the weights decide the content", fontsize=9)
    fig.tight_layout()
    return fig


def boundary_tokens(tokenizer, vocab: int) -> list[str]:
    """Tokens whose text holds a double quote with other characters around it (``'",'``, ``'":'``, ``' "'``): each
    one ends one JSON element and starts the next, so a grammar must be walked byte by byte through them."""
    out = []
    for i in range(min(vocab, tokenizer.vocab_size)):
        if i in tokenizer.special_ids:
            continue
        text = tokenizer.decode([i])
        if '"' in text and len(text.strip()) > 1:
            out.append(text)
    return out
