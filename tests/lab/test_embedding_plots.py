"""Notebook 14's exercise checkers (PASS on the solutions, FAIL on wrong answers) and its helpers: the stored
bench runs it reads, and the PCA of the embedding map."""

from __future__ import annotations

import numpy as np
from conftest import load_solution, not_implemented

from jaxlab.lab import embedding_plots
from jaxlab.lab.exercises import nb14


def test_nb14_checkers_pass_solutions_and_fail_wrong_answers(capsys):
    sol = load_solution("14_encoder_and_retrieval")
    assert nb14.check_mean_pool(sol.my_mean_pool)
    assert nb14.check_top_k(sol.my_top_k)
    assert nb14.check_recall_at_k(sol.my_recall_at_k)
    assert not nb14.check_mean_pool(lambda h, m: np.asarray(h).mean(1))  # padding counted
    assert not nb14.check_mean_pool(
        lambda h, m: (np.asarray(h) * np.asarray(m)[..., None]).sum(1) / np.asarray(h).shape[1]
    )
    assert not nb14.check_top_k(
        lambda q, d, k: np.argsort(np.asarray(q) @ np.asarray(d).T, axis=1)[:, :k]
    )  # worst first
    assert not nb14.check_recall_at_k(lambda r, g, k: sum(x in p[: k + 1] for p, x in zip(r, g)) / len(g))
    assert not nb14.check_recall_at_k(not_implemented)
    out = capsys.readouterr().out
    assert "FAIL: recall@k: not implemented yet" in out and "PASS: cosine top-k" in out


def test_stored_runs_are_labelled_with_host_and_date():
    for name, keys in (("encoder-cpu", ("rows",)), ("retrieval-cpu", ("dense", "bm25", "rag"))):
        data = embedding_plots.stored(name)
        assert all(k in data for k in keys) and data["label"].startswith("stored run: ")
        assert "?" not in data["label"] and "UTC" in data["label"], data["label"]


def test_pca_finds_the_main_directions():
    rng = np.random.default_rng(0)
    x = np.zeros((200, 6))
    x[:, 2] = rng.normal(size=200) * 10
    x[:, 4] = rng.normal(size=200) * 3
    x += rng.normal(size=x.shape) * 0.01
    xy = embedding_plots.pca_2d(x)
    assert xy.shape == (200, 2)
    assert abs(np.corrcoef(xy[:, 0], x[:, 2])[0, 1]) > 0.99 and abs(np.corrcoef(xy[:, 1], x[:, 4])[0, 1]) > 0.99
