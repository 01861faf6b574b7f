"""``jaxlab bench --trace``: the trace, the targets on hand-made numbers, and one quick end-to-end run.

No timing is asserted: the ratios are read from the report by people, not by tests."""

from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import pytest

from jaxlab.bench import trace


def test_the_shipped_trace_is_what_make_trace_makes():
    shipped = trace.load_trace(quick=False)
    t = trace.TRACE
    assert shipped == trace.make_trace(0, t["requests"], t["prompt"], t["output"])
    lens = [r["prompt_len"] for r in shipped]
    outs = [r["new_tokens"] for r in shipped]
    assert len(shipped) == 64 and min(lens) >= 16 and max(lens) <= 512 and min(outs) >= 8 and max(outs) <= 256
    assert np.median(outs) < np.mean(outs)  # long-tailed: most short, a few long
    arrivals = [r["arrival"] for r in shipped]
    assert arrivals == sorted(arrivals) and arrivals[0] == 0.0


def test_targets_pass_and_miss_on_hand_made_numbers():
    def serving(ratio_, p99_s, p99_c, kv):
        return {
            "throughput_ratio": ratio_,
            "static": {"ttft_s": {"p99": p99_s}},
            "continuous": {"ttft_s": {"p99": p99_c}, "kv_use": None},  # none waited at the offered load
            "overload": {"kv_use": kv},
        }

    steps = [{"batch": 1, "context": 256, "ratio": 1.1}, {"batch": 32, "context": 1024, "ratio": 1.5}]
    prefix = {"ttft_ratio": 4.0, "identical": True}
    got = {
        t["key"]: t["status"]
        for t in trace.trace_targets({"serving": serving(3.2, 9.0, 3.0, 0.85), "steps": steps, "prefix": prefix})
    }
    assert got == {
        "throughput": "PASS",
        "p99_ttft": "PASS",
        "kv_use": "PASS",
        "paged_b1_256": "PASS",
        "paged_b32_1024": "MISS",
        "prefix_ttft": "PASS",
    }
    bad = trace.trace_targets(
        {"serving": serving(2.9, 3.0, 9.0, 0.2), "steps": [], "prefix": {"ttft_ratio": 5.0, "identical": False}}
    )
    assert [t["status"] for t in bad] == ["MISS", "MISS", "MISS", "MISS"]  # identical tokens are part of the target


@pytest.mark.slow
def test_quick_trace_run(tmp_path, small):
    """The whole --trace report, on the embedded model's first two layers (the recorded run on the whole model:
    benchmarks/)."""
    from jaxlab.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["bench", "--trace", "--quick", "--targets", "--model", small, "--json", str(tmp_path / "t.json")])
    text = out.getvalue()
    assert rc == 0, text
    for part in ("Continuous batching against static", "Paged decode step", "Prefix reuse", "Targets"):
        assert part in text, text
    res = json.loads((tmp_path / "t.json").read_text())
    s = res["serving"]
    assert s["requests"] == trace.QUICK_TRACE["requests"]
    for name in ("static", "continuous"):
        assert s[name]["output_tokens"] == sum(r["new_tokens"] for r in trace.load_trace(quick=True))
        assert s[name]["throughput"] > 0 and s[name]["ttft_s"]["p50"] >= 0
    # admission by memory: more ran at once than static's batch, decoded in the kept row buckets
    assert trace.QUICK_TRACE["max_batch"] < s["most_running"] <= trace.QUICK_TRACE["max_running"]
    assert s["bucket_calls"] and {int(b) for b in s["bucket_calls"]} <= set(s["row_buckets"])
    # the same work offered at twice what the engine served (the quick trace's six may all fit, so none need wait)
    a = s["overload"]
    assert a["offered_tokens_per_s"] == pytest.approx(trace.OVERLOAD * s["continuous"]["throughput"])
    assert a["throughput"] > 0 and a["kv_peak"] > 0 and (a["kv_use"] is None or 0 < a["kv_use"] <= a["kv_peak"])
    assert [(r["batch"], r["context"]) for r in res["steps"]] == [(1, 256)]
    assert (
        res["prefix"]["identical"] and res["prefix"]["on"]["reused_pages"] > 0 == res["prefix"]["off"]["reused_pages"]
    )
    assert res["meta"]["cpu"] and len(res["targets"]) == 4 + len(res["steps"])
    from jaxlab.engine.kernels import cpu as cpu_kernels

    assert res["meta"]["cpu_kernels"] == cpu_kernels.status().reason  # results say whether jaxlab's CPU kernels ran
