"""The corpus: docstrings of the public API of the installed jax and flax (Apache-2.0) and numpy.linalg
(BSD-3-Clause), already on every machine that runs the lab, so retrieval works offline and the corpus is the
documentation of the very versions jaxlab pins.

Each documented object (function, class, ...) is one document: its dotted path, then its docstring (at most
:data:`DOC_TOKENS` tokens: the summary, arguments and first examples). Documents are cut into chunks of
:data:`CHUNK_TOKENS` encoder tokens overlapping by :data:`OVERLAP_TOKENS`, each chunk starting with the object's
path (and, after the first, its summary line) so that it says what it documents. Order and content depend only on the installed versions: the corpus hash
(:func:`corpus_hash`) keys the cached index.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
from dataclasses import dataclass

from jaxlab.errors import InvalidRequestError

#: Modules whose public API is documented in the corpus (jax.numpy and numpy's top level are left out: their
#: docstrings are numpy's, over 350k tokens, and would crowd out the rest).
SOURCES = (
    "jax",
    "jax.lax",
    "jax.random",
    "jax.nn",
    "jax.tree",
    "jax.tree_util",
    "jax.sharding",
    "jax.export",
    "flax.nnx",
    "numpy.linalg",
)
DOC_TOKENS = 600
CHUNK_TOKENS = 160
OVERLAP_TOKENS = 32
MAX_TOKENS = 250_000
MIN_DOC_CHARS = 80
SUMMARY_CHARS = 120


@dataclass(frozen=True)
class Chunk:
    id: int
    path: str  # the documented object, e.g. "jax.lax.scan"
    text: str  # "jax.lax.scan: " + a window of its docstring

    def as_json(self) -> dict:
        return {"id": self.id, "path": self.path, "text": self.text}


def collect_docs(sources=None) -> list[tuple[str, str]]:
    """(path, docstring) of every public object of ``sources`` with a docstring of at least
    :data:`MIN_DOC_CHARS` characters; an object reachable from two modules is kept once (first path)."""
    seen, docs = set(), []
    for name in sources or SOURCES:
        module = importlib.import_module(name)
        names = getattr(module, "__all__", None) or [n for n in dir(module) if not n.startswith("_")]
        for attr in sorted(names):
            obj = getattr(module, attr, None)
            if obj is None or inspect.ismodule(obj) or id(obj) in seen:
                continue
            if not (inspect.isclass(obj) or callable(obj)):
                continue  # constants: their docstring is their type's (str, int, ...)
            doc = inspect.getdoc(obj)
            if not inspect.isclass(obj) and doc == inspect.getdoc(type(obj)):
                continue  # an instance documented only by its class (a TypeVar, a partial, ...)
            if not doc or len(doc) < MIN_DOC_CHARS:
                continue
            seen.add(id(obj))
            docs.append((f"{name}.{attr}", doc))
    return docs


def encoder_tokenizer():
    """The encoder's WordPiece tokenizer without truncation or padding (for counting and cutting)."""
    from tokenizers import Tokenizer

    from jaxlab.io import assets

    tok = Tokenizer.from_file(str(assets.encoder_dir() / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    return tok


def chunk_docs(
    docs: list[tuple[str, str]], tokenizer, size: int = CHUNK_TOKENS, overlap: int = OVERLAP_TOKENS
) -> list[Chunk]:
    """Cut each document into windows of ``size`` tokens overlapping by ``overlap`` (at token boundaries, mapped
    back to the text), after its first :data:`DOC_TOKENS` tokens."""
    if not 0 <= overlap < size:
        raise InvalidRequestError(f"overlap must be in [0, size), got size {size}, overlap {overlap}")
    if not docs:
        raise InvalidRequestError("the corpus is empty: no document to index")
    chunks: list[Chunk] = []
    encodings = tokenizer.encode_batch([d for _, d in docs], add_special_tokens=False)
    for (path, doc), enc in zip(docs, encodings):
        offsets = enc.offsets[:DOC_TOKENS]
        n = len(offsets)
        summary = doc.split("\n\n", 1)[0].replace("\n", " ")[:SUMMARY_CHARS]
        start = 0
        while True:
            end = min(start + size, n)
            text = doc[offsets[start][0] : offsets[end - 1][1]] if n else doc
            # every chunk after the first carries its object's summary line too: a window of arguments or
            # examples still says what it documents
            head = f"{path}: " if start == 0 else f"{path} ({summary}): "
            chunks.append(Chunk(len(chunks), path, head + text))
            if end >= n:
                break
            start = end - overlap
    return chunks


def build_corpus(sources=None) -> tuple[list[Chunk], dict]:
    """The chunks and a summary: documents, chunks, tokens, the versions the docstrings come from, the hash."""
    from importlib import metadata

    sources = tuple(sources or SOURCES)
    docs = collect_docs(sources)
    tok = encoder_tokenizer()
    chunks = chunk_docs(docs, tok)
    tokens = sum(len(e.ids) for e in tok.encode_batch([c.text for c in chunks], add_special_tokens=False))
    if tokens > MAX_TOKENS:
        raise InvalidRequestError(f"the corpus has {tokens} tokens, over its budget of {MAX_TOKENS}: drop a source")
    versions = {p: metadata.version(p) for p in ("jax", "flax", "numpy")}
    info = {"sources": list(sources), "documents": len(docs), "chunks": len(chunks), "tokens": tokens,
            "versions": versions, "chunk_tokens": CHUNK_TOKENS, "overlap_tokens": OVERLAP_TOKENS,
            "doc_tokens": DOC_TOKENS}  # fmt: skip
    info["hash"] = corpus_hash(chunks)
    return chunks, info


def corpus_hash(chunks: list[Chunk]) -> str:
    h = hashlib.sha256()
    for c in chunks:
        h.update(json.dumps([c.path, c.text], ensure_ascii=False).encode())
    return h.hexdigest()[:16]
