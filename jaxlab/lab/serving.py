"""Notebook 12's bookkeeping and figures: a sampler that scrapes the server's ``/metrics`` while clients stream,
the occupancy plot, and the per-request timeline; :func:`flood_effect`, one client's answer time while another
floods the server (within its rate limit's allowance, and past it). The server itself is in the notebook."""

from __future__ import annotations

import http.client
import threading
import time
from urllib.parse import urlsplit

__all__ = ["MetricsSampler", "scrape", "flood_effect", "plot_occupancy", "plot_streams", "plot_burst"]

MAX_FLOOD = 20_000  # requests one flood sends at most, whatever happens to the measured answer
GAUGES = ("jaxlab_batch_occupancy", "jaxlab_running_requests", "jaxlab_queue_length", "jaxlab_kv_pages_used")


def scrape(url: str, key: str | None = None) -> dict[str, float]:
    """``GET url/metrics``, parsed by prometheus_client's own text parser: {sample name (with labels): value}.
    ``key``: the server's API key (with keys on, ``/metrics`` asks for it too, unless ``--open-metrics``)."""
    from prometheus_client.parser import text_string_to_metric_families

    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    try:
        conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {key}"} if key else {})
        response = conn.getresponse()
        text = response.read().decode()
    finally:
        conn.close()
    if response.status != 200:
        raise RuntimeError(f"GET /metrics answered {response.status}: {text[:200]} (with keys on, pass key=)")
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[s.name + (f"{{{labels}}}" if labels else "")] = s.value
    return out


def _connect(url: str, source: str) -> http.client.HTTPConnection:
    """An HTTP connection to ``url`` sent from the loopback address ``source``."""
    u = urlsplit(url)
    return http.client.HTTPConnection(u.hostname, u.port, timeout=120, source_address=(source, 0))


def _request(
    url: str,
    method: str,
    path: str,
    key: str | None,
    body: dict | None,
    source: str,
    conn: http.client.HTTPConnection | None = None,
) -> int:
    """One request from the loopback address ``source`` (the server tells clients apart by address and key)
    -> its status. ``conn``: a kept-alive connection to send it on (a flood reuses one per thread rather than
    opening thousands, each leaving a socket in TIME_WAIT and taking an ephemeral port another process may want)."""
    import json

    own = conn is None
    conn = conn or _connect(url, source)
    try:
        headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
        conn.request(method, path, body=json.dumps(body).encode() if body is not None else None, headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        if own:
            conn.close()


def flood_effect(
    url: str,
    key: str | None,
    model: str,
    *,
    victim_tokens: int = 32,
    flood_threads: int = 2,
    flood_tokens: int = 16,
    victim: str = "127.0.0.3",
    flooder: str = "127.0.0.2",
) -> dict:
    """A well-behaved client's answer time (one chat request of ``victim_tokens`` greedy tokens, from ``victim``)
    alone and while a second client (``flooder``, its own rate-limit bucket) sends chat requests of
    ``flood_tokens`` back to back in ``flood_threads`` threads: first within its allowance (its bucket full, so
    its requests reach the model), then past it (its bucket emptied with cheap ``GET /v1/models``, so they are
    refused with 429). Returns ``{"alone_s", "within_s", "past_s", "within": {status: count}, "past": {...}}``.

    The addresses are loopback aliases: Linux routes all of 127.0.0.0/8 to the loopback device; where the OS
    does not (macOS), this raises ``OSError`` naming the address."""
    victim_body = {
        "model": model,
        "messages": [{"role": "user", "content": "Tell me a story about a lighthouse."}],
        "max_tokens": victim_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    flood_body = {**victim_body, "messages": [{"role": "user", "content": "Hi!"}], "max_tokens": flood_tokens}
    for source in (victim, flooder):
        try:
            _request(url, "GET", "/health", None, None, source)
        except OSError as e:
            raise OSError(f"cannot send from {source} ({e}): this measurement needs loopback aliases (Linux)") from None

    def answer_time() -> float:
        t = time.perf_counter()
        status = _request(url, "POST", "/v1/chat/completions", key, victim_body, victim)
        if status != 200:
            raise RuntimeError(f"the well-behaved client got {status}: its own bucket is empty (wait a minute)")
        return time.perf_counter() - t

    def during_flood() -> tuple[float, dict[int, int]]:
        stop, statuses = threading.Event(), []

        def flood():  # bounded in time (the measured answer) and in count; one kept-alive connection
            conn = _connect(url, flooder)
            try:
                while not stop.is_set() and len(statuses) < MAX_FLOOD:
                    statuses.append(_request(url, "POST", "/v1/chat/completions", key, flood_body, flooder, conn))
            finally:
                conn.close()

        threads = [threading.Thread(target=flood, daemon=True) for _ in range(flood_threads)]
        for t in threads:
            t.start()
        time.sleep(0.2)  # the flood under way before the measured request
        try:
            seconds = answer_time()
        finally:
            stop.set()
            for t in threads:
                t.join()
        return seconds, {s: statuses.count(s) for s in sorted(set(statuses))}

    out: dict = {"alone_s": answer_time()}
    out["within_s"], out["within"] = during_flood()
    while _request(url, "GET", "/v1/models", key, None, flooder) != 429:  # the flooder's allowance used up
        pass
    out["past_s"], out["past"] = during_flood()
    return out


class MetricsSampler:
    """Scrapes ``/metrics`` every ``every`` seconds on a thread while the ``with`` block runs; ``samples`` is a
    list of (seconds since the start, {gauge: value}) for the gauges in :data:`GAUGES`."""

    def __init__(self, url: str, every: float = 0.05, key: str | None = None):
        self.url, self.every, self.key = url, every, key
        self.samples: list[tuple[float, dict[str, float]]] = []
        self.error: Exception | None = None  # what stopped the scraping, raised when the block ends
        self._stop = threading.Event()
        self.t0 = 0.0

    def _run(self):
        while not self._stop.is_set():
            try:
                values = scrape(self.url, self.key)
            except Exception as e:  # told when the block ends, not lost with this thread
                self.error = e
                return
            self.samples.append((time.perf_counter() - self.t0, {g: values.get(g, 0.0) for g in GAUGES}))
            self._stop.wait(self.every)

    def __enter__(self):
        self.t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)
        if self.error is not None and exc[0] is None:
            raise self.error

    def series(self, gauge: str) -> tuple[list[float], list[float]]:
        return [t for t, _ in self.samples], [v[gauge] for _, v in self.samples]


def plot_occupancy(sampler: MetricsSampler, slots: int, title: str = ""):
    """Batch occupancy (running ÷ slots) and the queue over time, as the server reported them."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.2))
    t, occ = sampler.series("jaxlab_batch_occupancy")
    _, queue = sampler.series("jaxlab_queue_length")
    ax.step(t, [o * slots for o in occ], where="post", label="running (slots in use)", color="tab:blue")
    ax.step(t, queue, where="post", label="waiting in the queue", color="tab:orange")
    ax.axhline(slots, ls=":", color="gray", lw=1)
    ax.text(0, slots, f" {slots} slots", va="bottom", color="gray", fontsize=8)
    ax.set_xlabel("seconds since the clients started")
    ax.set_ylabel("requests")
    ax.set_ylim(0, max([slots, *queue]) + 1.5)
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title(title or "Batch occupancy, scraped from /metrics")
    fig.tight_layout()
    return fig


def plot_streams(records: list[dict], title: str = ""):
    """One row per request: waiting (sent -> first token) and streaming (first -> last token). ``records``
    hold ``sent``, ``first``, ``last`` (seconds since a common start) and ``name``."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 0.25 * len(records) + 1.2))
    order = sorted(range(len(records)), key=lambda i: records[i]["first"])
    for row, i in enumerate(order):
        r = records[i]
        ax.barh(row, r["first"] - r["sent"], left=r["sent"], color="tab:orange", alpha=0.6, height=0.7)
        ax.barh(row, r["last"] - r["first"], left=r["first"], color="tab:blue", height=0.7)
    ax.set_yticks(range(len(order)), [records[i]["name"] for i in order], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the clients started")
    ax.set_ylabel("client (by first token)")
    from matplotlib.patches import Patch

    ax.legend(
        handles=[Patch(color="tab:orange", alpha=0.6, label="waiting: time to first token"),
                 Patch(color="tab:blue", label="streaming tokens")],
        loc="lower right", fontsize=8,
    )  # fmt: skip
    ax.set_title(title or "Each client's request, from sent to last token")
    fig.tight_layout()
    return fig


def plot_burst(statuses: list[int], title: str = ""):
    """The HTTP status of each request of a burst, in order (200 green, others red); returns the figure."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 2))
    ax.scatter(range(len(statuses)), statuses, c=["tab:green" if s == 200 else "tab:red" for s in statuses], s=12)
    ax.set_yticks(sorted(set(statuses)))
    ax.set_xlabel("request in the burst")
    ax.set_ylabel("HTTP status")
    ax.set_title(title or f"A burst of {len(statuses)} requests with one key", fontsize=10)
    fig.tight_layout()
    return fig
