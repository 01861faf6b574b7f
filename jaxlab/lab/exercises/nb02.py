"""Checks for notebook 02 (tokenization): count pairs, merge a pair, left-pad a batch.

Each ``check_*`` runs the reader's function and jaxlab's on random inputs and prints PASS, or FAIL
with the first mismatch. The references are :func:`jaxlab.lab.bpe.count_pairs`, :func:`jaxlab.lab.bpe.merge`
and :func:`jaxlab.io.tokenizer.pad_batch`.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from jaxlab.io.tokenizer import pad_batch
from jaxlab.lab import bpe
from jaxlab.lab.exercises import check_function, report


def _ids(rng: np.random.Generator) -> list[int]:
    # A small alphabet, so repeated and overlapping pairs ([3, 3, 3]) are common.
    return [int(x) for x in rng.integers(0, 4, size=int(rng.integers(0, 16)))]


def check_count_pairs(fn: Callable, trials: int = 20, seed: int = 0) -> bool:
    """``fn(ids) -> {(a, b): count}`` must count every adjacent pair, overlaps included."""
    name = "count_pairs"
    rng = np.random.default_rng(seed)
    cases = [[], [7], [1, 1, 1], [1, 2, 1, 2]] + [_ids(rng) for _ in range(trials)]
    for trial, ids in enumerate(cases):
        try:
            got = fn(list(ids))
        except NotImplementedError:
            return report(False, name, "not implemented yet", False)
        except Exception as e:
            return report(False, name, f"ids={ids}: raised {type(e).__name__}: {e}", False)
        want = bpe.count_pairs(ids)
        if not isinstance(got, dict):
            return report(False, name, f"ids={ids}: returned a {type(got).__name__}, expected a dict", False)
        got = {tuple(k): v for k, v in got.items() if v}  # a zero count is the same as no entry
        for pair in sorted(set(got) | set(want)):
            if got.get(pair, 0) != want.get(pair, 0):
                return report(
                    False,
                    name,
                    f"ids={ids}: pair {pair} counted {got.get(pair, 0)} time(s), expected {want.get(pair, 0)}",
                    False,
                )
    return report(True, name, f"{len(cases)} inputs match the reference", False)


def check_merge(fn: Callable, trials: int = 20, seed: int = 0) -> bool:
    """``fn(ids, pair, new_id) -> ids`` must replace the pair left to right: merge([a,a,a], (a,a), Z) == [Z, a]."""

    # Runs of one id first ([1, 1, 1] -> [Z, 1], not [1, Z]), then random ids and a pair that often occurs.
    fixed = iter([([1, 1, 1], (1, 1)), ([2, 1, 1, 1, 1, 1, 2], (1, 1)), ([1, 2, 1, 2, 3], (1, 2)), ([], (0, 0))])

    def make_inputs(rng):
        ids, pair = next(fixed, (None, None))
        if ids is None:
            ids = _ids(rng)
            pair = tuple(int(x) for x in rng.integers(0, 4, size=2))
            if len(ids) >= 2 and rng.random() < 0.7:
                at = int(rng.integers(0, len(ids) - 1))
                pair = (ids[at], ids[at + 1])
        return list(ids), pair, 99

    # Arrays, not lists: check_function would read a list as several separate outputs.
    def yours(ids, pair, new_id):
        return np.asarray(fn(list(ids), pair, new_id), dtype=np.int64)

    def reference(ids, pair, new_id):
        return np.asarray(bpe.merge(ids, pair, new_id), dtype=np.int64)

    return check_function(yours, reference, make_inputs, name="merge", trials=trials, seed=seed)


def check_left_pad(fn: Callable, trials: int = 10, seed: int = 0) -> bool:
    """``fn(batch, pad_id) -> (ids [B, T], mask [B, T])``, padding on the left, mask True on real tokens."""

    def make_inputs(rng):
        batch = [
            [int(x) for x in rng.integers(3, 100, size=int(rng.integers(1, 7)))] for _ in range(int(rng.integers(1, 5)))
        ]
        return batch, int(rng.integers(0, 3))

    def reference(batch, pad_id):
        return pad_batch(batch, pad_id, side="left")

    return check_function(fn, reference, make_inputs, name="left_pad", trials=trials, seed=seed)
