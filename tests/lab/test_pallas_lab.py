"""Notebook 13's exercise checkers (PASS on the solutions, FAIL on wrong answers) and the helpers it draws and
tabulates with (:mod:`jaxlab.lab.pallas`)."""

from __future__ import annotations

import matplotlib
import numpy as np
from conftest import load_solution, not_implemented

from jaxlab.lab import pallas as lp
from jaxlab.lab.exercises import nb13

matplotlib.use("Agg")


def test_nb13_checkers_pass_solutions_and_fail_wrong_answers(capsys):
    sol = load_solution("13_pallas_kernels")
    assert nb13.check_block_update(sol.my_block_update)
    assert nb13.check_blocks(sol.my_blocks)

    def no_rescale(m, total, acc, q, k, v, visible, scale):  # forgets exp(m_old - m_new)
        s = np.where(visible, q @ k.T * scale, -1e30)
        m_new = np.maximum(m, s.max(1, keepdims=True))
        p = np.where(visible, np.exp(s - m_new), 0.0)
        return m_new, total + p.sum(1, keepdims=True), acc + p @ v

    def no_mask(m, total, acc, q, k, v, visible, scale):  # every key counted
        return sol.my_block_update(m, total, acc, q, k, v, np.ones_like(visible), scale)

    assert not nb13.check_block_update(no_rescale)
    assert not nb13.check_block_update(no_mask)
    assert not nb13.check_block_update(not_implemented)
    assert not nb13.check_blocks(lambda q, s, chip: (64, 128))  # 64 does not divide 9 queries on a TPU
    assert not nb13.check_blocks(lambda q, s, chip: (q, s))  # whole dimensions: too big, not powers of two
    assert not nb13.check_blocks(not_implemented)
    out = capsys.readouterr().out
    assert "PASS: block sizes" in out and "FAIL: block sizes: not implemented yet" in out


def test_block_rules():
    assert lp.block_problems(9, 2048, 9, 512, "tpu") == []  # the whole dimension is always a legal block
    assert lp.block_problems(9, 2048, 16, 128, "gpu") == []
    assert any("multiple of 128" in p for p in lp.block_problems(512, 4096, 64, 100, "tpu"))
    assert any("power of two" in p for p in lp.block_problems(100, 300, 24, 128, "gpu"))
    assert any("under 16" in p for p in lp.block_problems(9, 2048, 8, 128, "gpu"))
    assert any("not a positive int" in p for p in lp.block_problems(9, 2048, 8.0, 128, "tpu"))


def test_visited_key_blocks_skip_above_the_diagonal_and_padding():
    pos = np.arange(64)
    assert (lp.visited_key_blocks(pos, pos, 16, 16) == np.tril(np.ones((4, 4), bool))).all()
    padded = np.concatenate([-np.ones(20, int), np.arange(44)])  # left padding: 20 empty slots
    visited = lp.visited_key_blocks(padded, padded, 16, 16)
    assert not visited[0].any() and not visited[:, 0].any() and visited[3, 1:].all()


def test_paged_reads_stop_at_each_rows_length():
    table = np.array([[3, 7, 1, 0], [5, 2, 0, 0], [4, 6, 8, 9]])
    assert lp.paged_reads(table, np.array([[40], [10], [-1]]), 16) == [[3, 7, 1], [5], []]


def test_online_softmax_steps_end_at_the_softmax():
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=8), rng.normal(size=(40, 8)) * 2, rng.normal(size=(40, 8))
    rows, out = lp.online_softmax_steps(q, k, v, 16)
    assert [r["keys seen"] for r in rows] == [16, 32, 40]
    assert all(abs(r["running max m"] - r["max score so far"]) < 1e-5 for r in rows)
    assert all(r["|acc/sum - softmax·v|"] < 1e-5 for r in rows)
    s = k @ q / np.sqrt(8)
    p = np.exp(s - s.max())
    np.testing.assert_allclose(out, p / p.sum() @ v, atol=1e-5)


def test_figures_draw():
    pos = np.arange(32)
    assert lp.plot_flash_blocks(pos, pos, 8, 16).axes
    assert lp.plot_paged_reads(np.array([[0, 2], [1, 3]]), np.array([[20], [3]]), 16, 4).axes
