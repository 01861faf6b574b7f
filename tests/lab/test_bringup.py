"""Notebook 18's helpers (the decode cost per kind of layer against the context, prefill by form) on the tiny
Qwen3.5 configuration, and its exercises' checkers: the solutions pass, wrong answers fail."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from conftest import load_solution

from jaxlab.io.config import qwen35_tiny
from jaxlab.lab import bringup
from jaxlab.lab.exercises import nb18


def test_decode_cost_rows_hold_each_kinds_cache_and_a_flat_deltanet_state():
    rows = bringup.decode_cost_vs_context(qwen35_tiny(), (16, 64), repeats=1)
    assert {(r["kind"], r["context"]) for r in rows} == {(k, n) for k in bringup.KINDS for n in (16, 64)}
    kv = {r["context"]: r["cache_bytes"] for r in rows if r["kind"] == "full_attention"}
    state = {r["context"]: r["cache_bytes"] for r in rows if r["kind"] == "linear_attention"}
    assert kv[64] == 4 * kv[16]  # the KV cache grows with the context
    assert state[64] == state[16] > 0  # the DeltaNet state does not
    assert all(r["ms"] > 0 for r in rows) and bringup.growth(rows, "full_attention") > 0
    fig = bringup.plot_decode_cost(rows, "tiny")
    assert len(fig.axes) == 2 and len(fig.axes[0].lines) == 2
    plt.close(fig)  # a worker's figures add up across test files (matplotlib warns past 20)


def test_prefill_forms_times_each_form_and_names_the_faster():
    rows = bringup.prefill_forms(qwen35_tiny(), (20,), repeats=1)
    assert [r["form"] for r in rows] == ["recurrent", "chunked"]
    form, times = bringup.faster_form(rows, 20)
    assert form in ("recurrent", "chunked") and times >= 1


def test_the_solutions_pass():
    s = load_solution("18_bringing_up_a_model")
    assert nb18.check_delta_step(s.my_delta_step)
    assert nb18.check_conv_step(s.my_conv_step)
    assert nb18.check_decay_matrix(s.my_decay_matrix)


def test_wrong_answers_fail():
    def no_decay_on_the_read(S, q, k, v, g, beta):  # the correction read from the state before it decays
        delta = beta * (v - S.T @ k)
        S = np.exp(g) * S + np.outer(k, delta)
        return S.T @ q, S

    def window_newest_first(state, x, w):  # the taps applied in the wrong order
        window = np.concatenate([x[None], state[::-1]], axis=0)
        y = np.sum(w.T * window, axis=0)
        return y / (1 + np.exp(-y)), np.concatenate([state, x[None]])[1:]

    assert not nb18.check_delta_step(no_decay_on_the_read)
    assert not nb18.check_conv_step(window_newest_first)
    assert not nb18.check_decay_matrix(lambda g: np.exp(np.cumsum(g))[:, None] * np.ones(len(g)))
