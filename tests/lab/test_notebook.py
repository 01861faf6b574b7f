"""verdict() grades a measured value against its claim's rule and refuses what was not measured; show_source."""

from __future__ import annotations

import numpy as np
import pytest

from jaxlab.lab import claims
from jaxlab.lab.claims import Claim
from jaxlab.lab.notebook import show_source, unmeasured, verdict


@pytest.fixture
def speedup(monkeypatch):
    monkeypatch.setitem(
        claims.CLAIMS,
        "t_speedup",
        Claim(
            "jit is 2-3x faster",
            "a test",
            "speed-up of jit over eager",
            at_least=2.0,
            condition="the step is small ops",
            reason="the claim's own lower figure",
        ),
    )
    monkeypatch.setitem(
        claims.CLAIMS,
        "t_compiles",
        Claim("it recompiles", "a test", "compiles", unit="", at_most=0, reason="none at all"),
    )
    return "t_speedup"


def test_grades(speedup, capsys):
    assert verdict(speedup, 2.5).word == "HOLDS"
    assert verdict(speedup, np.float32(1.2)).word == "DOES NOT HOLD"
    v = verdict(speedup, {"one matmul": 1.1, "decode step": 25.0}, because="dispatch")
    assert v.word == "HOLDS ONLY WHEN" and "HOLDS ONLY WHEN the step is small ops" in v.text
    assert verdict(speedup, {"a": 3, "b": 4}).word == "HOLDS"
    assert verdict(speedup, {"a": 1, "b": 1.5}).word == "DOES NOT HOLD"
    assert verdict("t_compiles", 0).word == "HOLDS" and verdict("t_compiles", 3).word == "DOES NOT HOLD"
    out = capsys.readouterr().out
    assert 'Claim: "jit is 2-3x faster" (a test)' in out and "needs >= 2x" in out and "1.1x  short by 0.9x" in out
    assert "because dispatch" in out and "25x  meets by 23x" in out
    assert "Threshold >= 2x: the claim's own lower figure" in out and "2.5x (needs >= 2x: meets by 0.5x)" in out
    assert "0 (needs <= 0: meets (at the bound))" in out


def test_holds_only_when_names_the_settings_that_met_it(speedup):
    """The condition is the claim's general words; the settings that met the threshold are this run's finding (on
    other hardware others meet it), so the verdict lists them instead of a fixed string."""
    v = verdict(speedup, {"one matmul": 1.1, "decode step": 25.0, "prefill": 2.2})
    assert v.text.endswith("HOLDS ONLY WHEN the step is small ops (met by: decode step; prefill)")
    v = verdict(speedup, {"one matmul": 2.1, "decode step": 1.0})
    assert v.text.endswith("(met by: one matmul)")


def test_a_verdict_says_where_its_numbers_come_from(speedup):
    assert "Verdict on this machine: HOLDS" in verdict(speedup, 2.5).text
    v = verdict(speedup, 2.5, source="stored run: Some CPU, 2 CPUs, 2026-12-05")
    assert "Verdict (stored run: Some CPU, 2 CPUs, 2026-12-05): HOLDS" in v.text and "on this machine" not in v.text
    with pytest.raises(TypeError, match="label"):
        verdict(speedup, 2.5, source={"cpu": "x"})


def test_refuses_what_was_not_measured(speedup):
    with pytest.raises(TypeError, match="got a bool"):
        verdict(speedup, True)
    with pytest.raises(TypeError, match="got a bool"):
        verdict(speedup, {"a": np.bool_(True)})
    with pytest.raises(TypeError, match="must be a number"):
        verdict(speedup, "fast")
    with pytest.raises(ValueError, match="NaN"):
        verdict(speedup, float("nan"))
    with pytest.raises(KeyError, match="claims.py"):
        verdict("no_such_claim", 1.0)
    with pytest.raises(ValueError, match="exactly one"):
        Claim("q", "s", "m", reason="r")
    with pytest.raises(ValueError, match="reason"):
        Claim("q", "s", "m", at_least=1)


def test_a_claim_holding_in_some_settings_needs_its_condition(monkeypatch):
    monkeypatch.setitem(claims.CLAIMS, "t_bare", Claim("q", "s", "m", at_least=1, reason="r"))
    with pytest.raises(ValueError, match="condition"):
        verdict("t_bare", {"a": 0, "b": 2})


def test_unmeasured(speedup, capsys):
    assert unmeasured(speedup, "one device").word == "NOT MEASURABLE HERE"
    assert "because one device" in capsys.readouterr().out


def test_show_source_names_the_file_and_cuts_long_sources(capsys):
    from jaxlab.lab.anatomy import tree_summary

    lines = show_source(tree_summary, max_lines=3).splitlines()
    assert lines[0].startswith("# jaxlab/lab/anatomy.py, line ") and lines[1].startswith("def tree_summary")
    assert "more lines" in lines[-1] and len(lines) == 5


def test_show_source_of_a_jitted_function_shows_the_python_it_wraps(capsys):
    from jaxlab.train.step import train_step

    assert "def train_step" in show_source(train_step, max_lines=2)
