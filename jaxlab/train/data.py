"""Training examples -> token batches: the chat template around each prompt, the loss on the answer only, bucketing.

An example is ``{"prompt": ..., "answer": ...}`` (one JSON object per line of a ``.jsonl`` file). It becomes the
tokens of a chat: the model's template around the prompt as the user's turn, then the answer and the end-of-turn
token as the assistant's. The model learns to predict every token from the ones before it, and the loss counts
only the answer's tokens (and the end-of-turn token, so the model learns to stop): the prompt is given, not learnt.

Batches are right-padded to a bucket length (a multiple of ``BUCKET``), so a handful of shapes compile once each.
Padding gets position -1, which the model's mask rule treats as absent (:mod:`jaxlab.engine.model`): padding
changes nothing for the real tokens. Packing several examples into one row would waste less padding, but would
need a mask by segment that the position rule cannot express; buckets keep the one forward pass unchanged.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from jaxlab.errors import InvalidRequestError
from jaxlab.io.tokenizer import prompt_ids

BUCKET = 16  # batches are padded to a multiple of this many tokens (and answers to a multiple of ANSWER_BUCKET)
ANSWER_BUCKET = 16


@dataclass(frozen=True)
class Batch:
    tokens: np.ndarray  # [B, T] int32, right-padded with the pad id
    positions: np.ndarray  # [B, T] int32, -1 on padding
    at: np.ndarray  # [B, A] int32: the positions whose next-token predictions are scored (each answer token's previous)
    targets: np.ndarray  # [B, A] int32: the token each of those positions should predict
    weights: np.ndarray  # [B, A] float32: 1 for a real answer token, 0 for padding of the answer axis

    @property
    def n_tokens(self) -> int:
        return int((self.positions >= 0).sum())


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """The examples of a JSONL file, each with a non-empty string "prompt" and "answer"; a clear error otherwise."""
    path = Path(path)
    if not path.is_file():
        raise InvalidRequestError(f'{path}: no such file (give a .jsonl file, one {{"prompt", "answer"}} per line)')
    out = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise InvalidRequestError(f"{path}:{i}: not JSON ({e.msg}); each line must be one JSON object") from None
        if not isinstance(row, dict) or not all(isinstance(row.get(k), str) and row[k] for k in ("prompt", "answer")):
            raise InvalidRequestError(f'{path}:{i}: each line needs non-empty string fields "prompt" and "answer"')
        out.append({"prompt": row["prompt"], "answer": row["answer"]})
    if not out:
        raise InvalidRequestError(f"{path}: no examples in the file")
    return out


def encode_example(tokenizer, example: dict) -> tuple[list[int], int]:
    """(all ids: the chat prompt, the answer, end of turn; how many of them are the prompt)."""
    prompt = prompt_ids(tokenizer, example["prompt"])
    answer = tokenizer.encode(example["answer"]) + [tokenizer.eos_id]
    return prompt + answer, len(prompt)


def bucket_length(n: int, bucket: int = BUCKET) -> int:
    return -(-n // bucket) * bucket


def make_batch(encoded: Sequence[tuple[list[int], int]], pad_id: int, length: int | None = None) -> Batch:
    """Right-pad encoded examples to ``length`` (default: the longest, rounded up to a bucket)."""
    longest = max(len(ids) for ids, _ in encoded)
    length = length or bucket_length(longest)
    if longest > length:
        raise InvalidRequestError(f"an example has {longest} tokens, more than the batch length {length}")
    if any(n_prompt < 1 or n_prompt >= len(ids) for ids, n_prompt in encoded):
        raise InvalidRequestError("every example needs at least one prompt token and one answer token")
    answer = bucket_length(max(len(ids) - n for ids, n in encoded), ANSWER_BUCKET)
    b = len(encoded)
    tokens = np.full((b, length), pad_id, np.int32)
    positions = np.full((b, length), -1, np.int32)
    at = np.zeros((b, answer), np.int32)
    targets = np.zeros((b, answer), np.int32)
    weights = np.zeros((b, answer), np.float32)
    for r, (ids, n_prompt) in enumerate(encoded):
        tokens[r, : len(ids)] = ids
        positions[r, : len(ids)] = np.arange(len(ids))
        n = len(ids) - n_prompt
        at[r, :n] = np.arange(n_prompt - 1, len(ids) - 1)  # position t predicts token t + 1
        targets[r, :n] = ids[n_prompt:]
        weights[r, :n] = 1.0
    return Batch(tokens, positions, at, targets, weights)


class Batches:
    """An endless, reproducible stream of batches: epoch ``e`` shuffles the examples with ``seed + e``, and
    :meth:`at` gives the batch of any step directly, so a resumed run sees exactly the batches it would have."""

    def __init__(
        self,
        encoded: Sequence[tuple[list[int], int]],
        batch_size: int,
        pad_id: int,
        seed: int = 0,
        max_len: int | None = None,
    ):
        if batch_size < 1:
            raise InvalidRequestError(f"batch size must be >= 1, got {batch_size}")
        if len(encoded) < batch_size:
            raise InvalidRequestError(f"{len(encoded)} examples are fewer than one batch of {batch_size}")
        longest = max(len(ids) for ids, _ in encoded)
        if max_len is not None and longest > max_len:
            raise InvalidRequestError(
                f"the longest example has {longest} tokens; the limit is {max_len} (shorten it or raise --max-len)"
            )
        self.encoded, self.batch_size, self.pad_id, self.seed = list(encoded), batch_size, pad_id, seed
        self.per_epoch = len(self.encoded) // batch_size  # the last partial batch of an epoch is dropped

    def at(self, step: int) -> Batch:
        epoch, i = divmod(step, self.per_epoch)
        order = np.random.default_rng(self.seed + epoch).permutation(len(self.encoded))
        rows = [self.encoded[j] for j in order[i * self.batch_size : (i + 1) * self.batch_size]]
        return make_batch(rows, self.pad_id)
