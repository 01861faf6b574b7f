"""jaxlab.lab.speculation's figures for notebook 10 (the measurements are tested in tests/engine/test_speculative.py).

Hermetic: a hand-made run and hand-made step costs; nothing loads a model."""

from __future__ import annotations

from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")

from jaxlab.lab import speculation  # noqa: E402


def test_plot_rounds_draws_kept_rejected_and_plain_rounds():
    # rounds: (drafts or None, the model's tokens, accepted count, the batch's count)
    run = SimpleNamespace(k=2, rounds=[([5, 6], [5, 7, 9], 1, 1), (None, [4], 0, 0)])
    ax = speculation.plot_rounds(run, None)
    assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel() == "round"
    assert [t.get_text() for t in ax.get_yticklabels()] == ["round 1", "round 2"]
    colours = [p.get_facecolor()[:3] for p in ax.patches]
    assert len(ax.patches) == 2 + 1 + 1 + 1  # two drafts and the model's token; a plain step and its token
    assert colours[0] != colours[1]  # the kept draft and the first wrong one


def test_plot_speedup_draws_the_cost_model_and_the_measured_points():
    costs = {"decode_s": 0.04, "verify_s": 0.08, "draft_s": 0.06}
    rows = [{"task": "copy", "method": "ngram", "tokens/call": 3.0, "speed-up": 1.6}]
    ax = speculation.plot_speedup(costs, 4, rows)
    assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert "ideal: verify costs 1 decode step" in lines
    ngram = next(line for label, line in lines.items() if label.startswith("n-gram"))
    assert abs(ngram.get_ydata()[-1] - 5 / 2.0) < 1e-9  # 5 tokens per call over a verify of 2 decode steps
