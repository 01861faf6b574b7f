"""``jaxlab bench --retrieval``: the corpus built, the dense index built (or loaded from the cache), dense retrieval
against BM25 on the hand-written question set (recall@1, recall@5, MRR@10, time per query), and retrieval-augmented
answers against the model alone (the share of answers that name the gold fact) — one run, one host."""

from __future__ import annotations

import os
import time


def measure_retrieval(quick: bool, rag: bool, log) -> dict:
    from jaxlab.engine.encoder import load_embedder
    from jaxlab.retrieval import corpus, evaluate, index

    t0 = time.perf_counter()
    chunks, info = corpus.build_corpus()
    info["build_seconds"] = time.perf_counter() - t0
    log(f"corpus: {info['documents']} documents, {info['chunks']} chunks, {info['tokens']} tokens "
        f"({info['build_seconds']:.1f} s)")  # fmt: skip
    emb = load_embedder()
    dense, how = index.load_or_build(emb, chunks, info["hash"], progress=True)
    log(f"dense index: {'loaded from the cache' if how['cached'] else 'built'} in {how['seconds']:.1f} s")
    t0 = time.perf_counter()
    bm25 = index.BM25Index(chunks)
    bm25_s = time.perf_counter() - t0
    questions = evaluate.load_questions()
    if quick:
        questions = questions[:8]
    res = {
        "corpus": info,
        "dense_index": how,
        "bm25_index_seconds": bm25_s,
        "dense": evaluate.score(dense, chunks, questions),
        "bm25": evaluate.score(bm25, chunks, questions),
    }
    if rag:
        from jaxlab.engine.continuous import Engine
        from jaxlab.engine.loading import load
        from jaxlab.retrieval.ask import answer_rate

        m = load()
        engine = Engine(m.params, m.tokenizer, slots=8, context=1024)
        log(f"answers to {len(questions)} questions, without retrieval then with 3 passages")
        res["rag"] = {
            "without": answer_rate(engine, m.tokenizer, None, questions, max_new_tokens=24 if quick else 64),
            "with": answer_rate(engine, m.tokenizer, dense, questions, k=3, max_new_tokens=24 if quick else 64),
        }
    return res


def retrieval_targets(res: dict) -> list[dict]:
    d, b = res["dense"]["recall@5"], res["bm25"]["recall@5"]
    return [{"target": "dense recall@5 >= BM25's", "measured": d - b, "status": "PASS" if d >= b else "MISS"}]


def render_retrieval(res: dict) -> str:
    c = res["corpus"]
    lines = [
        f"corpus: {c['documents']} documented objects of {', '.join(c['sources'])} (jax {c['versions']['jax']}, "
        f"flax {c['versions']['flax']}, numpy {c['versions']['numpy']}): {c['chunks']} chunks of {c['chunk_tokens']} "
        f"tokens (overlap {c['overlap_tokens']}), {c['tokens']} tokens; built in {c['build_seconds']:.1f} s",
        f"dense index: {'loaded from the cache' if res['dense_index']['cached'] else 'embedded'} in "
        f"{res['dense_index']['seconds']:.1f} s; BM25 index {res['bm25_index_seconds']:.2f} s",
        "",
        f"{'ranker':8s} {'recall@1':>9s} {'recall@5':>9s} {'MRR@10':>7s} {'ms/query':>9s}   ({res['dense']['questions']} questions)",
    ]
    for name in ("dense", "bm25"):
        s = res[name]
        lines.append(
            f"{name:8s} {s['recall@1']:9.2f} {s['recall@5']:9.2f} {s['mrr@10']:7.3f} {s['seconds_per_query'] * 1000:9.1f}"
        )
    if res.get("rag"):
        w, wo = res["rag"]["with"], res["rag"]["without"]
        lines += [
            "",
            "answers that name the gold fact (SmolLM2-135M, greedy):",
            f"  without retrieval {wo['answer_contains_fact']:.2f}; with 3 retrieved passages "
            f"{w['answer_contains_fact']:.2f} (the gold object was among the passages for {w['gold_in_passages']:.2f})",
        ]
    return "\n".join(lines) + "\n"


def run_retrieval(args, out) -> int:
    from jaxlab.bench.harness import Progress
    from jaxlab.bench.output import finish, host_meta

    log = Progress()
    quick = bool(getattr(args, "quick", False))
    res = measure_retrieval(quick, not getattr(args, "no_rag", False), log)
    res["targets"] = retrieval_targets(res)
    res["meta"] = host_meta(quick=quick, elapsed_s=log.elapsed())
    text = f"jaxlab bench --retrieval  |  {res['meta']['cpu']}  |  {os.cpu_count()} CPUs\n\n" + render_retrieval(res)
    return finish(res, text, args, out)
