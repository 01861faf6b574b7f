"""A tiny byte-level BPE tokenizer, trained and run in pure Python, for teaching.

Byte-pair encoding (BPE) in four steps:

1. **Pre-tokenize.** A regular expression cuts the text into words with their leading space, runs of
   punctuation and runs of whitespace (GPT-2's recipe). Merges never cross these boundaries, so
   " the" is learned once instead of once per neighbour.
2. **Start from bytes.** Every word becomes its UTF-8 bytes; the 256 byte values are the first 256
   tokens, so *any* text can be encoded, in any language, with no unknown token.
3. **Train.** Count every adjacent pair of tokens in every word (weighted by how often the word
   occurs), give the most frequent pair a new id, replace it everywhere, repeat until the vocabulary
   has the size asked for. The ordered list of merges *is* the tokenizer.
4. **Encode** a new text by replaying the merges: in each word, merge the pair that was learned first
   (lowest rank), again and again, until no learned pair is left. **Decode** by concatenating the
   tokens' bytes and decoding them as UTF-8.

:func:`train` builds a :class:`BPE` from a text; :meth:`BPE.from_gguf` loads a real model's merges
(SmolLM2's 48,900) into the same ~30 lines of encoder, which then gives the same ids as the Rust
``tokenizers`` library, only much more slowly. The pre-tokenizer uses the standard library's ``re``
(no ``\\p{L}``), so on rare characters (superscript digits, some marks) its pieces can differ from
GPT-2's; on ordinary text they are the same. Special tokens (``<|im_start|>``) are not handled here.
"""

from __future__ import annotations

import os
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from jaxlab.errors import ModelFileError
from jaxlab.io.tokenizer import DIGITS_PRETOKENIZERS, GPT2_PRETOKENIZERS, bytes_to_unicode, read_gguf_metadata

# GPT-2's pre-tokenizer written with the standard library: contractions | ?letters | ?numbers |
# ?other symbols | whitespace not followed by a word (so " word" keeps its space) | whitespace.
# [^\W\d_] is "a letter": a word character that is neither a digit nor the underscore.
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+"""
# SmolLM2 (StarCoder's lineage) first cuts every digit apart, so "2024" is 2 0 2 4 and the
# whitespace before a number is a piece of its own.
DIGITS_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?[^\W\d_]+|\d| ?(?:[^\s\w]|_)+|\s+(?=\d)|\s+(?!\S)|\s+"""


def pretokenize(text: str, pattern: str = GPT2_PATTERN) -> list[str]:
    """Cut ``text`` into the pieces BPE works inside; ``"".join(pieces) == text``."""
    return re.findall(pattern, text)


def count_pairs(ids: list[int], counts: dict | None = None, weight: int = 1) -> dict[tuple[int, int], int]:
    """How often each adjacent pair occurs in ``ids`` (overlapping: [a, a, a] has (a, a) twice)."""
    counts = {} if counts is None else counts
    for pair in zip(ids, ids[1:]):
        counts[pair] = counts.get(pair, 0) + weight
    return counts


def merge(ids: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """Replace every occurrence of ``pair`` in ``ids`` by ``new_id``, left to right ([a,a,a] -> [Z,a])."""
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


@dataclass
class BPE:
    """A trained byte-level BPE: ``vocab`` (id -> bytes) and ``merges`` ((left, right) -> new id).

    ``merges`` is in rank order: the first entry was learned first and is applied first."""

    vocab: dict[int, bytes]
    merges: dict[tuple[int, int], int]
    pattern: str = GPT2_PATTERN
    counts: list[int] = field(default_factory=list)  # how often each merge's pair occurred in training

    def __post_init__(self):
        self.ranks = {pair: rank for rank, pair in enumerate(self.merges)}
        # Byte b -> its token id (0..255 for a trained BPE; anywhere in a real vocabulary).
        self.byte_ids = {v[0]: i for i, v in self.vocab.items() if len(v) == 1}

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode_word(self, word: str) -> list[int]:
        """One pre-tokenized piece -> ids: its bytes, then the learned merges, lowest rank first."""
        # A byte the vocabulary has no token for is dropped, as the reference tokenizers do.
        ids = [self.byte_ids[b] for b in word.encode("utf-8") if b in self.byte_ids]
        while len(ids) >= 2:
            pair = min(zip(ids, ids[1:]), key=lambda p: self.ranks.get(p, float("inf")))
            if pair not in self.ranks:
                break  # no learned pair left in this word
            ids = merge(ids, pair, self.merges[pair])
        return ids

    def encode(self, text: str) -> list[int]:
        """Text -> token ids."""
        return [i for word in pretokenize(text, self.pattern) for i in self.encode_word(word)]

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Several texts -> one id list each, one after the other (no threads)."""
        return [self.encode(t) for t in texts]

    def decode(self, ids) -> str:
        """Token ids -> text; bytes that do not form valid UTF-8 become U+FFFD."""
        return b"".join(self.vocab[int(i)] for i in ids).decode("utf-8", errors="replace")

    def token_str(self, i: int) -> str:
        """A token's bytes spelled in GPT-2's printable alphabet: a space is 'Ġ', a newline 'Ċ'."""
        alphabet = bytes_to_unicode()  # GPT-2's byte -> printable character table
        return "".join(alphabet[b] for b in self.vocab[int(i)])

    def tokens(self, text: str) -> list[str]:
        """The readable pieces ``text`` is cut into."""
        return [self.token_str(i) for i in self.encode(text)]

    def merge_rows(self, n: int = 10) -> list[dict]:
        """The first ``n`` merges as table rows: rank, left + right -> new token (and count, if trained)."""
        rows = []
        for rank, ((a, b), new) in enumerate(list(self.merges.items())[:n]):
            row = {
                "rank": rank,
                "left": self.token_str(a),
                "right": self.token_str(b),
                "new id": new,
                "new token": self.token_str(new),
            }
            if rank < len(self.counts):
                row["count"] = self.counts[rank]
            rows.append(row)
        return rows

    @classmethod
    def from_gguf(cls, path: str | os.PathLike) -> "BPE":
        """A real model's vocabulary and merges (a byte-level BPE GGUF file, such as SmolLM2's)."""
        meta = read_gguf_metadata(path)
        pre = meta.get("tokenizer.ggml.pre", "default")
        if meta.get("tokenizer.ggml.model") != "gpt2" or pre not in GPT2_PRETOKENIZERS + DIGITS_PRETOKENIZERS:
            raise ModelFileError(
                f"{path}: jaxlab.lab.bpe reads GPT-2 style byte-level BPE files only (tokenizer.ggml.pre = {pre!r})"
            )
        unspell = {c: b for b, c in bytes_to_unicode().items()}
        tokens = meta["tokenizer.ggml.tokens"]
        # A token spelled outside the byte alphabet (a special token like <|im_start|>) is its own text.
        vocab = {
            i: bytes(unspell[c] for c in t) if all(c in unspell for c in t) else t.encode("utf-8")
            for i, t in enumerate(tokens)
        }
        ids = {t: i for i, t in enumerate(tokens)}
        merges = {}
        for m in meta["tokenizer.ggml.merges"]:
            left, right = m.split(" ", 1)
            merges[(ids[left], ids[right])] = ids[left + right]
        return cls(vocab, merges, DIGITS_PATTERN if pre in DIGITS_PRETOKENIZERS else GPT2_PATTERN)


def train(text: str, vocab_size: int, pattern: str = GPT2_PATTERN, min_count: int = 2) -> BPE:
    """Learn up to ``vocab_size - 256`` merges from ``text``.

    Training stops early when no pair occurs ``min_count`` times (merging a pair seen once only
    memorizes the text). Ties between equally frequent pairs go to the smallest pair of ids, so
    training is deterministic."""
    if vocab_size < 256:
        raise ValueError(f"a byte-level vocabulary has at least 256 tokens, got vocab_size={vocab_size}")
    vocab = {i: bytes([i]) for i in range(256)}
    # Each distinct word once, with how often it occurs: counting is then per distinct word.
    words = [(list(w.encode("utf-8")), n) for w, n in Counter(pretokenize(text, pattern)).items()]
    merges, counts = {}, []
    for new_id in range(256, vocab_size):
        pairs: dict[tuple[int, int], int] = {}
        for ids, n in words:
            count_pairs(ids, pairs, weight=n)
        best = max(pairs, key=lambda p: (pairs[p], -p[0], -p[1]), default=None)
        if best is None or pairs[best] < min_count:
            break  # nothing left worth merging
        merges[best] = new_id
        counts.append(pairs[best])
        vocab[new_id] = vocab[best[0]] + vocab[best[1]]
        words = [(merge(ids, best, new_id), n) for ids, n in words]
    return BPE(vocab, merges, pattern, counts)


def compare_speed(
    encoders: dict[str, Callable[[list[str]], list[list[int]]]], workloads: dict[str, list[str]], repeats: int = 3
) -> list[dict]:
    """Time batch encoders on the same texts -> table rows (best of ``repeats`` runs, in ms).

    ``encoders`` maps a name to ``fn(texts) -> ids per text``; the last one's speed-up over the first
    is reported, and whether all of them gave the same ids."""
    rows = []
    for workload, texts in workloads.items():
        row, seconds, outputs = {"workload": workload}, {}, []
        for name, fn in encoders.items():
            best = float("inf")
            for _ in range(repeats):
                t0 = time.perf_counter()
                out = fn(texts)
                best = min(best, time.perf_counter() - t0)
            seconds[name] = best
            outputs.append(out)
        row["tokens"] = sum(len(ids) for ids in outputs[0])
        row.update({f"{name} ms": 1e3 * s for name, s in seconds.items()})
        first, last = list(seconds)[0], list(seconds)[-1]
        row[f"{last} speed-up"] = seconds[first] / seconds[last]
        row["same ids"] = "yes" if all(o == outputs[0] for o in outputs) else "no"
        rows.append(row)
    return rows


# --------------------------------------------------------------------------------------------------
# Figures of notebook 02
# --------------------------------------------------------------------------------------------------


def plot_compression(rows: list[dict], corpus_bytes: int, held_out_bytes: int):
    """Bytes per token against vocabulary size, on the training corpus and on held-out text (rows with
    ``vocab``, ``corpus tokens`` and ``held-out tokens``)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    vocab = [r["vocab"] for r in rows]
    ax.plot(vocab, [corpus_bytes / r["corpus tokens"] for r in rows], "o-", label="training corpus")
    ax.plot(vocab, [held_out_bytes / r["held-out tokens"] for r in rows], "s-", label="held-out text")
    ax.set(xlabel="vocabulary size", ylabel="bytes per token", title="Merges compress the text they were learned on")
    ax.legend()
    fig.tight_layout()
    return fig


def plot_bytes_per_token(samples: dict[str, str], encode: Callable[[str], list[int]]):
    """One bar per kind of text: its UTF-8 bytes per token under ``encode`` (more bytes per token: cheaper text)."""
    import matplotlib.pyplot as plt

    kinds = list(samples)
    ratio = [len(samples[k].encode()) / len(encode(samples[k])) for k in kinds]
    fig, ax = plt.subplots()
    ax.bar(kinds, ratio, color="#2b5d8a")
    for i, r in enumerate(ratio):
        ax.text(i, r, f"{r:.1f}", ha="center", va="bottom", fontsize=8)
    ax.set(xlabel="kind of text", ylabel="UTF-8 bytes per token", title="What one token buys, by kind of text")
    fig.tight_layout()
    return fig


def plot_throughput(stages: dict[str, float]):
    """Horizontal bars of tokens per second (log scale), one per stage of the pipeline."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    names = list(stages)
    ax.barh(names, [stages[n] for n in names], color=["#b5523b" if "model" in n else "#2b5d8a" for n in names])
    ax.set_xscale("log")
    ax.set_xlim(left=min(stages.values()) / 10)  # bars start well left of the slowest stage
    ax.invert_yaxis()
    ax.set(xlabel="tokens per second (log scale)", ylabel="stage", title="Tokenizers against the model's prefill")
    fig.tight_layout()
    return fig
