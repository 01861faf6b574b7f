"""The HTTP face: an OpenAI-compatible ASGI app (Starlette) over the continuous-batching engine.

Endpoints: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models``, ``GET /health``,
``GET /metrics`` (Prometheus text) and the chat page at ``/``. Every error is a JSON body in OpenAI's shape
with its status (:mod:`jaxlab.serve.protocol`); the server keeps serving after each.

Limits, each checked before a request reaches the engine: the ``Host`` and ``Origin`` headers
(:mod:`jaxlab.serve.hardening`: 400, 403), the body size (413), the API key when one is set (401; ``/metrics``
too unless ``--open-metrics``; a client's wrong keys are throttled, 429), a per-client rate limit when one is set
(429 with ``Retry-After``), draining after SIGTERM (503). A request
that runs past the request timeout is aborted and answered 504 (the server gave up waiting for its own
engine, the meaning of "gateway timeout"; 408 would blame the client). A client that disconnects has its
request aborted: slot and pages free before the next step.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from dataclasses import dataclass
from importlib import resources

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from jaxlab.engine.continuous import MAX_DRAFTS
from jaxlab.errors import InvalidRequestError
from jaxlab.serve import protocol
from jaxlab.serve.hardening import PAGE_HEADERS, Hardening, allowed_hosts
from jaxlab.serve.metrics import Metrics
from jaxlab.serve.protocol import ApiError
from jaxlab.serve.worker import EngineWorker, Failed

FINISH = {"eos": "stop", "stop": "stop", "length": "length", "abort": "abort"}


@dataclass
class ServeOptions:
    """The server's settings (the flags of ``jaxlab serve`` beside the model's), checked when built: a value that
    cannot work raises :class:`~jaxlab.errors.InvalidRequestError` naming its flag. ``slots`` and ``context`` size
    the engine ``jaxlab serve`` builds; ``host`` and ``port`` are where :func:`jaxlab.serve.serve` listens
    (:func:`build_app` serves the engine it is given, wherever it is mounted)."""

    model_name: str = "smollm2-135m"  # the model's id in the API (see served_name)
    api_key: str | None = None
    rate_limit: float | None = None  # requests per minute per key (or per client address without a key)
    max_body_bytes: int = 1 << 20
    request_timeout: float = 600.0
    grace_seconds: float = 10.0  # after SIGTERM: in-flight requests may finish for this long
    slots: int = 8  # --max-batch: rows of one decode call (its largest row bucket)
    max_running: int = 64  # --max-running: requests that may run at once, if the KV memory holds them
    kv_tokens: int | None = None  # --kv-tokens: the KV budget in positions (default: --max-batch x --context)
    kv_memory: float | None = None  # --kv-memory: the KV budget as a fraction of the memory free at start
    context: int = 2048  # positions per request (the model's own context caps it)
    speculative: int = 0  # --speculative ngram --draft-k K: prompt-lookup drafts per greedy request and step (0: off)
    overlap: bool = True  # --no-overlap: False waits for each decode step's tokens before launching the next
    host: str = "127.0.0.1"
    port: int = 8000
    allowed_hosts: tuple[str, ...] = ()  # --allowed-hosts: Host names answered besides loopback and host ("*": any)
    cors: tuple[str, ...] = ()  # --cors: origins whose pages may call the server ("*": any)
    open_metrics: bool = False  # --open-metrics: /metrics without the API key when keys are on
    max_queue: int = 256  # --max-queue: requests admitted at once (running and waiting); more are answered 503
    body_timeout: float = 10.0  # --body-timeout: seconds a client may take to send its body (408 after)

    def __post_init__(self):
        for flag, value in (
            ("--max-batch", self.slots),
            ("--max-running", self.max_running),
            ("--context", self.context),
            ("--max-body-bytes", self.max_body_bytes),
            ("--max-queue", self.max_queue),
        ):
            if value < 1:
                raise InvalidRequestError(f"{flag} must be >= 1, got {value}")
        if self.kv_tokens is not None and self.kv_memory is not None:
            raise InvalidRequestError("give the KV budget once: --kv-tokens or --kv-memory, not both")
        if self.kv_tokens is not None and self.kv_tokens < self.context:
            raise InvalidRequestError(
                f"--kv-tokens {self.kv_tokens} cannot hold one request of --context {self.context}: give at least that"
            )
        if self.kv_memory is not None and not 0 < self.kv_memory < 1:
            raise InvalidRequestError(f"--kv-memory is a fraction of the free memory in (0, 1), got {self.kv_memory}")
        if not 0 <= self.speculative <= MAX_DRAFTS:
            raise InvalidRequestError(f"--draft-k must be in 1..{MAX_DRAFTS}, got {self.speculative}")
        if not 0 < self.port < 65536:
            raise InvalidRequestError(f"--port must be in 1..65535, got {self.port}")
        if not self.body_timeout > 0:
            raise InvalidRequestError(f"--body-timeout must be > 0 seconds, got {self.body_timeout}")
        if self.rate_limit is not None and self.rate_limit <= 0:
            raise InvalidRequestError(f"--rate-limit must be > 0 requests per minute, got {self.rate_limit}")


def served_name(model) -> str:
    """The model's id in the API for ``--model``: the embedded model's short name, else the file's or folder's
    name."""
    from pathlib import Path

    from jaxlab.io.assets import DEFAULT_MODEL

    return DEFAULT_MODEL if model in (None, DEFAULT_MODEL) else Path(str(model).rstrip("/")).stem


class RateLimiter:
    """A token bucket per key: ``per_minute`` requests a minute, bursts up to that many. At most ``max_keys``
    buckets are kept, so a flood of new clients costs bounded memory: full buckets are dropped first (they hold
    nothing a new one would not), else the least recently used."""

    def __init__(self, per_minute: float, max_keys: int = 10_000):
        self.per_minute, self.rate, self.capacity = per_minute, per_minute / 60.0, max(1.0, per_minute)
        self.buckets: dict[str, tuple[float, float]] = {}
        self.max_keys = max_keys

    def take(self, key: str) -> float:
        """0 if the request may go, else the seconds until it may."""
        now = time.monotonic()
        tokens, last = self.buckets.pop(key, (self.capacity, now))  # popped: re-inserted last, so the dict is by age
        tokens = min(self.capacity, tokens + (now - last) * self.rate)
        if len(self.buckets) >= self.max_keys:
            self._evict(now)
        if tokens >= 1:
            self.buckets[key] = (tokens - 1, now)
            return 0.0
        self.buckets[key] = (tokens, now)
        return (1 - tokens) / self.rate

    def _evict(self, now: float) -> None:
        full = [k for k, (t, last) in self.buckets.items() if t + (now - last) * self.rate >= self.capacity]
        for k in full or [next(iter(self.buckets))]:
            del self.buckets[k]


#: Wrong API keys a client may send a minute before its failures are answered 429 (with keys on, always)
FAILED_KEYS_PER_MINUTE = 10


def too_many(what: str, wait: float) -> ApiError:
    """A 429 that says why and when to come back (``Retry-After``, whole seconds, at least 1)."""
    return ApiError(
        429,
        f"{what}: retry in {wait:.1f} s",
        type="rate_limit_error",
        code="rate_limit_exceeded",
        headers={"Retry-After": str(max(1, int(wait + 0.999)))},
    )


def error_response(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


class Server:
    """The app's state: the engine's worker, the tokenizer, the limits and the metrics."""

    def __init__(self, engine, options: ServeOptions):
        self.engine, self.options = engine, options
        self.tokenizer, self.config = engine.tokenizer, engine.config
        self.metrics = Metrics(engine)
        self.worker = EngineWorker(
            engine, on_finish=self.finished, on_step=self.metrics.step, on_change=self.metrics.gauges
        )
        self.limiter = RateLimiter(options.rate_limit) if options.rate_limit else None
        self.failures = RateLimiter(FAILED_KEYS_PER_MINUTE)  # wrong API keys, per client
        self.draining = False
        self.started = time.time()
        self.admitted: set[str] = set()  # requests submitted and not yet answered (the queue --max-queue bounds)

    # ---- checks every request passes ---------------------------------------------------------------

    def _key(self, request: Request) -> str:
        auth = request.headers.get("authorization", "")
        return auth[7:].strip() if auth.lower().startswith("bearer ") else ""

    def check_key(self, request: Request) -> tuple[str, str]:
        """(the request's key, its client's address), or a 401 (429 after too many wrong keys from one client)."""
        key = self._key(request)
        client = request.client.host if request.client else "?"  # the socket's peer: forwarded headers are off
        # as bytes: compare_digest refuses str with non-ASCII characters (a header is read as latin-1)
        if self.options.api_key is not None and not hmac.compare_digest(
            key.encode("latin-1", "replace"), self.options.api_key.encode("utf-8")
        ):
            wait = self.failures.take(client)
            if wait > 0:
                raise too_many(f"{FAILED_KEYS_PER_MINUTE:g} wrong API keys a minute from this client", wait)
            raise ApiError(
                401,
                "missing or wrong API key: send 'Authorization: Bearer <key>' with the key the server was started with",
                type="authentication_error",
                code="invalid_api_key",
            )
        return key, client

    def guard(self, request: Request) -> None:
        if self.draining:
            raise ApiError(503, "the server is shutting down: retry on another instance", type="unavailable")
        if not self.worker.alive:
            raise ApiError(503, f"the engine stopped ({self.worker.error!r}): restart the server", type="server_error")
        key, client = self.check_key(request)
        if self.limiter is not None:
            # the client, and with keys on the key too: a made-up token is not a new bucket without keys
            who = f"{client} {key}" if self.options.api_key is not None else client
            wait = self.limiter.take(who)
            if wait > 0:
                raise too_many(f"rate limit of {self.limiter.per_minute:g} requests per minute reached", wait)

    def finished(self, pending, reason: str) -> None:
        """On the engine's thread, when a request ends: its metrics, and its place in the queue freed (also for a
        stream whose handler never ran; ``set.discard`` is one atomic step)."""
        self.metrics.finished(pending, reason)
        self.admitted.discard(pending.request_id)

    def admit(self) -> None:
        """503 with ``Retry-After`` when ``--max-queue`` requests are already admitted."""
        if len(self.admitted) >= self.options.max_queue:
            raise ApiError(
                503,
                f"the server is full ({len(self.admitted)} requests admitted, --max-queue {self.options.max_queue}): "
                "retry shortly",
                type="unavailable",
                code="overloaded",
                headers={"Retry-After": "1"},
            )

    async def body(self, request: Request) -> bytes:
        limit = self.options.max_body_bytes
        declared = request.headers.get("content-length")
        too_big = ApiError(413, f"the request body is over {limit} bytes: send a shorter one", code="body_too_large")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise too_big
        raw = bytearray()

        async def read():
            async for part in request.stream():
                raw.extend(part)
                if len(raw) > limit:
                    raise too_big

        try:
            await asyncio.wait_for(read(), self.options.body_timeout)
        except asyncio.TimeoutError:
            raise ApiError(
                408,
                f"the request body did not arrive within {self.options.body_timeout:g} s: send it whole",
                code="body_timeout",
            ) from None
        except ClientDisconnect:  # the client left mid-body: nobody reads the answer, nothing to log
            raise ApiError(400, "the client disconnected while sending its body", code="client_disconnected") from None
        return bytes(raw)

    # ---- generation --------------------------------------------------------------------------------

    def parse(self, body: dict, kind: str) -> protocol.Request:
        return protocol.parse_request(
            body,
            kind,
            model_name=self.options.model_name,
            tokenizer=self.tokenizer,
            context=self.engine.context,
            vocab_size=self.config.vocab_size,
        )

    def submit(self, req: protocol.Request) -> asyncio.Queue:
        self.admitted.add(req.id)
        self.metrics.started(req)
        return self.worker.submit(req.id, req.generation)

    async def next_delta(self, req, out: asyncio.Queue, request: Request, deadline: float):
        """The request's next :class:`~jaxlab.engine.continuous.RequestOutput`; aborts it and raises on a disconnect
        (None) or past the deadline (504), or with the error the engine gave (:class:`~jaxlab.serve.worker.Failed`)."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.worker.abort(req.id)
                raise ApiError(
                    504,
                    f"the request ran past the server's timeout of {self.options.request_timeout:g} s and was "
                    "cancelled: ask for fewer tokens or retry later",
                    type="timeout",
                    code="timeout",
                )
            try:
                delta = await asyncio.wait_for(out.get(), min(left, 0.5))
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    self.worker.abort(req.id)
                    return None
                continue
            if isinstance(delta, Failed):
                raise ApiError(
                    delta.status, delta.error, type="invalid_request_error" if delta.status == 400 else "server_error"
                )
            return delta

    async def complete(self, req, request: Request) -> Response:
        try:
            return await self._complete(req, request)
        finally:
            self.admitted.discard(req.id)

    async def _complete(self, req, request: Request) -> Response:
        out = self.submit(req)
        deadline = time.monotonic() + self.options.request_timeout
        text, pieces, values, tops = [], [], [], []
        while True:
            delta = await self.next_delta(req, out, request, deadline)
            # next_delta looks for a disconnect only while no token comes; tokens may come every step
            if delta is None or (not delta.finished and await request.is_disconnected()):
                self.worker.abort(req.id)
                return Response(status_code=499)  # the client is gone; nobody reads this
            text.append(delta.text)
            pieces += delta.token_texts  # each token's own text, with logprobs asked (the engine's, as is)
            values += delta.logprobs
            tops += delta.top
            if delta.finished:
                n = delta.total_tokens
                reason = FINISH.get(delta.finish_reason, delta.finish_reason)
                body = protocol.response(req, "".join(text), reason, n, pieces, values, tops)
                return JSONResponse(body)

    def stream(self, req, request: Request) -> StreamingResponse:
        out = self.submit(req)
        deadline = time.monotonic() + self.options.request_timeout

        def event(obj) -> str:
            return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"

        async def events():
            finished = False
            try:
                if req.kind == "chat":  # OpenAI's first chunk: the role, no content
                    yield event(protocol.chunk(req, "", None, first=True))
                while True:
                    try:
                        delta = await self.next_delta(req, out, request, deadline)
                    except ApiError as e:  # headers are sent: the error travels as an event
                        yield event(e.body())
                        break
                    if delta is None:
                        return
                    if delta.text or delta.token_texts:
                        yield event(
                            protocol.chunk(
                                req, delta.text, None, pieces=delta.token_texts, values=delta.logprobs, tops=delta.top
                            )
                        )
                    if delta.finished:
                        finished = True
                        yield event(protocol.chunk(req, None, FINISH.get(delta.finish_reason, delta.finish_reason)))
                        if req.include_usage:
                            yield event(protocol.usage_chunk(req, delta.total_tokens))
                        break
                yield "data: [DONE]\n\n"
            finally:
                self.admitted.discard(req.id)
                if not finished:  # a disconnect (the task is cancelled) or an error: free the slot and pages
                    self.worker.abort(req.id)

        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(events(), media_type="text/event-stream", headers=headers)

    async def generate(self, request: Request, kind: str) -> Response:
        endpoint = "chat" if kind == "chat" else "completions"
        try:
            self.guard(request)
            self.admit()
            raw = await self.body(request)
            # JSON and the prompt's tokens off the event loop, in one hop: a large body stalls no other stream
            req = await asyncio.to_thread(lambda: self.parse(protocol.parse_json(raw), kind))
            self.admit()  # again: others may have been admitted while this one's body arrived
            response = self.stream(req, request) if req.stream else await self.complete(req, request)
        except ApiError as e:
            self.metrics.request(endpoint, e.status)
            return error_response(e)
        self.metrics.request(endpoint, response.status_code)
        return response


def build_app(engine, options: ServeOptions | None = None) -> Starlette:
    """The ASGI app over ``engine`` (a :class:`~jaxlab.engine.continuous.Engine` with a tokenizer). The engine's
    thread starts with the app (lifespan) and stops with it."""
    options = options or ServeOptions()
    server = Server(engine, options)

    async def chat(request):
        return await server.generate(request, "chat")

    async def completions(request):
        return await server.generate(request, "completion")

    async def models(request):
        try:
            server.guard(request)
        except ApiError as e:
            return error_response(e)
        card = {"id": options.model_name, "object": "model", "created": int(server.started), "owned_by": "jaxlab"}
        return JSONResponse({"object": "list", "data": [card]})

    async def health(request):
        ok = server.worker.alive and not server.draining
        state = "ok" if ok else ("draining" if server.draining else "engine stopped")
        return JSONResponse({"status": state, "in_flight": server.worker.in_flight}, status_code=200 if ok else 503)

    async def metrics(request):
        if not options.open_metrics:  # behind the key when keys are on (--open-metrics: for a scraper without it)
            try:
                server.check_key(request)
            except ApiError as e:
                return error_response(e)
        return PlainTextResponse(server.metrics.render(), media_type="text/plain; version=0.0.4")

    async def page(request):
        html = resources.files("jaxlab.serve").joinpath("chat.html").read_text(encoding="utf-8")
        return HTMLResponse(html, headers=PAGE_HEADERS)

    async def http_error(request, exc: HTTPException):
        codes = {
            404: ("not_found", "no such endpoint: see GET /v1/models, POST /v1/chat/completions, POST /v1/completions")
        }
        code, message = codes.get(exc.status_code, (None, exc.detail))
        if exc.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}"
        return error_response(ApiError(exc.status_code, message, code=code))

    async def internal_error(request, exc: Exception):
        return error_response(ApiError(500, f"internal error: {type(exc).__name__}: {exc}", type="server_error"))

    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app):
        server.worker.start()
        try:
            yield
        finally:
            server.worker.abort_all()
            server.worker.stop()

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
            Route("/", page, methods=["GET"]),
        ],
        exception_handlers={HTTPException: http_error, Exception: internal_error},
        middleware=[Middleware(Hardening, hosts=allowed_hosts(options.host, options.allowed_hosts), cors=options.cors)],
        lifespan=lifespan,
    )
    app.state.server = server
    return app
