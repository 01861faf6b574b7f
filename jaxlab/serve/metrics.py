"""The server's Prometheus metrics (``GET /metrics``), in a registry of the server's own.

Counters of requests (by endpoint and status) and tokens; gauges, after each engine step, of the queue, the
running requests and the occupancy (running ÷ the most that may run), the KV pages held and the pool's size (the
engine admits by memory: these say why a request waits), and the row bucket of the last decode call; decode calls
launched a step early (taken or dropped); histograms of time to first token and time per output token of each
finished request.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class Metrics:
    def __init__(self, engine):
        self.max_running = engine.max_running
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "jaxlab_requests", "HTTP generation requests answered", ["endpoint", "status"], registry=r
        )
        self.prompt_tokens = Counter("jaxlab_prompt_tokens", "prompt tokens of accepted requests", registry=r)
        self.generation_tokens = Counter("jaxlab_generation_tokens", "tokens generated", registry=r)
        self.queue = Gauge("jaxlab_queue_length", "requests waiting for a slot", registry=r)
        self.running = Gauge("jaxlab_running_requests", "requests holding a slot", registry=r)
        self.occupancy = Gauge(
            "jaxlab_batch_occupancy", "running requests / the most that may run (--max-running)", registry=r
        )
        self.kv_use = Gauge("jaxlab_kv_pages_used", "KV-cache pages held / pool pages", registry=r)
        self.pages_held = Gauge("jaxlab_kv_pages_held", "KV-cache pages held by running requests", registry=r)
        self.pages_total = Gauge("jaxlab_kv_pages_total", "KV-cache pages in the pool (--kv-tokens)", registry=r)
        self.pages_total.set(engine.pool.capacity)
        self.bucket = Gauge("jaxlab_decode_bucket_rows", "rows of the last decode call (its row bucket)", registry=r)
        self.steps = Counter("jaxlab_engine_steps", "engine steps run", registry=r)
        self.preemptions = Counter(
            "jaxlab_preemptions", "requests preempted for pages (recomputed later; if it climbs, lower --max-running "
            "or give more --kv-tokens)", registry=r,
        )  # fmt: skip
        self.preempted = 0
        self.drafts = Counter(
            "jaxlab_draft_tokens", "speculative draft tokens proposed (--speculative ngram)", registry=r
        )
        self.drafts_kept = Counter(
            "jaxlab_draft_tokens_accepted", "draft tokens the model agreed with (each saved a decode step)", registry=r
        )
        self.drafted = self.kept = 0
        self.lookahead = Counter(
            "jaxlab_lookahead_calls", "decode calls launched a step early (overlapping the host's work), by whether "
            "the next step took them or dropped them", ["result"], registry=r,
        )  # fmt: skip
        self.looked = {"used": 0, "dropped": 0}
        self.ttft = Histogram(
            "jaxlab_time_to_first_token_seconds", "submit to first token", buckets=TTFT_BUCKETS, registry=r
        )
        self.tpot = Histogram(
            "jaxlab_time_per_output_token_seconds", "after the first token, per token", buckets=TPOT_BUCKETS, registry=r
        )
        self.finished_by = Counter("jaxlab_finished", "requests finished, by reason", ["reason"], registry=r)

    def request(self, endpoint: str, status: int) -> None:
        self.requests.labels(endpoint, str(status)).inc()

    def started(self, req) -> None:
        self.prompt_tokens.inc(len(req.generation.prompt_ids))

    def step(self, engine) -> None:  # on the engine's thread, after each step
        self.steps.inc()
        self.gauges(engine)

    def gauges(self, engine) -> None:  # on the engine's thread: after a step, and after submits and aborts
        sched = engine.scheduler
        self.queue.set(len(sched.waiting))
        self.running.set(len(sched.running))
        self.occupancy.set(len(sched.running) / self.max_running)
        self.kv_use.set(engine.pool.used / max(1, engine.pool.capacity))
        self.pages_held.set(engine.pool.used)
        if sched.preemptions > self.preempted:
            self.preemptions.inc(sched.preemptions - self.preempted)
            self.preempted = sched.preemptions
        if engine.drafted > self.drafted:
            self.drafts.inc(engine.drafted - self.drafted)
            self.drafts_kept.inc(engine.accepted - self.kept)
            self.drafted, self.kept = engine.drafted, engine.accepted
        for result, n in engine.ahead_steps.items():
            if n > self.looked[result]:
                self.lookahead.labels(result).inc(n - self.looked[result])
                self.looked[result] = n
        if engine.last_bucket is not None:
            self.bucket.set(engine.last_bucket)

    def finished(self, pending, reason: str) -> None:  # on the engine's thread
        self.finished_by.labels(reason).inc()
        self.generation_tokens.inc(pending.tokens)
        if pending.first_token_at is not None:
            self.ttft.observe(pending.first_token_at - pending.submitted)
            if pending.tokens > 1:
                self.tpot.observe((time.perf_counter() - pending.first_token_at) / (pending.tokens - 1))

    def render(self) -> bytes:
        return generate_latest(self.registry)
