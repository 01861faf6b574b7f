"""``jaxlab bench``: the pure helpers on hand-made numbers, and one quick end-to-end run.

No timing is asserted anywhere: the targets are read from the bench output by people, not by tests.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import io
import json
import math
from pathlib import Path

import jax
import pytest
from conftest import share_loads

from jaxlab import bench
from jaxlab.bench import (
    costmodel,
    fmt,
    options,
    prompts,
    quantreport,
    quantrows,
    report,
    speculative,
    stats,
    targets,
    ttft,
)
from jaxlab.io.config import smollm2_135m, tiny

# --------------------------------------------------------------------------------------------------
# Pure helpers
# --------------------------------------------------------------------------------------------------


def test_summarize_median_and_spread():
    s = stats.summarize([3.0, 1.0, 2.0, 10.0])
    assert s["median"] == 2.5 and s["min"] == 1.0 and s["max"] == 10.0 and s["n"] == 4
    assert stats.summarize([5.0]) == {"median": 5.0, "min": 5.0, "max": 5.0, "n": 1, "values": [5.0]}
    assert stats.summarize([])["median"] is None
    # tokens/s from seconds: min and max swap, the median maps through
    t = stats.summary_map(stats.summarize([1.0, 2.0, 4.0]), lambda x: 8 / x)
    assert (t["median"], t["min"], t["max"]) == (4.0, 2.0, 8.0)


def test_fmt_summary():
    assert fmt.fmt_summary(stats.summarize([1.0, 2.0, 3.0])) == "2.00 (1.00–3.00)"
    assert fmt.fmt_summary(stats.summarize([0.25]), 1e3) == "250"
    assert fmt.fmt_summary(None) == "-"


def test_roofline_percentages():
    # 1 GB read per step in 0.1 s at a 20 GB/s ceiling: 10 GB/s achieved = 50 %
    assert costmodel.bandwidth_roofline_pct(1e9, 0.1, 20e9) == pytest.approx(50.0)
    assert costmodel.compute_pct(5e9, 0.5, 100e9) == pytest.approx(10.0)
    assert stats.ratio(3.0, 2.0) == 1.5
    assert stats.ratio(1.0, None) is None and stats.ratio(1.0, 0.0) is None


def test_published_peaks_beside_the_measured_ceilings():
    from jaxlab.tools.hardware import CHIPS

    assert costmodel.published_peaks(None) is None
    pub = costmodel.published_peaks(CHIPS["TPU v5e"])
    assert pub["chip"] == "TPU v5e" and pub["flops_per_s"] == 197e12 and pub["bandwidth_bytes_per_s"] == 819e9
    assert costmodel.published_peaks(CHIPS["TPU v3"])["flops_per_s"] == 123e12 / 2  # per jax device (TensorCore)
    ceil = {"bandwidth_bytes_per_s": 700e9, "matmul_flops_per_s": 98.5e12, "matmul_bf16_flops_per_s": 177.3e12}
    line = report.published_line(pub, ceil, "TPU v5 lite")
    assert "197 TFLOP/s bfloat16" in line and "819 GB/s" in line
    assert "85.5 % of it" in line and "bfloat16 matmul 90.0 %" in line and "float32 matmul 50.0 %" in line
    assert report.published_line(None, ceil, "cpu").startswith("none for a CPU")
    # the decode rows get a % of the published bandwidth beside the % of the measured one
    res = {
        "prefill": {"flops_model": 1e12, "ours_s": {"median": 0.1}, "peer_s": None},
        "decode": [{"ours_step_s": {"median": 0.001}, "bytes_per_step": 0.4095e9, "flops_per_step": 1e9}],
    }
    costmodel.add_rooflines(res, dict(ceil, published=pub))
    d = res["decode"][0]
    assert d["bw_roofline_pct"] == pytest.approx(100 * 409.5 / 700) and d["published_bw_pct"] == pytest.approx(50.0)
    assert res["prefill"]["published_flops_pct"] == pytest.approx(100 * 10e12 / 197e12)
    costmodel.add_rooflines(res, dict(ceil, published=None))
    assert res["decode"][0]["published_bw_pct"] is None


def test_ttft_figures_from_another_backend_are_labelled():
    assert ttft.ttft_note(["tpu"], "tpu") is None
    assert ttft.ttft_note(["cpu"], "tpu") == "CPU figure: the TPU is held by this process"
    assert ttft.ttft_note(["cpu", "cpu"], "cpu") is None


def test_model_flops_and_bytes():
    cfg = smollm2_135m()
    layer_w, head_w = costmodel.matmul_params(cfg)
    assert layer_w + head_w == cfg.n_params() - cfg.n_layers * 2 * cfg.dim - cfg.dim  # all but the norms
    # prefill ~ 2 x layer weights x tokens, plus attention and one head row
    f = costmodel.prefill_flops(cfg, 1, 128)
    assert 2 * layer_w * 128 < f < 2 * (layer_w + head_w) * 128
    # attention: query i of T sees i + 1 keys; T = 2 -> 3 query-key pairs
    t = tiny()
    assert costmodel.attention_flops(t, 1, 2, 0) == 4 * t.n_layers * t.n_heads * t.head_dim * 3
    assert costmodel.attention_flops(t, 2, 1, 5) == 4 * t.n_layers * t.n_heads * t.head_dim * 2 * 6
    # decode bytes: weights + K/V of the context, linear in batch
    w = 1000.0
    one = costmodel.decode_step_bytes(w, t, 1, 10)
    assert one == w + 2 * t.n_layers * 10 * t.n_kv_heads * t.head_dim * 4
    assert costmodel.decode_step_bytes(w, t, 3, 10) - w == 3 * (one - w)
    assert costmodel.decode_context(128, 128) == 192.0


def test_evaluate_targets_on_hand_made_numbers():
    metrics = {
        "quant_b32_best": 1.99,
        "quant_b32_best_label": "w8a8",
        "quant_b1_best": 1.3,
        "quant_b1_best_label": "int8 + int8 KV",
        "decode_b1_vs_peer": 1.4,  # exactly on the threshold passes
        "decode_b1_bw_pct": 84.9,
        "decode_b32_vs_peer": None,  # not measured
        "prefill_vs_peer": 1.2,
        "prefill_matmul_pct": 80.0,
        "compile_max_s": 3.5,
        "ttft_warm_s": 0.4,
        "speculative_copy_speedup": 0.0,  # tokens not identical -> 0 -> MISS
        "quant_b32_vs_llama": 1.02,
        "int8_b1_vs_llama_q4_1": 0.54,
        "int8_b1_read_pct": None,  # no read ceiling (another backend)
        "quant_compile_max_s": 2.9,
    }
    got = {t["key"]: t["status"] for t in targets.evaluate_targets(metrics)}
    assert got == {
        "decode_b1_vs_peer": "PASS",
        "decode_b1_bw_pct": "MISS",
        "decode_b32_vs_peer": "n/a",
        "prefill_vs_peer": "PASS",
        "prefill_matmul_pct": "PASS",
        "compile_max_s": "MISS",
        "ttft_warm_s": "PASS",
        "speculative_copy_speedup": "MISS",
        "quant_b32_best": "MISS",
        "quant_b1_best": "PASS",
        "quant_b32_vs_llama": "PASS",
        "int8_b1_vs_llama_q4_1": "MISS",
        "int8_b1_read_pct": "n/a",
        "quant_compile_max_s": "PASS",
    }
    assert all(t["status"] == "n/a" for t in targets.evaluate_targets({}))
    nan = {t["key"]: t["status"] for t in targets.evaluate_targets({"ttft_warm_s": float("nan")})}
    assert nan["ttft_warm_s"] == "n/a"
    lines = targets.target_lines(targets.evaluate_targets(metrics))
    assert len(lines) == len(targets.TARGETS)
    assert lines[0].startswith("PASS") and "1.40x" in lines[0]
    assert lines[1].startswith("MISS") and "84.9 %" in lines[1]
    assert lines[2].startswith("n/a") and "not measured" in lines[2]
    assert lines[-5] == "PASS  quantized decode batch 1 >= 1.3x float32 (best format): measured 1.30x (int8 + int8 KV)"
    assert lines[-4] == "PASS  quantized decode batch 32 >= 1.0x llama.cpp (fastest of each): measured 1.02x"


def test_copy_heavy_speedup_counts_only_identical_tokens():
    rows = [
        {"task": "copy-heavy", "method": "ngram", "speed-up": 1.9, "identical": "yes"},
        {"task": "open-ended", "method": "ngram", "speed-up": 1.0, "identical": "yes"},
    ]
    assert speculative.copy_heavy_speedup(rows) == 1.9
    rows[0]["identical"] = "no"
    assert speculative.copy_heavy_speedup(rows) == 0.0
    assert speculative.copy_heavy_speedup([]) is None


def test_headline_metrics_pick_the_right_numbers():
    res = {
        "decode": [
            {"batch": 1, "vs_peer": 2.0, "bw_roofline_pct": 70.0},
            {"batch": 32, "vs_peer": 1.1, "bw_roofline_pct": 5.0},
        ],
        "prefill": {"vs_peer": 0.9, "matmul_ceiling_pct": 40.0},
        "compile": [
            {"function": "prefill", "seconds": 2.0, "dtype": "float32"},
            {"function": "decode", "seconds": 2.5, "dtype": "float32"},
            {"function": "decode", "seconds": 9.0, "dtype": "bfloat16"},  # a stage, not a target
            {"function": "on-device loop", "seconds": 8.0, "dtype": "float32"},
            {"function": "decode step (quant rows)", "seconds": 2.8, "dtype": "int8 + int8 KV"},
            {"function": "decode step (quant rows)", "seconds": 1.2, "dtype": "int8"},
        ],
        "ttft": {"warm": {"median": 0.7}},
        "speculative": [{"task": "copy-heavy", "method": "ngram", "speed-up": 1.5, "identical": "yes"}],
    }
    m = targets.headline_metrics(res)
    assert m == {
        "decode_b1_vs_peer": 2.0,
        "decode_b1_bw_pct": 70.0,
        "decode_b32_vs_peer": 1.1,
        "prefill_vs_peer": 0.9,
        "prefill_matmul_pct": 40.0,
        "compile_max_s": 2.5,
        "ttft_warm_s": 0.7,
        "speculative_copy_speedup": 1.5,
        "quant_b32_best": None,
        "quant_b32_best_label": None,
        "quant_b1_best": None,
        "quant_b1_best_label": None,
        "quant_b32_vs_llama": None,
        "quant_b32_vs_llama_label": None,
        "int8_b1_vs_llama_q4_1": None,
        "int8_b1_read_pct": None,
        "quant_compile_max_s": 2.8,  # the slowest quantized decode program
    }
    assert targets.headline_metrics({"decode": [], "compile": [], "ttft": None})["ttft_warm_s"] is None
    # a --quant-only run: no float32 rows, quantized rows only
    m = targets.headline_metrics(
        {"prefill": None, "decode": [], "compile": [], "ttft": None, "quant": {"rows": QUANT_ROWS}}
    )
    assert (m["quant_b1_best"], m["quant_b1_best_label"]) == (1.8, "int8")
    assert (m["quant_b32_best"], m["quant_b32_best_label"]) == (1.4, "w8a8")
    assert m["decode_b1_vs_peer"] is None and m["prefill_vs_peer"] is None
    # beside llama.cpp (--llama-bench; the batches as JSON keys after a round trip) and the read ceiling
    rows = [{**r, "read_roofline_pct": 40.0 + r["batch"]} for r in QUANT_ROWS]
    vs = {"int8_vs_q4_1": 0.6, "batched": {"32": {"ratio": 1.1, "best_jaxlab": ["int8"], "best_llama_cpp": ["Q4_1"]}}}
    m = targets.headline_metrics({"decode": [], "compile": [], "quant": {"rows": rows, "llama_cpp_vs_jaxlab": vs}})
    assert (m["quant_b32_vs_llama"], m["quant_b32_vs_llama_label"]) == (1.1, "jaxlab int8, llama.cpp Q4_1")
    assert m["int8_b1_vs_llama_q4_1"] == 0.6 and m["int8_b1_read_pct"] == 41.0


# --------------------------------------------------------------------------------------------------
# Quantization rows: pure helpers on hand-made numbers
# --------------------------------------------------------------------------------------------------


def qrow(weights, kv, batch, ratio, ms=10.0):
    return {
        "weights": weights,
        "kv_cache": kv,
        "label": quantrows.quant_label(weights, kv),
        "batch": batch,
        "vs_float32": ratio,
        "step_s": stats.summarize([ms / 1e3]),
        "tokens_per_s": stats.summarize([batch / ms * 1e3]),
        "bytes_per_step": 1e8,
        "bw_roofline_pct": 12.5,
        "compile_s": 1.5,
    }


QUANT_ROWS = [
    qrow("float32", "float32", 1, 1.0),
    qrow("int8", "float32", 1, 1.8),
    qrow("w8a8", "float32", 1, 1.7),
    qrow("int4", "int8", 1, 0.4),
    qrow("float32", "float32", 32, 1.0),
    qrow("int8", "float32", 32, 0.9),
    qrow("w8a8", "float32", 32, 1.4),
    qrow("int4", "int8", 32, 0.4),
]


def test_crossover_reads_both_directions():
    assert quantrows.crossover({1: 1.8, 8: 1.2, 32: 0.9}) == {
        "pays_at": [1, 8],
        "from": None,
        "text": "up to b8 (loses from b32)",
    }
    assert quantrows.crossover({1: 0.8, 8: 1.1, 32: 1.6}) == {"pays_at": [8, 32], "from": 8, "text": "from b8"}
    assert quantrows.crossover({1: 1.1, 8: 1.2})["text"] == "at every batch measured"
    assert quantrows.crossover({1: 1.1, 8: 1.2})["from"] == 1
    assert quantrows.crossover({1: 0.5, 8: 1.0})["text"] == "never (<= 1x at every batch)"  # exactly 1x does not pay
    assert quantrows.crossover({1: 1.5, 8: 0.9, 32: 1.2}) == {"pays_at": [1, 32], "from": 32, "text": "at b1, b32"}
    assert quantrows.crossover({1: None})["text"] == "not measured"


def test_crossover_rows_and_best_format():
    rows = quantrows.crossover_rows(QUANT_ROWS)
    assert [r["label"] for r in rows] == ["int8", "w8a8", "int4 + int8 KV"]  # the float32 baseline is not a row
    assert rows[0]["ratios"] == {1: 1.8, 32: 0.9} and rows[0]["text"] == "up to b1 (loses from b32)"
    assert rows[1]["text"] == "at every batch measured" and rows[2]["pays_at"] == []
    assert quantrows.best_at_batch(QUANT_ROWS, 1)["label"] == "int8"
    assert quantrows.best_at_batch(QUANT_ROWS, 32)["label"] == "w8a8"
    assert quantrows.best_at_batch(QUANT_ROWS, 8) is None


def test_format_names_mirror_jaxlab_quant():
    from jaxlab import quant

    # the command line offers exactly the formats jaxlab.quant has
    assert options.QUANT_FORMATS == quant.FORMATS and options.KV_FORMATS == quant.KV_FORMATS


def test_options_as_json_keep_the_report_schema():
    """The "options" of the JSON report: the same keys in the same order as before the options became a dataclass."""
    o = bench.resolve_options(argparse.Namespace(quick=True))
    assert list(o.as_json()) == [
        *options.DEFAULTS,
        *("quick", "float", "peer", "ttft", "stages", "speculative", "quant", "quant_formats", "quant_kv"),
        *("quality", "llama_bench", "model", "attention", "targets", "json", "plot"),
    ]
    assert o.as_json()["batch_sizes"] == [1, 2] and o.as_json()["quant_formats"] == list(options.QUANT_FORMATS)
    assert dataclasses.replace(o, reps=4).reps == 4 and o.reps == 1  # frozen: change by copying


def test_ttft_child_runs_from_the_repository_root():
    """The fresh-process child is ``python -m jaxlab.bench --ttft-child`` started in ttft.ROOT."""
    import jaxlab

    assert ttft.ROOT == Path(jaxlab.__file__).resolve().parents[1]
    assert (ttft.ROOT / "jaxlab" / "bench" / "__main__.py").exists()
    with pytest.raises(SystemExit):
        ttft.child_main([])  # --ttft-child is required


def test_kv_bytes_come_from_the_engine_formula():
    from jaxlab.engine.kvcache import cache_bytes, init_cache

    t = tiny()
    # the K/V part of a decode step is the engine's cache_bytes at the mean context, in the cache's format
    for kv in ("float32", "int8"):
        assert costmodel.decode_step_bytes(0, t, 2, 10, kv) == cache_bytes(t, 2, 10, kv)
        assert costmodel.decode_step_bytes(0, t, 2, 10.5, kv) == pytest.approx(cache_bytes(t, 2, 10.5, kv))
        assert cache_bytes(t, 2, 16, kv) == init_cache(t, 2, 16, kv).nbytes()
    assert costmodel.decode_step_bytes(0, t, 2, 10, "int8") == 2 * t.n_layers * 2 * 10 * t.n_kv_heads * (t.head_dim + 4)
    assert costmodel.prefill_bytes(100, t, 1, 10) == 100 + cache_bytes(t, 1, 10)


def quality_rows(**status):
    """A quality report's rows: every variant PASS unless named in ``status`` (label -> status)."""
    out = []
    for w, kv in (("float32", "float32"), ("int8", "float32"), ("w8a8", "float32"), ("int4", "int8")):
        label = quantrows.quant_label(w, kv)
        st = status.get(label, "PASS")
        out.append(
            {
                "label": label,
                "weights": w,
                "kv_cache": kv,
                "ppl_increase_pct": 0.5 if st == "PASS" else 3.0,
                "greedy_agreement": 0.95 if st == "PASS" else 0.8,
                "status": st,
            }
        )
    return {"rows": out}


def test_speed_targets_are_linked_to_quality():
    no_quality = {t["key"]: t for t in targets.speed_quality_targets(QUANT_ROWS, None)}
    # b32: w8a8 reaches only 1.4x < 2x; b1: int8 1.8x and w8a8 1.7x meet 1.3x
    assert no_quality["quant_b32_best_quality"]["status"] == "n/a"
    assert "no format met the speed target" in no_quality["quant_b32_best_quality"]["note"]
    assert no_quality["quant_b1_best_quality"]["status"] == "n/a"
    assert no_quality["quant_b1_best_quality"]["note"] == "quality not measured in this run (add --quality)"

    got = {t["key"]: t for t in targets.speed_quality_targets(QUANT_ROWS, quality_rows())}
    assert got["quant_b1_best_quality"]["status"] == "PASS"
    assert got["quant_b1_best_quality"]["note"].startswith("int8 1.80x: ppl +0.50 %, greedy agreement 95.0 %")
    # the fastest fails quality, the next one passes: PASS with the next one
    got = {t["key"]: t for t in targets.speed_quality_targets(QUANT_ROWS, quality_rows(int8="MISS"))}
    assert got["quant_b1_best_quality"]["status"] == "PASS" and got["quant_b1_best_quality"]["note"].startswith("w8a8")
    # every format fast enough fails quality: MISS, and the line says why
    got = {t["key"]: t for t in targets.speed_quality_targets(QUANT_ROWS, quality_rows(int8="MISS", w8a8="MISS"))}
    assert got["quant_b1_best_quality"]["status"] == "MISS"
    assert "ppl +3.00 %" in got["quant_b1_best_quality"]["note"]
    assert targets.speed_quality_targets([], None)[0]["note"] == "batch 32 not measured"
    lines = targets.target_lines(targets.speed_quality_targets(QUANT_ROWS, None))
    assert lines[1] == (
        "n/a   the format meeting the batch-1 speed target also meets ppl +<= 1 % and greedy agreement "
        ">= 90 %: quality not measured in this run (add --quality)"
    )


def test_render_quant_and_quality_tables():
    q = {
        "rows": QUANT_ROWS,
        "crossover": quantrows.crossover_rows(QUANT_ROWS),
        "batch_sizes": [1, 32],
        "steps": 16,
        "reps": 5,
        "cache_len": 256,
        "prompt_len": 128,
    }
    text = quantreport.render_quant(q)
    assert (
        "(baseline)" in text and "1.80x" in text and "up to b1 (loses from b32)" in text and "median of 5 reps" in text
    )
    spread = dict(QUANT_ROWS[1], vs_float32_per_rep=stats.summarize([1.7, 1.8, 2.1]))
    assert "1.80x (1.70–2.10)" in quantreport.render_quant(dict(q, rows=[QUANT_ROWS[0], spread]))
    assert "int4 + int8 KV" in text and "never (<= 1x at every batch)" in text
    rep = {
        "model": "m",
        "sizes": {"windows": 16, "window": 128, "prompts": 32, "new_tokens": 32},
        "eval_tokens": 2032,
        "eval_text": "data/eval/stdlib.txt",
        "kv_cache": {"batch": 32, "length": 256},
        "targets": {"max_ppl_increase_pct": 1.0, "min_greedy_agreement": 0.9},
        "notes": ["reference: m as loaded", "int4 (group 32) lands on these weights"],
        "rows": [
            {
                **r,
                "weight_bytes": 1 << 27,
                "kv_cache_bytes": 1 << 20,
                "perplexity": 12.3456,
                "kl": 0.0094,
                "top1_agreement": 0.97,
                "identical": 30,
                "prompts": 32,
            }
            for r in quality_rows(int8="MISS")["rows"]
        ],
        "layer_errors": [
            {"format": "int8", "matrix": "wq", "mean": 0.008, "max": 0.009},
            {"format": "int8", "matrix": "embed", "mean": 0.0117, "max": 0.0117},
        ],
    }
    text = quantreport.render_quality(rep)
    for needle in (
        "2,032 predicted tokens",
        "12.346",
        "+3.00 %",
        "30/32",
        "MISS",
        "note        int4 (group 32) lands",
        "8.00e-03",
        "1.17e-02",
        "batch 32, 256 slots",
    ):
        assert needle in text, (needle, text)


def test_first_divergence():
    assert stats.first_divergence([[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 5]]) is None
    assert stats.first_divergence([[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 6]]) == (1, 1)
    assert stats.first_divergence([[1, 2]], [[1, 2, 3]]) == (0, 2)
    assert stats.divergence_text(None, 8) == "identical (8 rows)"
    assert stats.divergence_text((3, 17), 8) == "first divergence at row 3, token 17"


def test_make_prompts_equal_length_distinct_rows():
    ids = list(range(1000))
    rows = prompts.make_prompts(ids, 128, 128)
    assert len(rows) == 128 and all(len(r) == 128 for r in rows)
    assert len({tuple(r) for r in rows}) == 128
    short = prompts.make_prompts([7, 8, 9], 2, 5)  # repeated when too short
    assert all(len(r) == 5 for r in short)


def test_resolve_options_quick_and_overrides():
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    o = bench.resolve_options(parser.parse_args(["--quick", "--reps", "2"]))
    assert o.batch_sizes == (1, 2) and o.new_tokens == 8 and o.prompt_len == 16 and o.reps == 2
    o = bench.resolve_options(parser.parse_args(["--batch-sizes", "32,1,8", "--no-stages", "--no-peer"]))
    assert o.batch_sizes == (1, 8, 32) and o.new_tokens == 128 and not o.stages and not o.peer
    with pytest.raises(SystemExit):
        parser.parse_args(["--batch-sizes", "0,1"])


def test_resolve_options_quantization():
    from jaxlab.errors import InvalidRequestError

    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    o = bench.resolve_options(parser.parse_args([]))
    assert o.quant and not o.quality and o.float and o.quant_batch_sizes == (1, 8, 32)
    assert o.quant_formats == ("int8", "int4", "w8a8") and o.quant_kv == ("float32", "int8")
    o = bench.resolve_options(parser.parse_args(["--quick"]))
    assert o.quant_batch_sizes == (1, 2) and o.quant_steps == 3
    o = bench.resolve_options(
        parser.parse_args(
            [
                "--quant-only",
                "--quality",
                "--quant-formats",
                "w8a8,int8,w8a8",
                "--quant-kv",
                "int8",
                "--model",
                "some/model",
            ]
        )
    )
    assert not (o.float or o.peer or o.ttft or o.stages or o.speculative)
    assert o.quant_formats == ("w8a8", "int8") and o.quant_kv == ("int8",) and o.model == "some/model"
    o = bench.resolve_options(parser.parse_args(["--model", "some.gguf", "--no-ttft"]))  # every row on that model
    assert o.model == "some.gguf" and o.float and o.peer and o.stages and not o.ttft
    with pytest.raises(SystemExit):
        parser.parse_args(["--quant-formats", "int3"])
    for bad in (
        ["--model", "x"],
        ["--quant-only", "--no-quant"],
        ["--quant-only", "--plot", "x.png"],
        ["--quant-steps", "0"],
    ):
        with pytest.raises(InvalidRequestError):
            bench.resolve_options(parser.parse_args(bad))


# --------------------------------------------------------------------------------------------------
# One quick end-to-end run shared by the tests below (tiny sizes; the embedded model's first two layers,
# ``small_gguf``, so every section runs in a fraction of the whole model's time; the peer, transformers on the
# same file, when torch and transformers are installed), and a quant-only run that reuses its compiled programs.
# What the bench measures on the whole model is recorded in benchmarks/ (`jaxlab bench`).
# --------------------------------------------------------------------------------------------------

QUANT_ARGS = ["--quant-formats", "int8", "--quant-kv", "int8", "--quant-batch-sizes", "1"]
SMALL_CEILINGS = ["--bandwidth-mib", "16", "--matmul-n", "256"]


def has_peer() -> bool:
    return importlib.util.find_spec("torch") is not None and importlib.util.find_spec("transformers") is not None


def run_cli(argv: list[str]) -> tuple[int, str]:
    """``jaxlab <argv>`` in this process -> (exit status, stdout)."""
    from jaxlab.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(argv)
    return rc, out.getvalue()


@pytest.fixture(scope="module")
def quick(tmp_path_factory, small_gguf, converted_cache):
    """One ``jaxlab bench --quick --model <the first two layers>`` with every part but time to first token: the
    float32 rows against the peer, the stages, speculative decoding, the quantized rows (int8 weights, int8 KV,
    batch 1) and the quality report; -> {"text", "json", "png"}."""
    tmp = tmp_path_factory.mktemp("bench")
    argv = ["bench", "--quick", "--no-ttft", "--quality", *QUANT_ARGS, *SMALL_CEILINGS, "--targets"]
    argv += ["--model", str(small_gguf), "--json", str(tmp / "bench.json"), "--plot", str(tmp / "roofline.png")]
    if not has_peer():
        argv.append("--no-peer")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JAXLAB_CACHE", str(converted_cache))  # the small model's converted parameters go there
        share_loads(mp)  # the session's load: --quant-only below reads the same model without loading it again
        rc, text = run_cli(argv)
    assert rc == 0, text
    return {"text": text, "json": json.loads((tmp / "bench.json").read_text()), "png": tmp / "roofline.png"}


@pytest.mark.slow
def test_quick_report_has_every_part(quick):
    text = quick["text"]
    for label in report.ALWAYS_ROWS + report.STAGE_ROWS + ("decode b1", "decode b2"):
        assert label in text, f"row {label!r} missing from:\n{text}"
    for header in (
        "ceilings",
        "threads",
        "versions",
        "Prefill",
        "Decode",
        "Stages",
        "Speculative decoding",
        "Quantized decode",
        "Where each quantized variant pays",
        "Quality against float32",
        "Relative weight error",
        "Compile",
        "Memory",
        "Targets",
        "CPU kernels ",  # whether jaxlab's CPU kernels ran the few-row steps (jaxlab.engine.kernels.cpu)
    ):
        assert header in text, f"{header!r} missing from:\n{text}"
    assert text.count("PASS") + text.count("MISS") + text.count("n/a") >= len(targets.TARGETS)
    assert quick["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # the plot is a PNG


@pytest.mark.slow
def test_quick_json_float_rows(quick):
    res = quick["json"]
    for key in (
        "meta",
        "options",
        "ceilings",
        "peer",
        "prefill",
        "decode",
        "stages",
        "speculative",
        "quant",
        "quality",
        "compile",
        "memory",
        "metrics",
        "targets",
    ):
        assert key in res
    assert list(res["options"]) == [f.name for f in dataclasses.fields(bench.Options)]
    assert res["ceilings"]["bandwidth_bytes_per_s"] > 0 and res["ceilings"]["matmul_flops_per_s"] > 0
    assert [d["batch"] for d in res["decode"]] == [1, 2]
    assert {s["stage"] for s in res["stages"]} == set(report.STAGE_ROWS)
    assert {"prefill", "decode"} <= {c["function"] for c in res["compile"]}
    assert res["ttft"] is None
    for d in res["decode"]:
        assert d["recompiled_reps"] == 0 and math.isfinite(d["bw_roofline_pct"])
        assert d["kv_bytes_allocated"] == res["memory"]["kv_cache_bytes"][str(d["batch"])]
    # float32 stages decode the same tokens as the jit + cache loop
    for s in res["stages"]:
        if s["stage"] != "bfloat16 (jit + KV cache)":
            assert s["tokens_match"].startswith("yes"), s
    spec_rows = {(r["task"], r["method"]) for r in res["speculative"]}
    assert ("copy-heavy", "ngram") in spec_rows and ("open-ended", "ngram") in spec_rows
    assert all(r["identical"] == "yes" for r in res["speculative"])


@pytest.mark.reference
@pytest.mark.slow
def test_quick_greedy_tokens_checked_against_the_peer(quick):
    if not has_peer():
        pytest.skip("torch/transformers not installed")
    res = quick["json"]
    assert res["peer"]["enabled"] and "transformers" in quick["text"]
    assert res["meta"]["threads"]["torch_threads"] >= 1
    for d in res["decode"]:  # the greedy-equality check ran against the peer, for every batch size
        assert d["tokens_identical"] in (True, False)
        assert ("identical" in d["greedy_check"]) or ("first divergence" in d["greedy_check"])


@pytest.mark.slow
def test_quick_quantized_rows(quick):
    res = quick["json"]
    rows = res["quant"]["rows"]
    assert [(r["label"], r["batch"]) for r in rows] == [("float32", 1), ("float32 + int8 KV", 1), ("int8 + int8 KV", 1)]
    assert rows[0]["vs_float32"] == 1.0
    for r in rows:
        assert r["step_s"]["median"] > 0 and r["vs_float32"] > 0 and math.isfinite(r["bw_roofline_pct"])
    assert rows[2]["weight_bytes"] < rows[0]["weight_bytes"] / 3
    # each row's cache is laid out as Generator lays it out (on XLA:CPU a float32 cache's keys transposed, "ds": what
    # its attention kernel reads; int8 "sd")
    want = "ds" if jax.default_backend() == "cpu" else "sd"
    assert [r["key_layout"] for r in rows] == [want, "sd", "sd"]
    assert rows[1]["bytes_per_step"] < rows[0]["bytes_per_step"]  # the int8 cache moves fewer K/V bytes
    assert [c["label"] for c in res["quant"]["crossover"]] == ["float32 + int8 KV", "int8 + int8 KV"]
    assert sum(c["function"] == "decode step (quant rows)" for c in res["compile"]) == 3
    keys = {t["key"]: t for t in res["targets"]}
    assert keys["quant_b1_best"]["measured"] == max(r["vs_float32"] for r in rows[1:])
    assert (
        keys["quant_b32_best"]["status"] == "n/a" and keys["quant_b32_best_quality"]["note"] == "batch 32 not measured"
    )


@pytest.mark.slow
def test_quick_quality_report(quick):
    q = quick["json"]["quality"]
    assert [r["label"] for r in q["rows"]] == ["float32", "float32 + int8 KV", "int8 + int8 KV"]
    ref, kv8, q8 = q["rows"]
    assert ref["greedy_agreement"] == 1.0 and ref["identical"] == ref["prompts"] == 4  # the method's noise floor
    assert 0 < kv8["kl"] < 0.05 and 0 < q8["kl"] < 0.05 and abs(q8["ppl_increase_pct"]) < 5
    assert q8["greedy_agreement"] > 0.6
    assert q["notes"][0].startswith("reference: ") and "smollm2-2-layers.gguf" in q["notes"][0]  # said plainly


@pytest.mark.slow
def test_quant_only_measures_only_the_quantized_rows(quick, tmp_path, small, load_once):
    """--quant-only: no float32 rows, no peer, no stages; the same variants as the shared run, so every program
    is already compiled in this process (and the model loaded: ``load_once``) and the run is short."""
    rc, text = run_cli(
        ["bench", "--quant-only", "--quick", *QUANT_ARGS, *SMALL_CEILINGS, "--model", small]
        + ["--json", str(tmp_path / "q.json")]
    )
    assert rc == 0, text
    assert (
        "Quantized decode" in text and "Prefill" not in text and "Stages" not in text and "Quality against" not in text
    )
    res = json.loads((tmp_path / "q.json").read_text())
    assert res["prefill"] is None and res["decode"] == [] and res["stages"] == [] and res["speculative"] == []
    assert not res["peer"]["enabled"] and res["peer"]["reason"] == "not run (--quant-only)"
    assert res["ttft"] is None and res["quality"] is None and "kv_cache_bytes" not in res["memory"]
    assert [r["label"] for r in res["quant"]["rows"]] == ["float32", "float32 + int8 KV", "int8 + int8 KV"]
    assert {c["function"] for c in res["compile"]} == {"decode step (quant rows)"}
