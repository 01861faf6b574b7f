"""Notebook 17's helpers (a grammar walked token by token, its plot, the tokens that cross a JSON boundary) and its
exercises' checkers: the solutions pass, wrong answers fail."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import byte_tokenizer, load_solution

from jaxlab.engine.grammar import Constraint, allow_all
from jaxlab.lab import structured
from jaxlab.lab.exercises import nb17

V = 263  # the tiny model's vocabulary, which conftest's byte tokenizer spells


@pytest.fixture(scope="module")
def tok():
    return byte_tokenizer()


def test_allowed_count_ignores_the_padding_bits_past_the_vocabulary():
    assert structured.allowed_count(allow_all(1, V)[0], V) == V
    row = np.zeros(9, np.int32)
    row[0], row[8] = 0b1011, np.int32(-1)  # tokens 0, 1, 3 and 256..262 (bits past 263 are padding)
    assert structured.allowed_count(row, V) == 3 + 7


def test_walk_counts_what_the_grammar_allows_at_each_step(tok):
    steps = structured.walk(Constraint.regex("(yes|no)!"), tok, V, tok.encode("no!"))
    assert [p for p, _ in steps] == ["no", "!"]  # "no" is one token (a merge of the byte tokenizer)
    assert steps[1][1] == 1  # after "no", only "!"
    assert steps[0][1] >= 2  # "y", "n", "no" at least
    with pytest.raises(ValueError, match="breaks the grammar"):
        structured.walk(Constraint.regex("(yes|no)!"), tok, V, tok.encode("maybe"))
    fig = structured.plot_allowed(steps, V)
    assert fig.axes[0].get_yscale() == "log" and len(fig.axes[0].patches) == 2


def test_boundary_tokens_are_the_ones_that_join_a_quote_to_more(tok):
    found = structured.boundary_tokens(tok, V)
    assert '{"' in found and '":' in found and '"' not in found


def test_plot_quality_draws_each_setting_for_each_metric():
    import matplotlib

    matplotlib.use("Agg")
    rows = [
        {"weights": w, "schema": sch, "schema_valid": v, "match": 0.1, "field_exact": 0.5}
        for w, sch, v in (("base", False, 0.5), ("base", True, 1.0), ("adapter", True, 1.0))
    ]
    fig = structured.plot_quality(rows)
    ax = fig.axes[0]
    heights = sorted(round(p.get_height(), 6) for p in ax.patches)
    assert len(ax.patches) == 3 * 3 and heights[-1] == 100.0 and heights.count(50.0) == 4
    assert [t.get_text() for t in ax.get_legend().get_texts()][1] == "base, with the schema"


def test_exercise_checkers_pass_the_solutions_and_fail_wrong_answers():
    s = load_solution("17_structured_output")
    assert nb17.check_unpack(s.my_unpack) and nb17.check_mask_logits(s.my_mask_logits)
    assert nb17.check_choice_regex(s.my_choice_regex)
    msb_first = lambda row, vocab: ((np.asarray(row)[:, None] >> np.arange(31, -1, -1)) & 1).reshape(-1)[:vocab] > 0  # noqa: E731
    assert not nb17.check_unpack(msb_first)
    assert not nb17.check_mask_logits(lambda logits, allowed: np.where(allowed, logits, 0.0))
    assert not nb17.check_choice_regex(lambda options: "|".join(options))  # unescaped: "c+" matches "cc"
    assert not nb17.check_choice_regex(lambda options: "(" + "|".join(options))  # not a regex at all
