"""Checks for notebook 17's exercises: unpacking a grammar's bitmask, masking logits with it, and a regex for a
list of choices.

* ``my_unpack(row, vocab)``: a bitmask row [ceil(vocab / 32)] int32 -> allowed [vocab] bool (bit ``i`` of word
  ``w`` is token ``32 * w + i``). Reference: what :func:`jaxlab.engine.grammar.mask_logits` computes.
* ``my_mask_logits(logits, allowed)``: logits [V] float32 with every token not allowed at -inf.
* ``my_choice_regex(options)``: a regex that matches exactly one of the options, whole (the options may hold
  characters a regex treats specially: ``.``, ``+``, ``(``).
"""

from __future__ import annotations

import re

import numpy as np

from jaxlab.lab.exercises import check_function, report


def reference_unpack(row, vocab):
    bits = (np.asarray(row, np.int32)[:, None] >> np.arange(32, dtype=np.int32)) & 1
    return bits.reshape(-1)[:vocab].astype(bool)


def _row_inputs(rng):
    vocab = int(rng.integers(1, 400))
    words = (vocab + 31) // 32
    kind = int(rng.integers(0, 3))
    if kind == 0:  # everything allowed: every bit set, the int32 -1 (the sign bit too)
        row = np.full(words, -1, np.int32)
    elif kind == 1:  # one token allowed, as after a JSON key's opening quote
        row = np.zeros(words, np.int32)
        t = int(rng.integers(0, vocab))
        row[t // 32] = np.int32(np.uint32(1 << (t % 32)).view(np.int32))
    else:
        row = rng.integers(-(2**31), 2**31, size=words, dtype=np.int64).astype(np.int32)
    return row, vocab


def check_unpack(fn, trials: int = 20) -> bool:
    return check_function(
        lambda *a: np.asarray(fn(*a), bool), reference_unpack, _row_inputs, name="bitmask unpacking", trials=trials
    )


def reference_mask_logits(logits, allowed):
    return np.where(np.asarray(allowed, bool), np.asarray(logits, np.float32), -np.inf)


def _logit_inputs(rng):
    vocab = int(rng.integers(2, 300))
    allowed = rng.random(vocab) < rng.choice([0.01, 0.5, 1.0])
    allowed[int(rng.integers(0, vocab))] = True  # a grammar always allows something
    return rng.standard_normal(vocab).astype(np.float32), allowed


def check_mask_logits(fn, trials: int = 20) -> bool:
    return check_function(
        lambda *a: np.asarray(fn(*a), np.float32), reference_mask_logits, _logit_inputs, name="masked logits",
        trials=trials,
    )  # fmt: skip


OPTION_SETS = [
    ["yes", "no"],
    ["red", "green", "blue"],
    ["a.b", "c+", "(x)", "1*2"],  # characters a regex reads as operators
    ["positive", "negative", "neutral"],
    ["?", "[]", "$5", "x|y"],
]


def check_choice_regex(fn) -> bool:
    """Each option set: every option matches whole; near misses (a prefix, an option with a letter changed, two
    options run together, the characters read as operators) do not."""
    for options in OPTION_SETS:
        try:
            pattern = re.compile(fn(list(options)))
        except NotImplementedError:
            return report(False, "choice regex", "not implemented yet", False)
        except Exception as e:
            return report(False, "choice regex", f"{options}: {type(e).__name__}: {e}", False)
        for o in options:
            if not pattern.fullmatch(o):
                return report(False, "choice regex", f"{options}: {o!r} does not match", False)
        misses = [o[:-1] for o in options] + [o + o for o in options] + ["".join(options), "ab", "cc", "x", "15*2"]
        misses = [m for m in misses if m not in options]
        for m in misses:
            if pattern.fullmatch(m):
                return report(False, "choice regex", f"{options}: {m!r} matches but is not an option", False)
    return report(True, "choice regex", f"{len(OPTION_SETS)} option sets: every option, no near miss", False)
