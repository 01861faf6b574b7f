"""Notebook 12's bookkeeping and figures: a sampler that scrapes the server's ``/metrics`` while clients stream,
the occupancy plot, and the per-request timeline. The HTTP calls and the server itself are in the notebook."""

from __future__ import annotations

import http.client
import threading
import time
from urllib.parse import urlsplit

__all__ = ["MetricsSampler", "scrape", "plot_occupancy", "plot_streams", "plot_burst"]

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
