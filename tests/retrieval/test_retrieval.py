"""Retrieval: the docs corpus (deterministic, within its token budget, every gold object in it), chunking, the
exact top-k, the metrics on a hand-made ranker, the dense index and BM25 on a slice of the corpus, the index cache,
and ``jaxlab ask`` end to end with its errors."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest

from jaxlab.errors import InvalidRequestError
from jaxlab.retrieval import ask, corpus, evaluate, index

SLICE = ("jax.random",)  # a small corpus for the model-running tests


@pytest.fixture(scope="module")
def full():
    return corpus.build_corpus()


@pytest.fixture(scope="module")
def emb():
    from jaxlab.engine.encoder import load_embedder

    return load_embedder()


def test_the_corpus_is_deterministic_within_budget_and_holds_every_gold_object(full):
    chunks, info = full
    assert info["tokens"] <= corpus.MAX_TOKENS and info["chunks"] == len(chunks) > 1000
    assert corpus.build_corpus()[1]["hash"] == info["hash"]
    paths = {c.path for c in chunks}
    questions = evaluate.load_questions()
    assert len(questions) >= 40 and len({q["question"] for q in questions}) == len(questions)
    missing = [q["gold"] for q in questions if q["gold"] not in paths]
    assert not missing, f"gold objects not in the corpus (rename them or add a source): {missing}"
    assert all(q["facts"] and all(f.strip() for f in q["facts"]) for q in questions)
    for q in questions:  # a paraphrase, not a copy of its gold passage's first line
        first = next(c.text for c in chunks if c.path == q["gold"]).split(": ", 1)[1].splitlines()[0]
        assert first.lower() not in q["question"].lower()


def test_chunks_overlap_and_start_with_their_object():
    tok = corpus.encoder_tokenizer()
    doc = " ".join(f"word{i}" for i in range(300))
    chunks = corpus.chunk_docs([("pkg.f", doc), ("pkg.g", "short doc")], tok, size=40, overlap=8)
    f = [c for c in chunks if c.path == "pkg.f"]
    assert len(f) > 3 and f[0].text.startswith("pkg.f: word0 ")
    assert all(c.text.startswith("pkg.f (word0 word1 ") for c in f[1:])  # later windows carry the summary line
    assert [c.id for c in chunks] == list(range(len(chunks)))
    tail_of_first = f[0].text.split()[-2:]
    assert all(w in f[1].text for w in tail_of_first)  # the windows overlap
    assert chunks[-1].text == "pkg.g: short doc"
    with pytest.raises(InvalidRequestError, match="corpus is empty"):
        corpus.chunk_docs([], tok)
    with pytest.raises(InvalidRequestError, match="overlap"):
        corpus.chunk_docs([("a", "b")], tok, size=8, overlap=8)


def test_top_k_and_the_metrics():
    ids, scores = index.top_k(np.array([[0.1, 0.9, 0.5, 0.7], [3.0, 2.0, 1.0, 0.0]]), 3)
    assert ids.tolist() == [[1, 3, 2], [0, 1, 2]] and scores[0].tolist() == [0.9, 0.7, 0.5]

    class Fixed:
        def search(self, queries, k):
            return np.array([[0, 1], [1, 0], [1, 1]]), None

    chunks = [corpus.Chunk(0, "a", "a: x"), corpus.Chunk(1, "b", "b: y")]
    qs = [{"question": "q", "gold": g} for g in ("a", "a", "c")]
    s = evaluate.score(Fixed(), chunks, qs, k=2)
    assert s["ranks"] == [1, 2, None] and s["recall@1"] == pytest.approx(1 / 3)
    assert s["recall@5"] == pytest.approx(2 / 3) and s["mrr@2"] == pytest.approx((1 + 0.5) / 3)


@pytest.fixture(scope="module")
def slice_cache(tmp_path_factory):
    """A cache folder shared by the slice's tests: the slice is embedded once."""
    return tmp_path_factory.mktemp("retrieval-cache")


def test_dense_and_bm25_find_the_gold_on_a_slice(emb, slice_cache, monkeypatch):
    monkeypatch.setenv("JAXLAB_CACHE", str(slice_cache))
    chunks, info = corpus.build_corpus(SLICE)
    dense, how = index.load_or_build(emb, chunks, info["hash"], progress=False)
    assert dense.vectors.shape == (len(chunks), 384)
    qs = [q for q in evaluate.load_questions() if q["gold"].startswith("jax.random.")]
    for ranker in (dense, index.BM25Index(chunks)):
        s = evaluate.score(ranker, chunks, qs)
        assert s["recall@5"] >= 0.5, (type(ranker).__name__, s["ranks"])


def test_the_index_is_cached_by_corpus_and_rebuilt_when_damaged(emb, tmp_path, monkeypatch):
    monkeypatch.setenv("JAXLAB_CACHE", str(tmp_path))
    chunks = corpus.build_corpus(SLICE)[0][:12]
    h = corpus.corpus_hash(chunks)
    first, how = index.load_or_build(emb, chunks, h, progress=False)
    assert not how["cached"]
    again, how = index.load_or_build(emb, chunks, h, progress=False)
    assert how["cached"] and np.array_equal(again.vectors, first.vectors)
    index.cache_path(h, emb.name).write_bytes(b"damaged")
    rebuilt, how = index.load_or_build(emb, chunks, h, progress=False)
    assert not how["cached"] and np.allclose(rebuilt.vectors, first.vectors, atol=1e-6)
    other = corpus.corpus_hash(chunks[:6])
    assert index.cache_path(other, emb.name) != index.cache_path(h, emb.name)


def test_prompt_and_answer_checks():
    with pytest.raises(InvalidRequestError, match="question is empty"):
        ask.check_question("   ")
    chunks = [corpus.Chunk(0, "jax.random.split", "jax.random.split: Splits a key."), corpus.Chunk(1, "x", "x: y")]
    msgs = ask.messages_for("How do I split?", chunks)
    assert msgs[0]["role"] == "system" and "[1] jax.random.split: Splits a key." in msgs[1]["content"]
    assert "[2] x: y" in msgs[1]["content"] and msgs[1]["content"].endswith("Question: How do I split?")
    assert len(ask.messages_for("q")) == 2 and "[1]" not in ask.messages_for("q")[1]["content"]
    assert ask.contains_fact("Use jax.random.SPLIT here", ["split"]) and not ask.contains_fact("no", ["split"])


def test_jaxlab_ask_end_to_end(slice_cache, monkeypatch, load_once):
    from jaxlab.cli import main

    monkeypatch.setenv("JAXLAB_CACHE", str(slice_cache))  # the slice's index, embedded by the test above
    monkeypatch.setattr(corpus, "SOURCES", SLICE)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["ask", "How do I make several new random keys from one key?", "-k", "2", "--max-new-tokens", "8"])
    text = out.getvalue()
    assert code == 0, err.getvalue()
    assert "Sources:\n  [1] jax.random." in text and "  [2] jax.random." in text
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert main(["ask", ""]) == 1
    assert "question is empty" in err.getvalue()
