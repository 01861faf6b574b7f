"""Retrieval-augmented answers: retrieve the k passages closest to a question, give them to SmolLM2 numbered
[1]..[k] through its chat template, and ask for an answer that cites them. :func:`answer_rate` measures, on the
question set, how often an answer names the gold fact, with and without the passages."""

from __future__ import annotations

from dataclasses import dataclass

from jaxlab.errors import InvalidRequestError
from jaxlab.io.tokenizer import prompt_ids

SYSTEM = (
    "You answer questions about JAX, Flax and NumPy. Use the numbered passages. Name the function or class that "
    "answers the question, and cite the passages you used like [1]."
)
PASSAGE_CHARS = 700  # of each passage in the prompt (the encoder saw ~160 of its tokens)


@dataclass
class Answer:
    question: str
    text: str
    sources: list  # the retrieved chunks, in citation order [1], [2], ...


def check_question(question) -> str:
    if not isinstance(question, str) or not question.strip():
        raise InvalidRequestError("the question is empty: ask something, e.g. jaxlab ask 'How do I split a PRNG key?'")
    return question.strip()


def messages_for(question: str, passages=()) -> list[dict]:
    """The chat: the system prompt, then the passages (numbered) and the question; no passages: the question alone."""
    if not passages:
        return [{"role": "system", "content": SYSTEM.split(" Use the")[0] + " Name the function or class."},
                {"role": "user", "content": question}]  # fmt: skip
    body = "\n\n".join(f"[{i + 1}] {c.text[:PASSAGE_CHARS]}" for i, c in enumerate(passages))
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"{body}\n\nQuestion: {question}"}]


def docs_index(progress: bool = False, log=None):
    """The dense index over the docs corpus (:mod:`jaxlab.retrieval.corpus`) with the embedded encoder: built the
    first time, then read from the cache folder. ``log(line)`` is told how long a first build took."""
    from jaxlab.engine.encoder import load_embedder
    from jaxlab.retrieval import corpus
    from jaxlab.retrieval.index import load_or_build

    chunks, info = corpus.build_corpus()
    index, how = load_or_build(load_embedder(), chunks, info["hash"], progress=progress)
    if not how["cached"] and log is not None:
        log(f"indexed {info['chunks']} chunks of the docs in {how['seconds']:.0f} s (cached)")
    return index


def answer(
    question: str,
    k: int = 3,
    retrieval: bool = True,
    max_new_tokens: int = 128,
    on_text=None,
    progress: bool = False,
    log=None,
) -> Answer:
    """``jaxlab ask``: one question answered by the embedded model, with the ``k`` passages of :func:`docs_index`
    (``retrieval`` False: the model alone). Everything is checked before anything loads; ``on_text(piece)``
    streams the answer, ``log(line)`` hears about a first index build."""
    from jaxlab.engine.continuous import Engine
    from jaxlab.engine.loading import load

    question = check_question(question)
    if k < 1:
        raise InvalidRequestError(f"-k must be >= 1 passages, got {k}")
    index = docs_index(progress=progress, log=log) if retrieval else None
    m = load()
    engine = Engine(m.params, m.tokenizer, slots=1, context=min(2048, m.config.max_seq_len))
    return ask(engine, m.tokenizer, index, question, k=k, max_new_tokens=max_new_tokens, on_text=on_text)


def retrieve(index, questions: list[str], k: int) -> list[list]:
    ids, _ = index.search(questions, k)
    return [[index.chunks[int(i)] for i in row] for row in ids]


def ask(engine, tokenizer, index, question: str, k: int = 3, max_new_tokens: int = 96, on_text=None) -> Answer:
    """One question through retrieval (``index`` None: none) and the model, greedy; ``on_text(piece)`` streams."""
    question = check_question(question)
    if k < 1:
        raise InvalidRequestError(f"k must be >= 1 passages, got {k}")
    sources = retrieve(index, [question], k)[0] if index is not None else []
    ids = prompt_ids(tokenizer, messages=messages_for(question, sources))
    stream = engine.add_request(ids, max_new_tokens=max_new_tokens)
    for piece in stream:
        if on_text is not None:
            on_text(piece)
    return Answer(question, stream.text, sources)


def contains_fact(text: str, facts: list[str]) -> bool:
    low = text.lower()
    return any(f.lower() in low for f in facts)


def answer_rate(engine, tokenizer, index, questions: list[dict], k: int = 3, max_new_tokens: int = 64) -> dict:
    """Every question answered greedily (all at once through the engine), with ``index`` (None: without
    retrieval); the share whose answer contains one of its facts."""
    qs = [q["question"] for q in questions]
    sources = retrieve(index, qs, k) if index is not None else [[] for _ in qs]
    prompts = [prompt_ids(tokenizer, messages=messages_for(q, s)) for q, s in zip(qs, sources)]
    results = engine.generate(prompts, max_new_tokens=max_new_tokens)
    hits = [contains_fact(r.text, q["facts"]) for r, q in zip(results, questions)]
    return {
        "questions": len(questions),
        "answer_contains_fact": sum(hits) / len(hits),
        "gold_in_passages": None
        if index is None
        else sum(any(c.path == q["gold"] for c in s) for s, q in zip(sources, questions)) / len(questions),
        "answers": [{"id": q["id"], "text": r.text, "hit": h} for q, r, h in zip(questions, results, hits)],
    }
