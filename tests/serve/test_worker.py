"""The engine's thread: a request the engine refuses is answered 400, a bug in one request 500, and the thread
goes on serving (no model needed)."""

from __future__ import annotations

import asyncio

from jaxlab.engine.continuous import RequestOutput
from jaxlab.engine.plan import GenerationRequest
from jaxlab.errors import InvalidRequestError
from jaxlab.serve.worker import EngineWorker


def req(*ids):
    return GenerationRequest(ids, 4)


class RefusingEngine:
    has_work = False

    def add_request(self, request, request_id=None):
        if request.prompt_ids == (0,):
            raise InvalidRequestError("the request needs 99 pages, the pool holds 8")
        raise RuntimeError("a bug")


def test_refused_and_broken_requests_get_their_status_and_the_thread_goes_on():
    async def main():
        worker = EngineWorker(RefusingEngine()).start()
        try:
            refused = await asyncio.wait_for(worker.submit("a", req(0)).get(), 10)
            broken = await asyncio.wait_for(worker.submit("b", req(1)).get(), 10)
            return refused, broken, worker.alive, worker.in_flight
        finally:
            worker.stop()

    refused, broken, alive, in_flight = asyncio.run(main())
    assert (refused.finished, refused.status, refused.finish_reason) == (
        True,
        400,
        "error",
    ) and "pages" in refused.error
    assert (broken.status, broken.error) == (500, "RuntimeError: a bug")
    assert alive and in_flight == 0


class CrashingEngine:
    """Takes requests; its first step waits for ``release`` and then raises, as a bug in a step would."""

    def __init__(self):
        import threading

        self.release, self.stepping, self.added = threading.Event(), threading.Event(), []

    @property
    def has_work(self):
        return bool(self.added)

    def add_request(self, request, request_id=None):
        self.added.append(request_id)
        return object()

    def step(self):
        self.stepping.set()
        self.release.wait(10)
        raise RuntimeError("a bug in the step")


def test_a_crash_fails_the_running_the_queued_and_the_later_requests_at_once():
    async def main():
        engine = CrashingEngine()
        worker = EngineWorker(engine).start()
        try:
            running = worker.submit("a", req(1))
            await asyncio.get_running_loop().run_in_executor(None, engine.stepping.wait, 10)
            queued = worker.submit("b", req(1))  # sent while the step runs: still in the inbox when it crashes
            engine.release.set()
            got = [await asyncio.wait_for(q.get(), 5) for q in (running, queued)]
            later = await asyncio.wait_for(worker.submit("c", req(1)).get(), 5)  # sent after: answered at once
            return got + [later], worker.alive
        finally:
            worker.stop()

    deltas, alive = asyncio.run(main())
    assert not alive
    for d in deltas:
        assert (d.finished, d.status) == (
            True,
            500,
        ) and d.error == "the engine stopped: RuntimeError: a bug in the step"


class IdleEngine:
    has_work = False

    def __init__(self):
        self.aborted = []

    def add_request(self, request, request_id=None):
        return object()

    def abort(self, request_id):
        self.aborted.append(request_id)
        return RequestOutput(request_id, [], "", True, "abort")


def test_an_abort_updates_the_gauges_without_waiting_for_a_step():
    changes = []

    async def main():
        engine = IdleEngine()
        worker = EngineWorker(engine, on_change=changes.append).start()
        try:
            out = worker.submit("a", req(1))
            worker.abort("a")
            return await asyncio.wait_for(out.get(), 5), engine
        finally:
            worker.stop()

    delta, engine = asyncio.run(main())
    assert (delta.finished, delta.finish_reason) == (True, "abort") and engine.aborted == ["a"]
    assert changes and all(c is engine for c in changes)  # the metrics' gauges were refreshed with no step run


def test_the_serving_engine_is_sized_by_its_kv_flags():
    """``jaxlab serve``'s engine: up to --max-running requests, decode calls of --max-batch rows, and a KV pool of
    --kv-tokens positions, of --kv-memory of the free memory, or by default --max-batch x --context; the look-ahead
    on unless --no-overlap."""
    from jaxlab.engine.model import init_params
    from jaxlab.engine.paged import paged_cache_bytes
    from jaxlab.io.config import tiny
    from jaxlab.serve import ServeOptions, engine_for
    from jaxlab.tools import hardware

    params = init_params(tiny(), 0)
    cfg, ctx = params.config, min(64, params.config.max_seq_len)
    default = engine_for(params, None, ServeOptions(slots=4, max_running=12, context=ctx))
    assert (default.slots, default.max_running, default.runner.decode_buckets, default.overlap) == (4, 12, True, True)
    assert not engine_for(params, None, ServeOptions(slots=4, context=ctx, overlap=False)).overlap  # --no-overlap
    assert default.pool.capacity * default.page_size == 4 * ctx
    given = engine_for(params, None, ServeOptions(slots=4, context=ctx, kv_tokens=10 * ctx))
    assert given.pool.capacity * given.page_size == 10 * ctx
    fraction = 1e-4
    by_memory = engine_for(params, None, ServeOptions(slots=4, context=ctx, kv_memory=fraction))
    page = paged_cache_bytes(cfg, 1, by_memory.page_size, by_memory.cache_dtype)
    want = int(hardware.free_memory_bytes() * fraction) // page - 1
    assert abs(by_memory.pool.capacity - want) <= max(2, want // 50)  # the free memory moves a little between reads


def test_metrics_count_preemptions_and_show_the_pool_and_bucket():
    """/metrics' engine figures after each step: preemptions (a counter that follows the scheduler's), pages held of
    the pool's, the row bucket of the last decode call, and speculative drafts proposed and kept."""
    from jaxlab.engine.continuous import Engine
    from jaxlab.engine.model import init_params
    from jaxlab.io.config import tiny
    from jaxlab.serve.metrics import Metrics

    engine = Engine(
        init_params(tiny(), 0),
        slots=3,
        page_size=4,
        chunk=8,
        context=64,
        num_pages=1 + 12,
        watermark=None,
        speculative=2,
    )
    metrics = Metrics(engine)

    def value(name):
        line = next(x for x in metrics.render().decode().splitlines() if x.startswith(name + " "))
        return float(line.split()[-1])

    for i in range(3):
        engine.add_request([1] + [5 + i] * 20, max_new_tokens=14, ignore_eos=True)
    held = 0
    while engine.has_work:
        engine.step()
        metrics.step(engine)
        assert value("jaxlab_preemptions_total") == engine.scheduler.preemptions
        assert value("jaxlab_draft_tokens_total") == engine.drafted
        assert value("jaxlab_draft_tokens_accepted_total") == engine.accepted
        held = max(held, value("jaxlab_kv_pages_held"))
    assert engine.scheduler.preemptions > 0 and held == 12 and value("jaxlab_kv_pages_total") == 12
    assert value("jaxlab_decode_bucket_rows") == 3 and value("jaxlab_kv_pages_held") == 0
    assert 0 < engine.accepted <= engine.drafted


def test_metrics_count_the_decode_calls_launched_a_step_early():
    """/metrics' look-ahead counter follows the engine's: calls the next step took, and dropped."""
    from jaxlab.engine.continuous import Engine
    from jaxlab.engine.model import init_params
    from jaxlab.io.config import tiny
    from jaxlab.serve.metrics import Metrics

    engine = Engine(init_params(tiny(), 0), slots=2, page_size=4, chunk=8, context=64)
    metrics = Metrics(engine)

    def value(result):
        line = f'jaxlab_lookahead_calls_total{{result="{result}"}} '
        return float(next(x for x in metrics.render().decode().splitlines() if x.startswith(line)).split()[-1])

    for i in range(2):
        engine.add_request([1] + [5 + i] * 9, max_new_tokens=12 + 5 * i, ignore_eos=True)
    while engine.has_work:
        engine.step()
        metrics.step(engine)
    assert engine.ahead_steps["used"] > 5 and value("used") == engine.ahead_steps["used"]


class OneTokenEngine:
    """Hands each request two outputs: a token, then a finished one."""

    def __init__(self):
        self.requests, self.made = {}, []

    @property
    def has_work(self):
        return bool(self.requests)

    def add_request(self, request, request_id=None):
        self.requests[request_id] = 0
        return object()

    def step(self):
        out = []
        for rid, n in list(self.requests.items()):
            out.append(RequestOutput(rid, [7], "x", n == 1, "length" if n == 1 else None, total_tokens=n + 1))
            self.requests[rid] = n + 1
            if n == 1:
                del self.requests[rid]
        self.made += out
        return out


def test_the_worker_forwards_the_engines_outputs_as_they_are():
    """The server gets the engine's own output records (no second record of a request's tokens, no re-slicing),
    and the metrics see the tokens and the finish."""
    finished = []

    async def main():
        engine = OneTokenEngine()
        worker = EngineWorker(engine, on_finish=lambda p, reason: finished.append((p.tokens, reason))).start()
        try:
            out = worker.submit("a", req(1))
            return [await asyncio.wait_for(out.get(), 5) for _ in range(2)], engine
        finally:
            worker.stop()

    got, engine = asyncio.run(main())
    assert len(got) == 2 and all(g is m for g, m in zip(got, engine.made))
    assert finished == [(2, "length")]
