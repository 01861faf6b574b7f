"""Notebook 15's figures and the stored results it reads: the LoRA picture, the loss mask, loss curves, training speed.

Only drawing and reading files: the training itself is :mod:`jaxlab.train`, which the notebook calls directly.
"""

from __future__ import annotations

import json

import numpy as np

from jaxlab.io.assets import data_file
from jaxlab.lab.notebook import stored


def stored_run() -> dict:
    """The full fine-tuning run recorded with ``jaxlab finetune`` (``data/finetune/run-cpu.json``), with ``label``:
    its host and date."""
    run = json.loads(data_file("finetune", "run-cpu.json").read_text())
    run["label"] = f"stored run: {run.get('host', {}).get('cpu', '?')}, {run.get('date', '?')}"
    return run


def stored_bench() -> dict:
    """``jaxlab bench --train``'s stored result (``data/bench/train-cpu.json``), labelled with its host and date."""
    return stored("train-cpu")


def plot_lora(dims: tuple[int, int] = (576, 1536), ranks=(1, 2, 4, 8, 16, 32, 64)):
    """Left: the adapted layer, x W (frozen) + (alpha/r) x A B, drawn to scale; right: trained numbers per rank."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    n_in, n_out = dims
    r = 8
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 3.6), gridspec_kw={"width_ratios": [1.4, 1]})
    s = 1 / 400  # data units per row/column
    ax.add_patch(Rectangle((0, 0), n_out * s, n_in * s, color="#9aa5b1"))
    ax.text(n_out * s / 2, n_in * s / 2, f"W  [{n_in} x {n_out}]\nfrozen", ha="center", va="center")
    x0 = n_out * s + 0.6
    ax.text(x0 - 0.3, n_in * s / 2, "+", fontsize=18, ha="center", va="center")
    ax.add_patch(Rectangle((x0, 0), max(r * s, 0.08), n_in * s, color="#e4572e"))
    ax.text(x0 + 0.15, -0.15, f"A [{n_in} x {r}]", ha="left", va="top", fontsize=8)
    ax.add_patch(Rectangle((x0 + 0.4, n_in * s - max(r * s, 0.08)), n_out * s, max(r * s, 0.08), color="#29335c"))
    ax.text(x0 + 0.4 + n_out * s / 2, n_in * s + 0.1, f"B [{r} x {n_out}], starts at 0", ha="center", fontsize=8)
    ax.set_xlim(-0.2, x0 + 0.6 + n_out * s)
    ax.set_ylim(-0.5, n_in * s + 0.5)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(f"one MLP kernel with a rank-{r} adapter: {r * (n_in + n_out):,} trained vs {n_in * n_out:,} frozen")
    bx.bar([str(k) for k in ranks], [k * (n_in + n_out) / (n_in * n_out) * 100 for k in ranks], color="#e4572e")
    bx.set_xlabel("rank r")
    bx.set_ylabel("trained numbers, % of the kernel")
    bx.set_title("adapter size grows with r")
    fig.tight_layout()
    return fig


def plot_loss_mask(tokenizer, tokens: np.ndarray, at: np.ndarray, weights: np.ndarray, row: int = 0, width: int = 16):
    """The tokens of one training row, coloured by role: prompt (given), answer (scored), padding."""
    import matplotlib.pyplot as plt

    scored = {int(p) + 1 for p, w in zip(at[row], weights[row]) if w > 0}  # the token each scored position predicts
    n = len(tokens[row])
    rows = -(-n // width)
    fig, ax = plt.subplots(figsize=(12, 0.42 * rows + 0.6))
    pad_from = n
    for t in range(n):
        if t in scored:
            color = "#e4572e"
        elif t >= pad_from or (t > max(scored) and tokens[row, t] == tokens[row, -1]):
            color, pad_from = "#eeeeee", min(pad_from, t)
        else:
            color = "#cfd8dc"
        y, x = divmod(t, width)
        ax.add_patch(plt.Rectangle((x, -y), 0.95, 0.9, color=color))
        text = tokenizer.decode([int(tokens[row, t])]).replace("\n", "\\n")
        ax.text(x + 0.47, -y + 0.45, text[:9], ha="center", va="center", fontsize=6.5)
    ax.set_xlim(0, width)
    ax.set_ylim(-rows + 0.9, 1)
    ax.axis("off")
    ax.set_title("one training row: prompt (grey, given), answer + end of turn (red, the loss), padding (light)")
    fig.tight_layout()
    return fig


def plot_loss_curves(stored: dict, live_losses=None):
    """The stored full run's training and validation loss, and the notebook's few live steps."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.6))
    ax.plot(stored["steps"], stored["loss"], label="stored full run: training loss", color="#29335c")
    if stored.get("val_steps"):
        ax.plot(
            stored["val_steps"], stored["val_loss"], "o-", label="stored full run: validation loss", color="#e4572e"
        )
    if live_losses:
        ax.plot(range(1, len(live_losses) + 1), live_losses, "s--", label="this notebook's live steps", color="#f3a712")
    ax.set_yscale("log")
    ax.set_xlabel("step (batch of 8 examples)" if not live_losses else "step")
    ax.set_ylabel("loss on answer tokens (nats/token)")
    host = stored.get("host", {})
    ax.set_title(f"LoRA fine-tuning loss  (stored run: {host.get('cpu', '?')}, {stored.get('date', '')})", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_train_bench(bench: dict):
    """Tokens/s and the step's temporary memory for LoRA vs full fine-tuning, with and without remat."""
    import matplotlib.pyplot as plt

    rows = bench["rows"]
    names = [r["variant"] for r in rows]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 3.4))
    ax.bar(names, [r["tokens_per_s"] for r in rows], color="#29335c")
    ax.set_ylabel("real tokens / s")
    for i, r in enumerate(rows):
        ax.text(i, r["tokens_per_s"], f"MFU {r['mfu_vs_measured_ceiling']:.0%}", ha="center", va="bottom", fontsize=8)
    bx.bar(names, [(r["temp_bytes"] or 0) / 1e9 for r in rows], color="#e4572e")
    bx.set_ylabel("temporary memory of the step (GB)")
    for a in (ax, bx):
        a.tick_params(axis="x", labelrotation=20, labelsize=8)
    meta = bench.get("meta", {})
    fig.suptitle(f"jaxlab bench --train, stored: {meta.get('cpu', '?')}, {meta.get('date', '')}", fontsize=9)
    fig.tight_layout()
    return fig


def stored_peers() -> dict:
    """``make peers``' stored result: the exported GGUF files in llama.cpp (``data/bench/peers-export.json``), with
    ``label``: its host and date."""
    peers = json.loads(data_file("bench", "peers-export.json").read_text())
    peers["label"] = f"stored run: {peers.get('cpu', '?')}, {peers.get('date', '?')}"
    return peers
