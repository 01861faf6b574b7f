"""Checks for notebook 10's exercises: prompt-lookup drafting, counting accepted drafts, and the
residual distribution of the speculative-sampling rejection rule.

* ``my_ngram_propose(context, k)``: the k tokens that followed the most recent earlier occurrence of the
  context's last n-gram (n = 3, then 2, then 1), padded by repeating the last one when fewer than k
  follow; ``[]`` (or None) when no n-gram recurs. Reference: :func:`jaxlab.engine.speculative.ngram_propose`.
* ``my_accepted_count(drafts [B, k], target [B, k+1])``: how many leading drafts equal the target's
  tokens, per row. Reference: :func:`jaxlab.engine.speculative.greedy_accept`'s count.
* ``my_residual(p [B, V], q [B, V])``: ``max(0, p - q)`` normalized to sum to 1 per row.
"""

from __future__ import annotations

import numpy as np

from jaxlab.lab.exercises import check_function


def _as_ids(x) -> np.ndarray:
    return np.zeros(0, np.int64) if x is None else np.asarray(x, np.int64).reshape(-1)


def reference_ngram(context, k):
    from jaxlab.engine.speculative import ngram_propose

    return _as_ids(ngram_propose(context, k, max_ngram=3, min_ngram=1))


def _ngram_inputs(rng):
    vocab = int(rng.choice([3, 5, 8, 40]))  # a big vocabulary often has no recurring n-gram
    context = [int(t) for t in rng.integers(0, vocab, size=int(rng.integers(2, 25)))]
    return context, int(rng.integers(1, 6))


def check_ngram(fn, trials: int = 20) -> bool:
    return check_function(
        lambda ctx, k: _as_ids(fn(list(ctx), k)),
        reference_ngram,
        _ngram_inputs,
        name="n-gram (prompt lookup) drafter",
        trials=trials,
    )


def reference_accepted_count(drafts, target):
    drafts, target = np.asarray(drafts), np.asarray(target)
    same = drafts == target[:, : drafts.shape[1]]
    return np.cumprod(same, axis=1).sum(axis=1)


def _count_inputs(rng):
    b, k = 6, int(rng.integers(1, 6))
    target = rng.integers(0, 4, size=(b, k + 1))
    drafts = np.where(rng.random((b, k)) < 0.8, target[:, :k], rng.integers(0, 4, size=(b, k)))
    return drafts.astype(np.int32), target.astype(np.int32)


def check_accepted_count(fn, trials: int = 10) -> bool:
    return check_function(
        lambda d, t: np.asarray(fn(d, t)).astype(np.int64),
        lambda d, t: reference_accepted_count(d, t).astype(np.int64),
        _count_inputs,
        name="accepted-draft count",
        trials=trials,
    )


def reference_residual(p, q):
    r = np.maximum(np.asarray(p, np.float64) - np.asarray(q, np.float64), 0.0)
    return r / r.sum(axis=-1, keepdims=True)


def _residual_inputs(rng):
    v = int(rng.integers(3, 9))
    p = rng.dirichlet(np.ones(v), size=4).astype(np.float32)
    q = rng.dirichlet(np.ones(v), size=4).astype(np.float32)
    return p, q


def check_residual(fn, trials: int = 8) -> bool:
    return check_function(
        fn, reference_residual, _residual_inputs, name="residual distribution", trials=trials, atol=1e-5, rtol=1e-4
    )
