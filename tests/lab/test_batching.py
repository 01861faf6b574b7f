"""Notebook 11's scheduling pictures: the two policies counted in steps, and the figures."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest

from jaxlab.lab import batching


def test_static_holds_slots_until_the_batch_ends_continuous_refills():
    reqs = [(0, 10), (0, 2), (1, 2), (1, 2)]
    static = batching.schedule_steps(reqs, 2, "static")
    cont = batching.schedule_steps(reqs, 2, "continuous")
    # static: requests 0 and 1 from step 0; 2 and 3 wait for the longest (10 steps)
    assert sorted(static) == [(0, 0, 0, 10), (0, 2, 10, 12), (1, 1, 0, 2), (1, 3, 10, 12)]
    # continuous: request 2 takes slot 1 as soon as request 1 is done, then request 3
    assert sorted(cont) == [(0, 0, 0, 10), (1, 1, 0, 2), (1, 2, 2, 4), (1, 3, 4, 6)]
    assert max(b[3] for b in cont) < max(b[3] for b in static)
    with pytest.raises(ValueError, match="policy"):
        batching.schedule_steps(reqs, 2, "fifo")


def test_every_request_runs_its_steps_once():
    reqs = [(3 * i % 7, 1 + (5 * i) % 9) for i in range(15)]
    for policy in ("static", "continuous"):
        bars = batching.schedule_steps(reqs, 3, policy)
        assert sorted(b[1] for b in bars) == list(range(15))
        for slot, i, start, stop in bars:
            assert stop - start == reqs[i][1] and start >= reqs[i][0]
        for slot in range(3):  # no two requests in one slot at once
            spans = sorted((b[2], b[3]) for b in bars if b[0] == slot)
            assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))


def test_figures():
    fig = batching.plot_timelines([(0, 4), (1, 2), (2, 3)], slots=2)
    assert len(fig.axes) == 2
    fig = batching.plot_serving(
        {n: {"throughput": 3.0, "ttft_s": {"p50": 0.1, "p99": 0.5}} for n in ("static", "continuous")}
    )
    assert len(fig.axes) == 2
    fig = batching.plot_prefix_reuse({False: [0.3, 0.1, 0.2], True: [0.1, 0.05, 0.08]})
    assert fig.axes[0].get_title() and fig.axes[0].get_xlabel()


def test_run_arrivals_records_what_metrics_show(tiny_engine_params):
    from jaxlab.engine.continuous import Engine
    from jaxlab.engine.sampling import SamplingParams

    eng = Engine(tiny_engine_params, slots=4, page_size=4, chunk=8, context=64, num_pages=1 + 6, watermark=None)
    reqs = [
        (0, [1, 5, 9, 7, 3], 6, SamplingParams(), 0),
        (0, [1, 8] * 6, 6, SamplingParams(), 1),
        (2, [1, 2], 3, SamplingParams(), 2),
    ]
    streams, hist = batching.run_arrivals(eng, reqs)
    assert sorted(streams) == [0, 1, 2] and all(
        len(s.token_ids) == n for (_, _, n, _, i), s in zip(reqs, streams.values())
    )
    assert [h["step"] for h in hist] == list(range(len(hist))) and hist[-1]["running"] == hist[-1]["waiting"] == 0
    assert max(h["pages"] for h in hist) <= 6 and hist[-1]["pages"] == 0
    assert {h["bucket"] for h in hist} <= {0, 4} and 4 in {h["bucket"] for h in hist}
    assert hist[-1]["preemptions"] == eng.scheduler.preemptions
    fig = batching.plot_engine_state({"by slots": hist}, pool_pages=6)
    assert [a.get_title() for a in fig.axes] == ["requests", "KV pages held", "decode rows (bucket)"]


@pytest.fixture(scope="module")
def tiny_engine_params():
    from jaxlab.engine.model import init_params
    from jaxlab.io.config import tiny

    return init_params(tiny(), 7)


def test_stored_trace_equals_the_recorded_bench_run():
    import json
    from pathlib import Path

    run = json.loads((Path(__file__).resolve().parents[2] / "benchmarks" / "results-trace-cpu.json").read_text())
    s, st = run["serving"], batching.STORED_TRACE
    assert (st["requests"], st["max_batch"]) == (s["requests"], s["max_batch"])
    assert st["throughput_ratio"] == s["throughput_ratio"]
    assert st["ttft_p99_s"] == {n: s[n]["ttft_s"]["p99"] for n in ("static", "continuous")}
    p = run["prefix"]
    assert st["prefix"] == {k: p[k] for k in ("requests", "system_tokens", "slots", "ttft_ratio")}
    assert run["meta"]["cpu"] in st["label"]


def test_pool_figure_marks_shared_pages():
    from jaxlab.engine.continuous import Engine
    from jaxlab.engine.model import init_params
    from jaxlab.io.config import tiny

    eng = Engine(init_params(tiny(), 0), slots=2, page_size=4, chunk=8, context=64)
    shared = [1] + list(range(10, 20))
    eng.add_request(shared + [3], max_new_tokens=8, request_id="x")
    eng.step()
    eng.add_request(shared + [4], max_new_tokens=8, request_id="y")
    eng.step()
    fig, text = batching.plot_pool(eng)
    assert "request   x" in text and "request   y" in text
    assert any(p.get_hatch() == "xx" for p in fig.axes[0].patches)  # y reads x's full prompt pages
