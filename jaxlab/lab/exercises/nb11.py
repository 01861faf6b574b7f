"""Checks for notebook 11's exercises: reading the page table, counting reusable prefix pages, and a step's
prefill chunks under the token budget.

* ``my_locate(positions [N], page_table_row [P], page_size)``: for each position, (physical page, offset).
  Reference: what :func:`jaxlab.engine.paged.write_pages` computes for one row.
* ``my_reusable_pages(cached, prompt, page_size)``: how many leading *full* pages of ``prompt`` equal the same
  pages of ``cached`` (a prompt already in the cache), never counting the page that holds the prompt's last
  token (its logits must be computed). Reference: what the scheduler reads from the prefix table.
* ``my_chunks(budget, n_decode, chunk, prompt_left)``: prompt chunks one step can prefill: what the budget
  leaves after one token per decoding sequence, in whole chunks, no more than the prompt needs.
"""

from __future__ import annotations

import numpy as np

from jaxlab.lab.exercises import check_function


def reference_locate(positions, table, page_size):
    positions, table = np.asarray(positions), np.asarray(table)
    return table[positions // page_size], positions % page_size


def _locate_inputs(rng):
    ps = int(rng.choice([1, 4, 16]))
    pages = int(rng.integers(1, 6))
    table = rng.permutation(np.arange(1, 40))[:pages]
    positions = rng.integers(0, pages * ps, size=int(rng.integers(1, 8)))
    return positions, table, ps


def check_locate(fn, trials: int = 10) -> bool:
    return check_function(
        lambda p, t, ps: tuple(np.asarray(x, np.int64) for x in fn(p, t, ps)),
        lambda p, t, ps: tuple(np.asarray(x, np.int64) for x in reference_locate(p, t, ps)),
        _locate_inputs,
        name="position -> (page, offset)",
        trials=trials,
    )


def reference_reusable(cached, prompt, page_size):
    from jaxlab.engine.pages import page_hashes

    a, b = page_hashes(cached, page_size), page_hashes(prompt, page_size)
    n = 0
    while n < min(len(a), len(b), (len(prompt) - 1) // page_size) and a[n] == b[n]:
        n += 1
    return n


def _reusable_inputs(rng):
    ps = int(rng.choice([2, 4]))
    shared = [int(t) for t in rng.integers(0, 5, size=int(rng.integers(0, 14)))]
    cached = shared + [int(t) for t in rng.integers(0, 5, size=int(rng.integers(0, 6)))]
    prompt = shared + [int(t) for t in rng.integers(0, 5, size=int(rng.integers(1, 6)))]
    return cached, prompt, ps


def check_reusable_pages(fn, trials: int = 20) -> bool:
    return check_function(
        lambda c, p, ps: int(fn(list(c), list(p), ps)),
        reference_reusable,
        _reusable_inputs,
        name="reusable prefix pages",
        trials=trials,
    )


def reference_chunks(budget, n_decode, chunk, prompt_left):
    return min(max(budget - n_decode, 0) // chunk, -(-prompt_left // chunk))


def _chunk_inputs(rng):
    chunk = int(rng.choice([16, 64]))
    return int(rng.integers(chunk, 6 * chunk)), int(rng.integers(0, 33)), chunk, int(rng.integers(1, 700))


def check_chunks(fn, trials: int = 20) -> bool:
    return check_function(
        lambda *a: int(fn(*a)), reference_chunks, _chunk_inputs, name="prefill chunks in a step", trials=trials
    )
