"""Checks for notebook 14's exercises: mean pooling over a mask, the top-k of cosine similarity, and recall@k.

* ``my_mean_pool(hidden [B, T, D], mask [B, T])``: the mean of each row's hidden states over its real tokens
  (mask 1), an all-padding row giving zeros. Reference: :func:`jaxlab.engine.encoder.mean_pool`.
* ``my_top_k(queries [Q, D], docs [N, D], k)``: for unit vectors, the indices of the k documents most similar to
  each query, best first. Reference: :func:`jaxlab.retrieval.index.top_k` of ``queries @ docs.T``.
* ``my_recall_at_k(ranked_paths, gold, k)``: the share of questions whose gold object is among the first k paths.
"""

from __future__ import annotations

import numpy as np

from jaxlab.lab.exercises import check_function


def reference_mean_pool(hidden, mask):
    from jaxlab.engine.encoder import mean_pool

    return np.asarray(mean_pool(np.asarray(hidden, np.float32), np.asarray(mask)))


def _pool_inputs(rng):
    b, t, d = int(rng.integers(1, 4)), int(rng.integers(1, 7)), int(rng.integers(1, 5))
    mask = (rng.random((b, t)) < 0.7).astype(np.int32)
    mask[0] = 0 if rng.random() < 0.3 else mask[0]  # sometimes a row of padding only
    return rng.normal(size=(b, t, d)).astype(np.float32), mask


def check_mean_pool(fn, trials: int = 20) -> bool:
    return check_function(
        lambda h, m: np.asarray(fn(h, m), np.float32), reference_mean_pool, _pool_inputs, name="mean pooling",
        trials=trials, atol=1e-5,
    )  # fmt: skip


def reference_top_k(queries, docs, k):
    from jaxlab.retrieval.index import top_k

    return top_k(np.asarray(queries) @ np.asarray(docs).T, k)[0]


def _top_k_inputs(rng):
    d = int(rng.integers(2, 6))
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    docs = unit(rng.normal(size=(int(rng.integers(3, 12)), d)))
    queries = unit(rng.normal(size=(int(rng.integers(1, 4)), d)))
    return queries, docs, int(rng.integers(1, len(docs) + 1))


def check_top_k(fn, trials: int = 20) -> bool:
    return check_function(
        lambda q, d, k: np.asarray(fn(q, d, k), np.int64), lambda q, d, k: np.asarray(reference_top_k(q, d, k), np.int64),
        _top_k_inputs, name="cosine top-k", trials=trials,
    )  # fmt: skip


def reference_recall(ranked_paths, gold, k):
    return sum(g in paths[:k] for paths, g in zip(ranked_paths, gold)) / len(gold)


def _recall_inputs(rng):
    names = ["a", "b", "c", "d", "e"]
    q = int(rng.integers(1, 6))
    ranked = [list(rng.choice(names, size=int(rng.integers(1, 6)), replace=False)) for _ in range(q)]
    return ranked, list(rng.choice(names, size=q)), int(rng.integers(1, 4))


def check_recall_at_k(fn, trials: int = 20) -> bool:
    return check_function(
        lambda r, g, k: float(fn(r, g, k)), reference_recall, _recall_inputs, name="recall@k", trials=trials
    )
