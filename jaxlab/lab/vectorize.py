"""Notebook 06's helpers for looking at a vmapped program and drawing its results.

* :func:`count_primitives` counts the operations of a traced program (``jax.make_jaxpr``), nested calls
  included: ``vmap`` of a one-sequence step has the same matmuls as the step itself, each with a batch axis
  more, and no loop over the rows.
* :func:`plot_throughput` draws decode tokens/s against batch size with the roofline bound
  (:func:`jaxlab.lab.stages.throughput_vs_batch` rows after :func:`~jaxlab.lab.stages.add_roofline`);
  :func:`plot_distributions` draws what each sampler leaves of a distribution.
"""

from __future__ import annotations

from collections import Counter
from typing import Mapping

import numpy as np


def _subjaxprs(eqn):
    for v in eqn.params.values():
        for x in v if isinstance(v, (list, tuple)) else (v,):
            inner = getattr(x, "jaxpr", None)
            if inner is not None:  # a ClosedJaxpr (.jaxpr) or a Jaxpr (.eqns)
                yield inner if hasattr(inner, "eqns") else inner.jaxpr
            elif hasattr(x, "eqns"):
                yield x


def count_primitives(closed_jaxpr) -> Counter:
    """{primitive name: how many times it occurs} in a jaxpr and every jaxpr nested in it (jit, scan, cond)."""
    counts: Counter = Counter()
    stack = [getattr(closed_jaxpr, "jaxpr", closed_jaxpr)]
    while stack:
        jaxpr = stack.pop()
        for eqn in jaxpr.eqns:
            counts[eqn.primitive.name] += 1
            stack.extend(_subjaxprs(eqn))
    return counts


def plot_throughput(rows: list[dict]):
    """Tokens/s against batch size (log-log): measured, the roofline bound, and perfect scaling from batch 1."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    bs = [r["batch"] for r in rows]
    ax.plot(bs, [r["tokens/s"] for r in rows], "o-", label="measured")
    if "bound tokens/s" in rows[0]:
        ax.plot(bs, [r["bound tokens/s"] for r in rows], "k--", label="roofline bound")
    ax.plot(bs, [rows[0]["tokens/s"] * b / bs[0] for b in bs], ":", color="gray", label="perfect scaling from batch 1")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set(xlabel="batch size", ylabel="tokens / s", title="Decode throughput against batch size")
    ax.legend()
    fig.tight_layout()
    return fig


def plot_distributions(dists: Mapping[str, np.ndarray]):
    """One small bar chart per sampler: the probability of each token after its filters."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(dists), figsize=(12, 2.6), sharey=True, squeeze=False)
    for i, (ax, (name, d)) in enumerate(zip(axes[0], dists.items())):
        d = np.asarray(d)
        ax.bar(range(len(d)), d, color=["#2b5d8a" if p > 0 else "#cccccc" for p in d])
        ax.set_title(name, fontsize=9)
        ax.set_xticks(range(len(d)))
        ax.set_xlabel("token")
        if i == 0:
            ax.set_ylabel("probability")
    fig.suptitle("What each sampler leaves of the same six logits", fontsize=10)
    fig.tight_layout()
    return fig
