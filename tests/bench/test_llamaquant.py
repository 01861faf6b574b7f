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


def _batched_lines(speeds: dict[int, float]) -> str:
    head = "main: n_kv_max = 6144\n"  # llama-batched-bench prints its settings before the JSON lines
    return head + "\n".join(
        json.dumps({"pp": 128, "tg": 64, "pl": b, "is_pp_shared": 1, "speed_tg": v, "speed_pp": 100.0})
        for b, v in speeds.items()
    )


def test_parse_batched_reads_each_batch():
    assert llamaquant.parse_batched(_batched_lines({8: 80.5, 32: 130.0})) == {8: 80.5, 32: 130.0}
    with pytest.raises(RuntimeError, match="no result line"):
        llamaquant.parse_batched("main: n_kv_max = 6144\n")


def test_measure_batched_runs_each_file_and_keeps_the_best_run(tmp_path):
    """A stand-in llama-batched-bench (a script printing JSON lines) run the way the bench runs the real one: its
    arguments logged, its best run of each file and batch kept."""
    calls = tmp_path / "calls"
    exe = tmp_path / "llama-batched-bench"
    exe.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {calls}\n'
        'case "$*" in *Q8_0*) v=100;; *) v=120;; esac\n'
        "n=$(wc -l < " + str(calls) + ")\n"
        'echo "{\\"pl\\": 32, \\"speed_tg\\": $((v + n))}"\n'
    )
    exe.chmod(0o755)
    files = {"Q8_0": tmp_path / "m-Q8_0.gguf", "Q4_1": tmp_path / "m-Q4_1.gguf"}
    out = llamaquant.measure_batched(str(exe), files, (32,), 128, 64, 2, 2, lambda _: None)
    assert out["samples"] == {"Q8_0": {32: [101.0, 103.0]}, "Q4_1": {32: [122.0, 124.0]}}
    assert out["tok_s"] == {"Q8_0": {32: 103.0}, "Q4_1": {32: 124.0}}
    argv = calls.read_text().splitlines()[0].split()
    assert argv[:10] == ["-c", str(32 * (128 + 64)), "-npp", "128", "-ntg", "64", "-npl", "32", "-pps", "-t"]
    with pytest.raises(RuntimeError, match="make llama-cpp"):
        llamaquant.measure_batched(str(tmp_path / "missing"), files, (32,), 128, 64, 1, 2, lambda _: None)


def test_compare_puts_each_batch_side_by_side():
    rows = [
        _row("float32", "float32", 1, 30.0),
        _row("int8", "float32", 1, 70.0),
        _row("float32", "float32", 32, 200.0),
        {**_row("float32", "int8", 32, 260.0), "label": "float32 + int8 KV"},  # float weights: not a quantized format
        {**_row("int8", "float32", 32, 280.0, 300.0), "label": "int8"},
        {**_row("int8", "int8", 32, 320.0), "label": "int8 + int8 KV"},
    ]
    peer = {
        "best_tok_s": {"F32": 45.0, "Q8_0": 90.0, "Q4_1": 115.0},
        "vs_F32": {"Q8_0": 2.0, "Q4_1": 115 / 45},
        "batched": {"tok_s": {"Q8_0": {32: 250.0}, "Q4_1": {32: 200.0}}},
    }
    c = llamaquant.compare(rows, peer)
    assert c["int8_vs_q4_1"] == pytest.approx(70 / 115)
    b32 = c["batched"][32]
    assert b32["jaxlab"] == {"int8": 300.0, "int8 + int8 KV": 320.0}
    assert b32["best_jaxlab"] == ["int8 + int8 KV", 320.0] and b32["best_llama_cpp"] == ["Q8_0", 250.0]
    assert b32["ratio"] == pytest.approx(320 / 250)
    text = llamaquant.render(
        {"llama_cpp": {**peer, "what": "w", "argv": ["llama-bench"], "batched": {"what": "b", "argv": ["x"]}},
         "llama_cpp_vs_jaxlab": c}
    )  # fmt: skip
    assert "jaxlab int8 / llama.cpp Q4_1 = 0.61" in text
    assert "batch 32: jaxlab int8 300, int8 + int8 KV 320; llama.cpp Q8_0 250, Q4_1 200 tok/s" in text
    assert "jaxlab int8 + int8 KV / llama.cpp Q8_0 = 1.28" in text
