"""Two rankers over the corpus's chunks, behind one call, ``search(queries, k) -> (ids [Q, k], scores [Q, k])``:

* :class:`DenseIndex` — exact nearest neighbours: the chunks' unit embeddings in one float32 matrix, a query's
  scores are one matmul (cosine similarity), the top k by ``argpartition``. 2,000 chunks x 384 floats is 3 MB and
  a query costs well under a millisecond, so an approximate index would not earn its place here (said in the README).
  Built once per (corpus, encoder) and cached in the cache folder (:func:`load_or_build`).
* :class:`BM25Index` — the lexical baseline: Okapi BM25 from ``bm25s`` (lower-cased words, English stop words).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from jaxlab.retrieval.corpus import Chunk


class DenseIndex:
    def __init__(self, embedder, chunks: list[Chunk], vectors: np.ndarray):
        if len(chunks) != len(vectors):
            raise ValueError(f"{len(chunks)} chunks but {len(vectors)} vectors")
        self.embedder, self.chunks, self.vectors = embedder, chunks, np.asarray(vectors, np.float32)

    @classmethod
    def build(cls, embedder, chunks: list[Chunk], progress: bool = True, batch: int = 256) -> "DenseIndex":
        """Embed every chunk (a progress bar on stderr when ``progress``)."""
        from tqdm.auto import tqdm

        texts = [c.text for c in chunks]
        parts = []
        with tqdm(total=len(texts), unit="chunk", desc="embedding the corpus", disable=not progress) as bar:
            for i in range(0, len(texts), batch):
                parts.append(embedder.embed(texts[i : i + batch]))
                bar.update(len(parts[-1]))
        return cls(embedder, chunks, np.concatenate(parts) if parts else np.zeros((0, embedder.dim), np.float32))

    def search(self, queries: list[str], k: int = 5) -> tuple[np.ndarray, np.ndarray]:
        q = self.embedder.embed(queries)
        return top_k(q @ self.vectors.T, k)


def top_k(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best columns of each row, best first: (ids [Q, k], scores [Q, k])."""
    k = min(k, scores.shape[1])
    part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    order = np.argsort(-np.take_along_axis(scores, part, 1), axis=1, kind="stable")
    ids = np.take_along_axis(part, order, 1)
    return ids, np.take_along_axis(scores, ids, 1)


class BM25Index:
    def __init__(self, chunks: list[Chunk]):
        import bm25s

        self.chunks = chunks
        self.retriever = bm25s.BM25()
        self.retriever.index(bm25s.tokenize([c.text for c in chunks], stopwords="en", show_progress=False),
                             show_progress=False)  # fmt: skip

    def search(self, queries: list[str], k: int = 5) -> tuple[np.ndarray, np.ndarray]:
        import bm25s

        tokens = bm25s.tokenize(queries, stopwords="en", show_progress=False)
        ids, scores = self.retriever.retrieve(tokens, k=min(k, len(self.chunks)), show_progress=False)
        return np.asarray(ids), np.asarray(scores)


def cache_path(corpus_hash: str, encoder_name: str) -> Path:
    from jaxlab.io import assets

    sha = assets.ENCODERS[encoder_name]["files"]["model.safetensors"][0][:12]
    return assets.cache_dir() / "index" / f"{corpus_hash}-{encoder_name}-{sha}.npz"


def load_or_build(embedder, chunks: list[Chunk], corpus_hash: str, progress: bool = True) -> tuple[DenseIndex, dict]:
    """The dense index from the cache (keyed by the corpus hash and the encoder's weights), else built and saved;
    -> (index, {"cached": bool, "seconds": build or load time, "path": ...})."""
    path = cache_path(corpus_hash, embedder.name)
    t0 = time.perf_counter()
    if path.exists():
        try:
            with np.load(path) as f:
                vectors = f["vectors"]
                meta = json.loads(str(f["meta"]))
            if meta.get("corpus_hash") == corpus_hash and len(vectors) == len(chunks):
                return DenseIndex(embedder, chunks, vectors), {"cached": True, "seconds": time.perf_counter() - t0,
                                                               "path": str(path)}  # fmt: skip
        except (OSError, ValueError, KeyError):
            pass  # a damaged cache entry: build again
    index = DenseIndex.build(embedder, chunks, progress=progress)
    seconds = time.perf_counter() - t0
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".partial.npz")
    np.savez(tmp, vectors=index.vectors, meta=json.dumps({"corpus_hash": corpus_hash, "chunks": len(chunks)}))
    tmp.replace(path)
    return index, {"cached": False, "seconds": seconds, "path": str(path)}
