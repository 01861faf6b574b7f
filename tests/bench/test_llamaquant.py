"""jaxlab.bench.llamaquant: llama-bench's JSON read per GGUF, the two stacks' quantization speed-ups side by side,
and --llama-bench resolved with one clear line when the peer is not built."""

from __future__ import annotations

import json

import pytest

from jaxlab.bench import llamaquant
from jaxlab.errors import InvalidRequestError

NAMES = {"F32": "model-F32.gguf", "Q8_0": "model-Q8_0.gguf", "Q4_1": "smollm2.gguf"}


def _stdout(tok_s):
    return json.dumps(
        [
            {
                "model_filename": f"/tmp/x/{name}",
                "n_prompt": 0,
                "n_gen": 64,
                "avg_ts": tok_s[q],
                "stddev_ts": 0.5,
                "samples_ts": [tok_s[q] - 1, tok_s[q] + 1],
            }
            for q, name in NAMES.items()
        ]
    )


def test_parse_reads_each_file_and_divides_by_f32():
    out = llamaquant.parse(
        _stdout({"F32": 20.0, "Q8_0": 40.0, "Q4_1": 50.0}), NAMES, ["llama-bench", "-m", "/tmp/x/model-F32.gguf"]
    )
    assert out["tok_s"] == {"F32": 20.0, "Q8_0": 40.0, "Q4_1": 50.0}  # llama-bench's mean
    assert out["best_tok_s"] == {"F32": 21.0, "Q8_0": 41.0, "Q4_1": 51.0}  # the best repetition
    assert out["vs_F32"] == {"Q8_0": pytest.approx(41 / 21), "Q4_1": pytest.approx(51 / 21)}
    assert out["argv"] == ["llama-bench", "-m", "model-F32.gguf"]  # no temporary folder in a stored report
    with pytest.raises(RuntimeError, match="no result for smollm2.gguf"):
        llamaquant.parse(json.dumps(json.loads(_stdout({"F32": 1, "Q8_0": 1, "Q4_1": 1}))[:2]), NAMES, [])


def _row(weights, kv, batch, *tok_s):
    return {"weights": weights, "kv_cache": kv, "batch": batch, "tokens_per_s": {"values": list(tok_s)}}


def test_compare_takes_each_stacks_fastest_quantized_format_at_batch_1():
    rows = [
        _row("float32", "float32", 1, 30.0, 32.0),
        _row("int8", "float32", 1, 40.0, 44.0),
        _row("int4", "float32", 1, 8.0, 9.0),
        _row("int8", "int8", 1, 90.0),  # another cache: not compared
        _row("int8", "float32", 8, 300.0),  # another batch
    ]
    peer = {"best_tok_s": {"F32": 15.0, "Q8_0": 90.0, "Q4_1": 110.0}, "vs_F32": {"Q8_0": 6.0, "Q4_1": 110 / 15}}
    c = llamaquant.compare(rows, peer)
    assert c["best_jaxlab"] == ["int8", 44.0] and c["best_llama_cpp"] == ["Q4_1", 110.0]
    assert c["ratio"] == pytest.approx(44 / 110)
    assert c["jaxlab"] == {"int8": pytest.approx(44 / 32), "int4": pytest.approx(9 / 32)}
    with pytest.raises(RuntimeError, match="--quant-batch-sizes"):
        llamaquant.compare(rows[-1:], peer)


def test_render_names_both_stacks():
    peer = llamaquant.parse(_stdout({"F32": 20.0, "Q8_0": 40.0, "Q4_1": 50.0}), NAMES, ["llama-bench"])
    rows = [_row("float32", "float32", 1, 30.0), _row("int8", "float32", 1, 45.0)]
    text = llamaquant.render({"llama_cpp": peer, "llama_cpp_vs_jaxlab": llamaquant.compare(rows, peer)})
    assert (
        "llama.cpp Q4_1: 51.0 tok/s (2.43x its F32)" in text and "jaxlab int8: 45.0 tok/s (1.50x its float32)" in text
    )
    assert "jaxlab / llama.cpp = 0.88" in text


def test_resolve_llama_bench(tmp_path):
    assert llamaquant.resolve_llama_bench(None) is None and llamaquant.resolve_llama_bench("none") is None
    with pytest.raises(InvalidRequestError, match="make llama-cpp"):
        llamaquant.resolve_llama_bench(str(tmp_path / "missing"))
    exe = tmp_path / "llama-bench"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    assert llamaquant.resolve_llama_bench(str(exe)) == str(exe)
