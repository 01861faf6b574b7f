"""``jaxlab bench --serve``: the figures of a level from hand-made timings, the targets, the table, the options'
errors, and a server that dies while starting. The load generator against a live server is in
tests/serve/test_server.py; the run against llama-server needs ``make llama-cpp`` and is the bench's, not a test's.

No timing is asserted: the ratios are read from the report by people, not by tests."""

from __future__ import annotations

import argparse
import json
import sys

import pytest

from jaxlab.bench import serving
from jaxlab.errors import InvalidRequestError, JaxlabError


def rec(sent, first, step, n, usage=True, error=None):
    out = {"t_send": sent, "t_tokens": [first + i * step for i in range(n)], "text": "x" * n, "finish_reason": "length"}
    out["usage"] = {"completion_tokens": n} if usage else None
    if error:
        out["error"], out["t_tokens"] = error, []
    return out


def test_level_figures_from_hand_made_timings():
    results = [
        rec(0.0, 0.5, 0.1, 11),
        rec(0.0, 1.5, 0.1, 11),
        rec(0.2, 0.7, 0.2, 6, usage=False),
        rec(0, 0, 0, 0, error="HTTP 500"),
    ]
    lv = serving.level_figures(results, 0.0, 4, 11)
    assert lv["requests"] == 4 and lv["failed"] == 1 and lv["errors"] == ["HTTP 500"]
    assert lv["short"] == 1  # the third gave 6 of 11 tokens (counted from its chunks: no usage)
    assert lv["output_tokens"] == 28
    assert lv["wall_s"] == pytest.approx(2.5)  # first request sent at 0, last token at 1.5 + 10 * 0.1
    assert lv["output_tokens_per_s"] == pytest.approx(28 / 2.5)
    assert lv["requests_per_s"] == pytest.approx(3 / 2.5)
    assert lv["ttft_s"][50] == pytest.approx(0.5) and lv["ttft_s"][99] == pytest.approx(1.5)
    assert lv["tpot_s"][50] == pytest.approx(0.1) and lv["tpot_s"][99] == pytest.approx(0.2)


def test_percentile_is_nearest_rank():
    v = list(range(1, 101))
    assert serving.percentile(v, 50) == 50 and serving.percentile(v, 99) == 99 and serving.percentile(v, 100) == 100
    assert serving.percentile([3.0], 99) == 3.0 and serving.percentile([], 50) is None


def fake_result(ours_tps, peer_tps, ours_p99, peer_p99, ours_tpot=0.05, failed=0):
    def level(c, tps, p99, tpot=0.05, failed=0):
        return {"concurrency": c, "requests_per_s": 1.0, "output_tokens_per_s": tps, "failed": failed, "short": 0,
                "ttft_s": {50: p99 / 2, 90: p99, 99: p99}, "tpot_s": {50: tpot, 90: 0.06, 99: 0.07}}  # fmt: skip

    return {
        "options": {"prompt_len": 128, "new_tokens": 64, "requests_per_client": 2, "slots": 32},
        "servers": [
            {"name": "jaxlab serve", "levels": [level(1, 50.0, 0.2, ours_tpot), level(32, ours_tps, ours_p99),
                                                level(64, ours_tps, ours_p99, failed=failed)]},
            {"name": "llama-server", "levels": [level(1, 60.0, 0.1), level(32, peer_tps, peer_p99),
                                                level(64, peer_tps, peer_p99, failed=3)]},
        ],
        "what": ["ours", "theirs"],
    }  # fmt: skip


def test_targets_pass_and_miss_on_hand_made_numbers():
    """The engine issue's targets: 1 client >= 0.8x output tok/s and p50 TPOT <= 1.5x; 32 clients >= 1.4x and p99
    TTFT no worse; 64 clients none failed (ours; the peer's failures do not count)."""
    t = serving.serve_targets(fake_result(120.0, 80.0, 2.0, 3.0))
    assert [x["status"] for x in t] == ["PASS"] * 5
    assert t[0]["measured"] == pytest.approx(50 / 60) and t[1]["measured"] == pytest.approx(1.0)
    assert t[2]["measured"] == pytest.approx(1.5) and t[4]["measured"] == 0
    assert [x["target"][:10] for x in t] == ["1 client: ", "1 client: ", "32 clients", "32 clients", "64 clients"]
    t = serving.serve_targets(fake_result(100.0, 80.0, 6.0, 3.0, ours_tpot=0.08, failed=1))
    assert [x["status"] for x in t] == ["PASS", "MISS", "MISS", "MISS", "MISS"]
    assert t[1]["measured"] == pytest.approx(1.6) and t[3]["measured"] == pytest.approx(2.0) and t[4]["measured"] == 1
    alone = fake_result(40.0, 80.0, 6.0, 3.0)
    alone["servers"].pop()
    assert [x["status"] for x in serving.serve_targets(alone)] == ["n/a"] * 4 + ["PASS"]
    read_back = json.loads(json.dumps(fake_result(120.0, 80.0, 2.0, 3.0)))  # percentiles keyed by strings
    assert [x["status"] for x in serving.serve_targets(read_back)] == ["PASS"] * 5


def test_the_table_has_both_servers_and_their_ratios():
    text = serving.render_serving(fake_result(40.0, 80.0, 6.0, 3.0))
    assert text.count("jaxlab serve") == 3 and text.count("llama-server") >= 3  # a line per level
    assert "32 clients: output tok/s 0.50x, p99 TTFT 2.00x" in text
    assert "What each side computes:" in text


def args(**kw):
    base = dict(quick=True, llama_server="none", concurrency=None, prompt_len=None, new_tokens=None,
                requests_per_client=None, serve_slots=None, serve_quant=None, serve_kv=None)  # fmt: skip
    base.update(kw)
    return argparse.Namespace(**base)


def test_options_and_their_errors(tmp_path, monkeypatch):
    opts = serving.resolve(args(concurrency=(8, 1, 8)))
    assert opts.concurrency == (1, 8) and opts.llama_server is None and opts.quant == "int8"
    monkeypatch.setenv("JAXLAB_CACHE", str(tmp_path))
    with pytest.raises(InvalidRequestError, match="make llama-cpp"):
        serving.resolve(args(llama_server=None))
    with pytest.raises(InvalidRequestError, match="not an executable file"):
        serving.resolve(args(llama_server=str(tmp_path / "nope")))
    with pytest.raises(InvalidRequestError, match="--new-tokens must be >= 2"):
        serving.resolve(args(new_tokens=1))
    argv = serving.llama_argv(serving.resolve(args(prompt_len=100, new_tokens=28, serve_slots=32)), 8080, "m.gguf")
    assert argv[argv.index("-c") + 1] == str(32 * 128) and argv[argv.index("-np") + 1] == "32"
    assert argv[argv.index("-t") + 1] == "2"
    assert "--no-overlap" not in serving.jaxlab_argv(opts, 8080)
    assert serving.jaxlab_argv(serving.resolve(args(serve_no_overlap=True)), 8080)[-1] == "--no-overlap"


def test_a_server_that_dies_while_starting_is_reported_with_its_output(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    argv = [sys.executable, "-c", "import sys; print('no model here'); sys.exit(3)"]
    with pytest.raises(JaxlabError, match=r"exited with 3 while starting: no model here"):
        with serving.ServerProcess("fake server", argv, serving.free_port(), lambda m: None):
            pass
