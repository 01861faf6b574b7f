"""Checks for notebook 11's exercises: reading the page table, counting reusable prefix pages, and a step's
prefill chunks under the token budget.

* ``my_locate(positions [N], page_table_row [P], page_size)``: for each position, (physical page, offset).
  Reference: what :func:`jaxlab.engine.paged.write_pages` computes for one row.
* ``my_reusable_pages(cached, prompt, page_size)``: how many leading *full* pages of ``prompt`` equal the same
  pages of ``cached`` (a prompt already in the cache), never counting the page that holds the prompt's last
  token (its logits must be computed). Reference: what the scheduler reads from the prefix table.
* ``my_chunks(budget, n_decode, chunk, prompt_left)``: prompt chunks one step can prefill: what the budget
  leaves after one token per decoding sequence, in whole chunks, no more than the prompt needs.
* ``my_allocate(free_pages, tokens, page_size)``: the pages a request of ``tokens`` positions takes, from the front
  of the free list, or None when too few are free. Reference: the engine's pool
  (:class:`jaxlab.engine.pages.PagePool`) handing them out.
* ``my_admit(waiting, free_slots, free_pages, page_size, budget, n_decode)``: one scheduler step's admissions,
  first come first served, each with its pages from ``my_allocate``: ``[(slot, pages), ...]``.

The last two are pieces of the build-the-engine track (:mod:`jaxlab.lab.exercises.track`): there they decide which
request runs in which slot, with which pages.
"""

from __future__ import annotations

from collections import OrderedDict

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


def reference_allocate(free_pages, tokens, page_size):
    """What the engine's pool hands out: one page per ``page_size`` positions, from the front of the free list
    (least recently freed first); None, and nothing taken, when too few are free."""
    from jaxlab.engine.pages import PagePool

    pool = PagePool(max(free_pages, default=1) + 1, page_size)
    pool.free = OrderedDict((int(p), None) for p in free_pages)  # this free list, in this order
    need = -(-tokens // page_size)
    if need > pool.free_count:
        return None
    return [pool.allocate() for _ in range(need)]


def _allocate_inputs(rng):
    ps = int(rng.choice([4, 16]))
    free = rng.permutation(np.arange(1, 30))[: int(rng.integers(0, 9))].tolist()
    return free, int(rng.integers(1, 9 * ps)), ps


def _pages(x):
    return None if x is None else [int(p) for p in x]


def check_allocate(fn, trials: int = 20) -> bool:
    """``fn(free_pages, tokens, page_size) -> pages or None``, against the engine's pool."""
    return check_function(
        fn, reference_allocate, _allocate_inputs, name="page allocation", trials=trials, normal=_pages
    )


def reference_admit(waiting, free_slots, free_pages, page_size, budget, n_decode):
    """First come, first served: admit the next waiting request while a slot is free, its prompt fits in what the
    budget leaves (after one token per decoding sequence and the prompts admitted before it) and pages for its
    prompt and its new tokens are free; stop at the first that does not fit."""
    plan, left, free = [], budget - n_decode, list(free_pages)
    for (prompt, new), slot in zip(waiting, free_slots):
        pages = reference_allocate(free, prompt + new, page_size) if prompt <= left else None
        if pages is None:
            break
        plan.append((slot, pages))
        free, left = free[len(pages) :], left - prompt
    return plan


def _admit_inputs(rng):
    ps = int(rng.choice([4, 16]))
    waiting = [(int(rng.integers(1, 60)), int(rng.integers(1, 20))) for _ in range(int(rng.integers(0, 5)))]
    free_slots = sorted(rng.permutation(4)[: int(rng.integers(0, 5))].tolist())
    free_pages = rng.permutation(np.arange(1, 30))[: int(rng.integers(0, 16))].tolist()
    return waiting, free_slots, free_pages, ps, int(rng.integers(16, 160)), int(rng.integers(0, 5))


def check_admit(fn, trials: int = 30) -> bool:
    """``fn(waiting, free_slots, free_pages, page_size, budget, n_decode) -> [(slot, pages), ...]``."""
    return check_function(
        fn,
        reference_admit,
        _admit_inputs,
        name="one scheduler step",
        trials=trials,
        normal=lambda plan: [(int(slot), _pages(pages)) for slot, pages in plan],
    )
