"""Attention masks as pictures (notebooks 03 and 06): which keys each query may see.

jaxlab builds the mask from positions alone (:mod:`jaxlab.engine.model`, ``Attention``): a query at position
``p`` sees every key whose position lies in ``[0, p]``; padding has position -1, so no query sees it. The same
rule gives the causal mask of one prompt, the mask of a left-padded batch, and a cached decode step's mask.
:func:`visible` restates that rule in NumPy; :func:`plot_masks` draws it, one panel per row of a batch.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def visible(q_positions, k_positions) -> np.ndarray:
    """The model's attention mask: q_positions [B, T], k_positions [B, S] -> bool [B, T, S], True where the
    query may attend to the key (the key is not padding and is not later than the query)."""
    q, k = np.asarray(q_positions), np.asarray(k_positions)
    return (k[:, None, :] >= 0) & (k[:, None, :] <= q[:, :, None])


def plot_masks(positions, titles: Sequence[str] | None = None, suptitle: str | None = None):
    """One panel per row of ``positions`` [B, T] (e.g. from ``left_pad``): the [T, T] mask of that row,
    queries down, keys across; visible cells dark, padding columns and rows shaded. Returns the figure."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    pos = np.atleast_2d(np.asarray(positions))
    mask = visible(pos, pos)
    b, t = pos.shape
    fig, axes = plt.subplots(1, b, figsize=(min(3.0 * b, 13), 3.3), squeeze=False)
    # 0: hidden, 1: hidden because padding, 2: visible
    cmap = ListedColormap(["#f4f4f4", "#d9c9a3", "#2b5d8a"])
    for i, ax in enumerate(axes[0]):
        pad = pos[i] < 0
        img = np.where(mask[i], 2, np.where(pad[None, :] | pad[:, None], 1, 0))
        ax.imshow(img, cmap=cmap, vmin=0, vmax=2, interpolation="nearest")
        n_pad = int(pad.sum())
        title = titles[i] if titles is not None else (f"row {i}: {n_pad} padding" if n_pad else f"row {i}: no padding")
        ax.set(title=title, xlabel="key column", ylabel="query column" if i == 0 else "")
        ax.set_xticks(range(0, t, max(1, t // 6)))
        ax.set_yticks(range(0, t, max(1, t // 6)))
        ax.grid(False)
    fig.suptitle(
        suptitle or "Attention mask: dark = visible (0 <= key position <= query position), tan = padding", fontsize=10
    )
    fig.tight_layout()
    return fig


def visible_counts(positions) -> np.ndarray:
    """How many keys each query of each row sees: positions [B, T] -> [B, T] (0 for padding queries)."""
    pos = np.asarray(positions)
    return visible(pos, pos).sum(-1)
