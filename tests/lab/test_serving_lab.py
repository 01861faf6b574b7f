"""Notebook 12's exercise checkers (PASS on the solutions, FAIL on wrong answers), the token-bucket reference
against the server's own RateLimiter, and the /metrics scraper on a hand-made registry."""

from __future__ import annotations

import json

from conftest import load_solution, not_implemented

from jaxlab.lab.exercises import nb12


def test_nb12_checkers_pass_solutions_and_fail_wrong_answers(capsys):
    sol = load_solution("12_serving")
    assert nb12.check_sse_text(sol.my_sse_text)
    assert nb12.check_bucket(sol.my_bucket)
    assert nb12.check_ttft_tpot(sol.my_ttft_tpot)

    def no_done(lines):  # reads past [DONE]
        return sol.my_sse_text([ln for ln in lines if ln.strip() != "data: [DONE]"])

    def chat_only(lines):  # completions chunks have "text", not "delta"
        out = []
        for ln in lines:
            if ln.startswith("data:") and ln.strip() != "data: [DONE]":
                for c in json.loads(ln[5:]).get("choices") or []:
                    out.append((c.get("delta") or {}).get("content") or "")
            elif ln.strip() == "data: [DONE]":
                break
        return "".join(out)

    assert not nb12.check_sse_text(no_done)
    assert not nb12.check_sse_text(chat_only)
    assert not nb12.check_bucket(lambda pm, times: [True] * len(times))  # no limit
    assert not nb12.check_bucket(lambda pm, times: sol.my_bucket(pm / 2, times))  # half the rate and the burst
    assert not nb12.check_ttft_tpot(lambda s, t: (t[0] - s, (t[-1] - t[0]) / len(t)))  # divides by n, not n - 1
    assert not nb12.check_ttft_tpot(not_implemented)
    out = capsys.readouterr().out
    assert "FAIL: time to first token, time per output token: not implemented yet" in out
    assert "PASS: token bucket: which requests pass" in out


def test_bucket_reference_agrees_with_the_servers_rate_limiter(monkeypatch):
    import numpy as np

    from jaxlab.serve import app

    rng = np.random.default_rng(1)
    for per_minute in (1.0, 6.0, 30.0, 120.0):
        times = [float(t) for t in np.cumsum(rng.exponential(0.4, size=60)) + 100.0]
        limiter, got = app.RateLimiter(per_minute), []
        for t in times:
            monkeypatch.setattr(app.time, "monotonic", lambda t=t: t)
            got.append(limiter.take("key") == 0.0)
        assert got == nb12.reference_bucket(per_minute, times), per_minute
        assert 0 < sum(got) < len(got) or per_minute == 120.0


def test_scrape_parses_the_servers_metrics(monkeypatch):
    from jaxlab.lab import serving

    text = (
        "# HELP jaxlab_batch_occupancy running / slots\n# TYPE jaxlab_batch_occupancy gauge\n"
        "jaxlab_batch_occupancy 0.75\n# HELP jaxlab_requests_total r\n# TYPE jaxlab_requests_total counter\n"
        'jaxlab_requests_total{endpoint="chat",status="200"} 3.0\n'
    )

    class Conn:
        def __init__(self, *a, **k):
            pass

        def request(self, *a, **k):
            pass

        def getresponse(self):
            class R:
                status = 200

                def read(self):
                    return text.encode()

            return R()

        def close(self):
            pass

    monkeypatch.setattr(serving.http.client, "HTTPConnection", Conn)
    got = serving.scrape("http://127.0.0.1:1")
    assert got["jaxlab_batch_occupancy"] == 0.75
    assert got['jaxlab_requests_total{endpoint="chat",status="200"}'] == 3.0


def test_figures_have_titles_and_axis_labels():
    import matplotlib

    matplotlib.use("Agg")
    from jaxlab.lab import serving

    fig = serving.plot_burst([200, 200, 429, 429])
    ax = fig.axes[0]
    assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
    recs = [{"name": f"client {i}", "sent": 0.0, "first": 0.1 * i, "last": 0.2 + 0.1 * i} for i in range(3)]
    ax = serving.plot_streams(recs).axes[0]
    assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
