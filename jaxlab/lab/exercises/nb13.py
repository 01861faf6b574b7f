"""Checks for notebook 13's exercises: one masked block of the online softmax, and block sizes a chip accepts.

* ``my_block_update(m, total, acc, q, k, v, visible, scale)``: fold one block of keys into the running softmax.
  m, total [Q, 1], acc [Q, D] (float32), q [Q, D], k, v [K, D], visible [Q, K] bool -> the new (m, total, acc);
  masked scores are -1e30 (:data:`jaxlab.engine.kernels.common.MASK_VALUE`) and add nothing to the sum, a row
  that sees nothing keeps its state. Reference: :func:`jaxlab.engine.kernels.common.online_update`.
* ``my_blocks(q_len, s_len, chip)``: (block_q, block_k) for an attention of q_len queries over s_len keys on
  ``chip`` ("tpu" or "gpu") that break none of the rules of :func:`jaxlab.lab.pallas.block_problems`.
"""

from __future__ import annotations

import numpy as np

from jaxlab.lab.exercises import check_function, report


def reference_block_update(m, total, acc, q, k, v, visible, scale):
    import jax

    from jaxlab.engine.kernels.common import online_update

    out = online_update(
        m, total, acc, q, k, v, visible, scale=scale, dtype=np.float32, precision=jax.lax.Precision.HIGHEST
    )
    return tuple(np.asarray(x, np.float32) for x in out)


def _block_inputs(rng):
    rows, keys, d = int(rng.integers(1, 6)), int(rng.integers(1, 9)), int(rng.integers(2, 6))
    q, k, v = (rng.normal(size=(n, d)).astype(np.float32) for n in (rows, keys, keys))
    visible = rng.random((rows, keys)) < 0.6
    visible[0] = False if rng.random() < 0.4 else visible[0]  # sometimes a row that sees nothing in this block
    if rng.random() < 0.3:  # the first block: the initial state
        m = np.full((rows, 1), -1e30, np.float32)
        total, acc = np.zeros((rows, 1), np.float32), np.zeros((rows, d), np.float32)
    else:  # a later block: a state some earlier block left, its maximum sometimes above this block's scores
        m = rng.normal(size=(rows, 1)).astype(np.float32) * 2
        total = rng.uniform(0.5, 3, size=(rows, 1)).astype(np.float32)
        acc = rng.normal(size=(rows, d)).astype(np.float32)
    return m, total, acc, q, k, v, visible, float(d**-0.5)


def check_block_update(fn, trials: int = 20) -> bool:
    return check_function(
        lambda *a: tuple(np.asarray(x, np.float32) for x in fn(*a)), reference_block_update, _block_inputs,
        name="one masked block of the online softmax", trials=trials, atol=1e-5,
    )  # fmt: skip


#: (q_len, s_len, chip): decode with 9 query heads, a 512-token prefill, awkward lengths
BLOCK_CASES = (
    (9, 2048, "tpu"),
    (512, 4096, "tpu"),
    (1000, 640, "tpu"),
    (9, 2048, "gpu"),
    (100, 300, "gpu"),
    (512, 4096, "gpu"),
)


def check_blocks(fn) -> bool:
    from jaxlab.lab.pallas import block_problems

    for q_len, s_len, chip in BLOCK_CASES:
        try:
            got = fn(q_len, s_len, chip)
        except NotImplementedError:
            return report(False, "block sizes", "not implemented yet", False)
        except Exception as e:  # show the reader's error as one line
            first_line = (str(e).strip().splitlines() or [""])[0]
            return report(False, "block sizes", f"{q_len} x {s_len} on {chip}: raised {type(e).__name__}: {first_line}", False)  # fmt: skip
        try:
            bq, bk = got
        except (TypeError, ValueError):
            return report(False, "block sizes", f"{q_len} x {s_len} on {chip}: return (block_q, block_k), got {got!r}", False)  # fmt: skip
        problems = block_problems(q_len, s_len, bq, bk, chip)
        if problems:
            return report(False, "block sizes", f"{q_len} x {s_len} on {chip}: {'; '.join(problems)}", False)
    return report(True, "block sizes", f"{len(BLOCK_CASES)} shapes, TPU and GPU rules kept", False)
