"""``jaxlab bench --encoder``: the verdict and the target on hand-made rows, and one tiny run side by side with
PyTorch eager (the numbers are the bench's to report, not the test's to assert)."""

from __future__ import annotations

import argparse
import io

import pytest

from jaxlab.bench import encoder as bench_encoder


def row(b, t, up_eager, up_compile=None):
    speed = {"PyTorch eager": up_eager} | ({"torch.compile": up_compile} if up_compile else {})
    tps = {"jaxlab (jit)": 1000.0, "PyTorch eager": 1000.0 / up_eager}
    return {"batch": b, "length": t, "speedup": speed, "tokens_per_s": tps, "failed": {}, "max_abs_vs_eager": 1e-7}


def test_verdict_is_graded_by_shape():
    v = bench_encoder.encoder_verdict({"rows": [row(1, 32, 3.0), row(32, 128, 1.1)]})
    assert v["verdict"] == "HOLDS ONLY WHEN" and v["holds_at"] == [(1, 32)]
    assert v["target"]["status"] == "PASS" and v["target"]["measured"] == pytest.approx(1.1)
    assert bench_encoder.encoder_verdict({"rows": [row(1, 32, 2.5), row(32, 128, 2.0)]})["verdict"] == "HOLDS"
    v = bench_encoder.encoder_verdict({"rows": [row(1, 32, 0.5), row(32, 128, 0.9)]})
    assert v["verdict"] == "DOES NOT HOLD" and v["target"]["status"] == "MISS"
    text = bench_encoder.render_encoder({"rows": [row(32, 128, 0.9)], "verdict": v})
    assert "0.90x" in text and "DOES NOT HOLD" in text and "MISS (0.90x)" in text


@pytest.mark.reference
def test_a_tiny_run_side_by_side(monkeypatch):
    monkeypatch.setattr(bench_encoder, "QUICK_SHAPES", ((2, 16),))
    out = io.StringIO()
    args = argparse.Namespace(quick=True, reps=1, no_torch_compile=True, json=None)
    assert bench_encoder.run_encoder(args, out) == 0
    text = out.getvalue()
    assert "    2 x 16" in text and "Claim: compiled JAX BERT runs 2-3x faster than PyTorch" in text
    diff = float(text.split("\n")[3].split()[-1])
    assert diff <= 1e-5  # the same embeddings on both sides
