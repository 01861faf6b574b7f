"""The question set (``data/retrieval/questions.json``) and what a ranker scores on it: recall@1, recall@5 and MRR
(mean reciprocal rank of the first chunk that documents the gold object, within the top 10)."""

from __future__ import annotations

import json
import time

import numpy as np

from jaxlab.io.assets import data_file

K_MAX = 10


def load_questions(path=None) -> list[dict]:
    data = json.loads((path or data_file("retrieval", "questions.json")).read_text(encoding="utf-8"))
    return data["questions"]


def first_hit(paths: list[str], gold: str) -> int | None:
    """1-based rank of the first retrieved chunk documenting ``gold``, or None."""
    return next((r + 1 for r, p in enumerate(paths) if p == gold), None)


def score(ranker, chunks, questions: list[dict], k: int = K_MAX) -> dict:
    """Run every question through ``ranker.search``; recall@1, recall@5, MRR@k, seconds per query, and each
    question's rank (None: not in the top k)."""
    t0 = time.perf_counter()
    ids, _ = ranker.search([q["question"] for q in questions], k)
    seconds = (time.perf_counter() - t0) / max(1, len(questions))
    ranks = [first_hit([chunks[int(i)].path for i in row], q["gold"]) for row, q in zip(ids, questions)]
    n = len(questions)
    return {
        "questions": n,
        "recall@1": sum(1 for r in ranks if r == 1) / n,
        "recall@5": sum(1 for r in ranks if r is not None and r <= 5) / n,
        f"mrr@{k}": float(np.mean([1.0 / r if r else 0.0 for r in ranks])),
        "seconds_per_query": seconds,
        "ranks": ranks,
    }
