"""Automatic checks for the notebooks' exercises.

``check_function(yours, reference, make_inputs)`` runs both functions on random inputs and prints a
clear PASS, or FAIL with the first mismatch (which trial, which element, what you gave, what was
expected). One module per notebook (``nb01``, ``nb02``, ...) holds its exercises' references.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np


def first_mismatch(got, want, atol, rtol):
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return f"shape {got.shape}, expected {want.shape}"
    got, want = np.atleast_1d(got), np.atleast_1d(want)  # argwhere of a 0-d array finds nothing
    if got.shape != want.shape:
        return f"shape {got.shape}, expected {want.shape}"
    if got.dtype.kind in "iub" or want.dtype.kind in "iub":
        bad = np.argwhere(got != want)
    else:
        bad = np.argwhere(~np.isclose(got, want, atol=atol, rtol=rtol, equal_nan=True))
    if bad.size == 0:
        return None
    idx = tuple(int(i) for i in bad[0])
    return f"at index {idx}: got {got[idx]!r}, expected {want[idx]!r} ({len(bad)} element(s) differ)"


def check_function(
    yours: Callable,
    reference: Callable,
    make_inputs: Callable[[np.random.Generator], tuple],
    name: str = "",
    trials: int = 5,
    atol: float = 1e-5,
    rtol: float = 1e-5,
    seed: int = 0,
    quiet: bool = False,
    normal: Callable[[Any], Any] | None = None,
) -> bool:
    """Compare ``yours(*inputs)`` to ``reference(*inputs)`` on ``trials`` random inputs.

    ``normal``: for answers that are not arrays (None, a list of pairs ...): both answers are put in one plain form
    by it and must be equal; a mismatch is reported with the inputs, and ``yours`` gets copies of list inputs, so
    an answer that changes its arguments cannot change the reference's."""
    name = name or getattr(reference, "__name__", "exercise")
    rng = np.random.default_rng(seed)
    for trial in range(trials):
        inputs = make_inputs(rng)
        try:
            got = yours(*(tuple(list(a) if isinstance(a, list) else a for a in inputs) if normal else inputs))
            if normal:
                got = normal(got)
        except NotImplementedError:
            return report(False, name, "not implemented yet", quiet)
        except Exception as e:  # show the reader's error as one line
            first_line = (str(e).strip().splitlines() or [""])[0]
            return report(False, name, f"trial {trial}: raised {type(e).__name__}: {first_line}", quiet)
        want = reference(*inputs)
        if normal:
            if got != normal(want):
                args = ", ".join(map(repr, inputs))
                return report(False, name, f"trial {trial}: ({args}) gave {got}, expected {normal(want)}", quiet)
            continue
        got_leaves, want_leaves = _leaves(got), _leaves(want)
        if len(got_leaves) != len(want_leaves):
            return report(
                False, name, f"trial {trial}: returned {len(got_leaves)} value(s), expected {len(want_leaves)}", quiet
            )
        for i, (g, w) in enumerate(zip(got_leaves, want_leaves)):
            msg = first_mismatch(g, w, atol, rtol)
            if msg:
                where = f" output {i}" if len(want_leaves) > 1 else ""
                return report(False, name, f"trial {trial}{where} {msg}", quiet)
    return report(True, name, f"{trials} random inputs match the reference", quiet)


def _leaves(x: Any) -> list:
    return list(x) if isinstance(x, (tuple, list)) else [x]


def report(ok: bool, name: str, detail: str, quiet: bool) -> bool:
    if not quiet:
        print(f"{'PASS' if ok else 'FAIL'}: {name}: {detail}")
    return ok
