"""Notebook 14's figures of the encoder's embeddings (the encoder itself is :mod:`jaxlab.engine.encoder`): a
similarity heatmap, the encoder's speed against PyTorch from the bench's stored run, and a 2-D map of chunk
embeddings (PCA by SVD, numpy only)."""

from __future__ import annotations

import numpy as np

from jaxlab.lab.notebook import stored  # noqa: F401 - notebook 14 reads its stored runs as embedding_plots.stored


def plot_similarity(vectors: np.ndarray, labels: list[str], title: str):
    import matplotlib.pyplot as plt

    sim = vectors @ vectors.T
    fig, ax = plt.subplots(figsize=(6.4, 5.2))
    im = ax.imshow(sim, vmin=-0.2, vmax=1, cmap="viridis")
    ax.set_xticks(range(len(labels)), labels, rotation=60, ha="right", fontsize=7)
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    for i in range(len(labels)):
        for j in range(len(labels)):
            ax.text(
                j, i, f"{sim[i, j]:.2f}", ha="center", va="center", fontsize=6, color="w" if sim[i, j] < 0.6 else "k"
            )
    fig.colorbar(im, ax=ax, shrink=0.8, label="cosine similarity")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_speed(result: dict):
    """Tokens/s by shape for jaxlab, PyTorch eager and torch.compile, from a stored ``--encoder`` run."""
    import matplotlib.pyplot as plt

    rows = result["rows"]
    names = ["jaxlab (jit)", "PyTorch eager", "torch.compile"]
    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(8, 3.4))
    for i, n in enumerate(names):
        ax.bar(x + (i - 1) * 0.27, [r["tokens_per_s"].get(n, 0) for r in rows], 0.27, label=n)
    ax.set_xticks(x, [f"{r['batch']} x {r['length']}" for r in rows])
    ax.set_xlabel("batch x tokens per row")
    ax.set_ylabel("tokens / s")
    ax.legend(fontsize=8)
    ax.set_title(f"all-MiniLM-L6-v2 forward + pooling ({result['label']})", fontsize=9)
    fig.tight_layout()
    return fig


def pca_2d(vectors: np.ndarray) -> np.ndarray:
    """The first two principal components of ``vectors`` (rows), by SVD of the centred matrix."""
    x = vectors - vectors.mean(0)
    _, _, vt = np.linalg.svd(x, full_matrices=False)
    return x @ vt[:2].T


def plot_map(vectors: np.ndarray, groups: list[str], title: str, highlight=None):
    """Chunks as points in 2-D (PCA), one colour per group; ``highlight``: (2-D point, label) of a query."""
    import matplotlib.pyplot as plt

    xy = pca_2d(np.concatenate([vectors, highlight[0][None]]) if highlight else vectors)
    fig, ax = plt.subplots(figsize=(7, 5))
    names = sorted(set(groups))
    cmap = plt.get_cmap("tab20", len(names))
    for i, name in enumerate(names):
        sel = [j for j, g in enumerate(groups) if g == name]
        ax.scatter(xy[sel, 0], xy[sel, 1], s=14, color=cmap(i), label=name.rsplit(".", 1)[-1])
    if highlight:
        ax.scatter(*xy[-1], marker="*", s=260, color="k", label=highlight[1])
    ax.legend(fontsize=6, ncol=3, loc="best")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("first principal component")
    ax.set_ylabel("second principal component")
    ax.set_xticks([])
    ax.set_yticks([])
    fig.tight_layout()
    return fig
