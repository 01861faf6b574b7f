"""``jaxlab bench``: the pure helpers on hand-made numbers, and one quick end-to-end run.

No timing is asserted anywhere: the targets are read from the bench output by people, not by tests.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest

from jaxlab import bench
from jaxlab.config import smollm2_135m, tiny

# --------------------------------------------------------------------------------------------------
# Pure helpers
# --------------------------------------------------------------------------------------------------


def test_summarize_median_and_spread():
    s = bench.summarize([3.0, 1.0, 2.0, 10.0])
    assert s["median"] == 2.5 and s["min"] == 1.0 and s["max"] == 10.0 and s["n"] == 4
    assert bench.summarize([5.0]) == {"median": 5.0, "min": 5.0, "max": 5.0, "n": 1, "values": [5.0]}
    assert bench.summarize([])["median"] is None
    # tokens/s from seconds: min and max swap, the median maps through
    t = bench.summary_map(bench.summarize([1.0, 2.0, 4.0]), lambda x: 8 / x)
    assert (t["median"], t["min"], t["max"]) == (4.0, 2.0, 8.0)


def test_fmt_summary():
    assert bench.fmt_summary(bench.summarize([1.0, 2.0, 3.0])) == "2.00 (1.00–3.00)"
    assert bench.fmt_summary(bench.summarize([0.25]), 1e3) == "250"
    assert bench.fmt_summary(None) == "-"


def test_roofline_percentages():
    # 1 GB read per step in 0.1 s at a 20 GB/s ceiling: 10 GB/s achieved = 50 %
    assert bench.bandwidth_roofline_pct(1e9, 0.1, 20e9) == pytest.approx(50.0)
    assert bench.compute_pct(5e9, 0.5, 100e9) == pytest.approx(10.0)
    assert bench.ratio(3.0, 2.0) == 1.5
    assert bench.ratio(1.0, None) is None and bench.ratio(1.0, 0.0) is None


def test_model_flops_and_bytes():
    cfg = smollm2_135m()
    layer_w, head_w = bench.matmul_params(cfg)
    assert layer_w + head_w == cfg.n_params() - cfg.n_layers * 2 * cfg.dim - cfg.dim  # all but the norms
    # prefill ~ 2 x layer weights x tokens, plus attention and one head row
    f = bench.prefill_flops(cfg, 1, 128)
    assert 2 * layer_w * 128 < f < 2 * (layer_w + head_w) * 128
    # attention: query i of T sees i + 1 keys; T = 2 -> 3 query-key pairs
    t = tiny()
    assert bench.attention_flops(t, 1, 2, 0) == 4 * t.n_layers * t.n_heads * t.head_dim * 3
    assert bench.attention_flops(t, 2, 1, 5) == 4 * t.n_layers * t.n_heads * t.head_dim * 2 * 6
    # decode bytes: weights + K/V of the context, linear in batch
    w = 1000.0
    one = bench.decode_step_bytes(w, t, 1, 10, 4)
    assert one == w + 2 * t.n_layers * 10 * t.n_kv_heads * t.head_dim * 4
    assert bench.decode_step_bytes(w, t, 3, 10, 4) - w == 3 * (one - w)
    assert bench.decode_context(128, 128) == 192.0


def test_evaluate_targets_on_hand_made_numbers():
    metrics = {
        "decode_b1_vs_peer": 1.4,  # exactly on the threshold passes
        "decode_b1_bw_pct": 84.9,
        "decode_b32_vs_peer": None,  # not measured
        "prefill_vs_peer": 1.2,
        "prefill_matmul_pct": 80.0,
        "compile_max_s": 3.5,
        "ttft_warm_s": 0.4,
        "speculative_copy_speedup": 0.0,  # tokens not identical -> 0 -> MISS
    }
    got = {t["key"]: t["status"] for t in bench.evaluate_targets(metrics)}
    assert got == {
        "decode_b1_vs_peer": "PASS", "decode_b1_bw_pct": "MISS", "decode_b32_vs_peer": "n/a",
        "prefill_vs_peer": "PASS", "prefill_matmul_pct": "PASS", "compile_max_s": "MISS", "ttft_warm_s": "PASS",
        "speculative_copy_speedup": "MISS",
    }
    assert all(t["status"] == "n/a" for t in bench.evaluate_targets({}))
    assert bench.evaluate_targets({"ttft_warm_s": float("nan")})[-1]["status"] == "n/a"
    lines = bench.target_lines(bench.evaluate_targets(metrics))
    assert len(lines) == len(bench.TARGETS)
    assert lines[0].startswith("PASS") and "1.40x" in lines[0]
    assert lines[1].startswith("MISS") and "84.9 %" in lines[1]
    assert lines[2].startswith("n/a") and "not measured" in lines[2]


def test_copy_heavy_speedup_counts_only_identical_tokens():
    rows = [{"task": "copy-heavy", "method": "ngram", "speed-up": 1.9, "identical": "yes"},
            {"task": "open-ended", "method": "ngram", "speed-up": 1.0, "identical": "yes"}]
    assert bench._copy_heavy_speedup(rows) == 1.9
    rows[0]["identical"] = "no"
    assert bench._copy_heavy_speedup(rows) == 0.0
    assert bench._copy_heavy_speedup([]) is None


def test_headline_metrics_pick_the_right_numbers():
    res = {
        "decode": [{"batch": 1, "vs_peer": 2.0, "bw_roofline_pct": 70.0}, {"batch": 32, "vs_peer": 1.1, "bw_roofline_pct": 5.0}],
        "prefill": {"vs_peer": 0.9, "matmul_ceiling_pct": 40.0},
        "compile": [{"function": "prefill", "seconds": 2.0, "dtype": "float32"},
                    {"function": "decode", "seconds": 2.5, "dtype": "float32"},
                    {"function": "decode", "seconds": 9.0, "dtype": "bfloat16"},  # a stage, not a target
                    {"function": "on-device loop", "seconds": 8.0, "dtype": "float32"}],
        "ttft": {"warm": {"median": 0.7}},
        "speculative": [{"task": "copy-heavy", "method": "ngram", "speed-up": 1.5, "identical": "yes"}],
    }
    m = bench.headline_metrics(res)
    assert m == {"decode_b1_vs_peer": 2.0, "decode_b1_bw_pct": 70.0, "decode_b32_vs_peer": 1.1,
                 "prefill_vs_peer": 0.9, "prefill_matmul_pct": 40.0, "compile_max_s": 2.5, "ttft_warm_s": 0.7,
                 "speculative_copy_speedup": 1.5}
    assert bench.headline_metrics({"decode": [], "compile": [], "ttft": None})["ttft_warm_s"] is None


def test_first_divergence():
    assert bench.first_divergence([[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 5]]) is None
    assert bench.first_divergence([[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 6]]) == (1, 1)
    assert bench.first_divergence([[1, 2]], [[1, 2, 3]]) == (0, 2)
    assert bench.divergence_text(None, 8) == "identical (8 rows)"
    assert bench.divergence_text((3, 17), 8) == "first divergence at row 3, token 17"


def test_make_prompts_equal_length_distinct_rows():
    ids = list(range(1000))
    rows = bench.make_prompts(ids, 128, 128)
    assert len(rows) == 128 and all(len(r) == 128 for r in rows)
    assert len({tuple(r) for r in rows}) == 128
    short = bench.make_prompts([7, 8, 9], 2, 5)  # repeated when too short
    assert all(len(r) == 5 for r in short)


def test_resolve_options_quick_and_overrides():
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    o = bench.resolve_options(parser.parse_args(["--quick", "--reps", "2"]))
    assert o["batch_sizes"] == (1, 2) and o["new_tokens"] == 8 and o["prompt_len"] == 16 and o["reps"] == 2
    o = bench.resolve_options(parser.parse_args(["--batch-sizes", "32,1,8", "--no-stages", "--no-peer"]))
    assert o["batch_sizes"] == (1, 8, 32) and o["new_tokens"] == 128 and not o["stages"] and not o["peer"]
    with pytest.raises(SystemExit):
        parser.parse_args(["--batch-sizes", "0,1"])


# --------------------------------------------------------------------------------------------------
# One quick end-to-end run (tiny sizes; needs the embedded model and the peer)
# --------------------------------------------------------------------------------------------------


@pytest.mark.reference
@pytest.mark.slow
def test_bench_quick_end_to_end(tmp_path, capsys, monkeypatch, request, gguf_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from jaxlab.cli import main

    # the session's reference model is the peer bench would load (transformers, float32, same GGUF): reuse it
    model, _ = request.getfixturevalue("reference")
    monkeypatch.setitem(bench._PEERS, str(Path(gguf_path).resolve()), model)

    out_json, out_png = tmp_path / "bench.json", tmp_path / "roofline.png"
    rc = main(["bench", "--quick", "--no-ttft", "--targets", "--json", str(out_json), "--plot", str(out_png)])
    text = capsys.readouterr().out
    assert rc == 0, text

    # the table has every row
    for label in bench.ALWAYS_ROWS + bench.STAGE_ROWS + ("transformers", "decode b1", "decode b2"):
        assert label in text, f"row {label!r} missing from:\n{text}"
    for header in ("ceilings", "threads", "versions", "Prefill", "Decode", "Stages", "Compile", "Memory", "Targets"):
        assert header in text
    assert text.count("PASS") + text.count("MISS") + text.count("n/a") >= len(bench.TARGETS)

    # the JSON has the keys
    res = json.loads(out_json.read_text())
    for key in ("meta", "options", "ceilings", "peer", "prefill", "decode", "stages", "compile", "memory", "metrics", "targets"):
        assert key in res
    assert res["ceilings"]["bandwidth_bytes_per_s"] > 0 and res["ceilings"]["matmul_flops_per_s"] > 0
    assert [d["batch"] for d in res["decode"]] == [1, 2]
    assert {s["stage"] for s in res["stages"]} == set(bench.STAGE_ROWS)
    assert {"prefill", "decode"} <= {c["function"] for c in res["compile"]}
    assert res["meta"]["threads"]["torch_threads"] >= 1
    assert res["ttft"] is None
    spec_rows = {(r["task"], r["method"]) for r in res["speculative"]}
    assert ("copy-heavy", "ngram") in spec_rows and ("open-ended", "ngram") in spec_rows
    assert all(r["identical"] == "yes" for r in res["speculative"])
    assert "Speculative decoding" in text

    # the greedy-equality check ran against the peer, for every batch size
    assert res["peer"]["enabled"]
    for d in res["decode"]:
        assert d["tokens_identical"] in (True, False)
        assert ("identical" in d["greedy_check"]) or ("first divergence" in d["greedy_check"])
        assert d["recompiled_reps"] == 0
        assert math.isfinite(d["bw_roofline_pct"])
    # float32 stages decode the same tokens as the jit + cache loop
    for s in res["stages"]:
        if s["stage"] != "bfloat16 (jit + KV cache)":
            assert s["tokens_match"].startswith("yes"), s

    # the plot is a PNG
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
