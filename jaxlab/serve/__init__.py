"""``jaxlab serve``: an OpenAI-compatible HTTP server with a chat page, over the continuous-batching engine.

* :mod:`jaxlab.serve.protocol` — OpenAI's request fields, checked; responses and stream chunks;
* :mod:`jaxlab.serve.worker` — the engine's own thread, fed between steps;
* :mod:`jaxlab.serve.app` — the Starlette app: endpoints, limits, streaming, disconnects;
* :mod:`jaxlab.serve.metrics` — Prometheus metrics;
* :mod:`jaxlab.serve.background` — the same app on a thread of this process (notebooks, tests);
* ``chat.html`` — the chat page served at ``/``.

Starlette and uvicorn (see the README for why): a small ASGI toolkit whose streaming response notices a client
that goes away, and the ASGI server that runs it, driven here so that SIGTERM drains instead of cutting.
"""

from __future__ import annotations

import signal
import sys
import threading
import time

from jaxlab.serve.app import ServeOptions, build_app, served_name
from jaxlab.serve.background import BackgroundServer

__all__ = ["BackgroundServer", "ServeOptions", "build_app", "engine_for", "serve", "served_name"]


def engine_for(params, tokenizer, options: ServeOptions, cache_dtype=None):
    """The continuous-batching engine ``jaxlab serve`` runs: decode calls of at most ``--max-batch`` rows in row
    buckets, up to ``--max-running`` requests at once, admitted by the KV memory: ``--kv-tokens`` positions, or
    ``--kv-memory`` of the memory free now (:func:`jaxlab.tools.hardware.free_memory_bytes`), or by default
    ``--max-batch`` x ``--context`` (the pool a fixed-slot server had). ``--speculative ngram``: each greedy request
    carries up to ``--draft-k`` prompt-lookup drafts per step. ``--no-overlap``: each decode step waits for the last
    one's tokens on the host (the engine's look-ahead off)."""
    from jaxlab.engine.continuous import Engine
    from jaxlab.errors import JaxlabError
    from jaxlab.tools import hardware

    context = min(options.context, params.config.max_seq_len)
    budget = {"kv_tokens": options.kv_tokens or options.slots * context}
    if options.kv_memory is not None:
        free = hardware.free_memory_bytes()
        if free is None:
            raise JaxlabError("--kv-memory: this machine does not say how much memory is free; give --kv-tokens")
        budget = {"kv_bytes": int(free * options.kv_memory)}
    return Engine(
        params,
        tokenizer,
        slots=options.slots,
        max_running=options.max_running,
        context=context,
        cache_dtype=cache_dtype,
        decode_buckets=True,
        speculative=options.speculative,
        overlap=options.overlap,
        **budget,
    )


def serve(engine, options: ServeOptions, host: str | None = None, port: int | None = None, log=None) -> int:
    """Run the app over ``engine`` until SIGINT (stop now) or SIGTERM (drain: new requests get 503, requests in
    flight get ``options.grace_seconds`` to finish, then are aborted). ``host``, ``port``: where to listen
    (default: ``options.host``, ``options.port``)."""
    import uvicorn

    host = options.host if host is None else host
    port = options.port if port is None else port

    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    app = build_app(engine, options)
    server_state = app.state.server

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig, frame):
            if sig != signal.SIGTERM or server_state.draining:
                self.should_exit = True  # SIGINT, or a second SIGTERM: stop now
                return
            server_state.draining = True
            log(
                f"jaxlab serve: SIGTERM: draining ({server_state.worker.in_flight} in flight, grace "
                f"{options.grace_seconds:g} s)"
            )

            def drain():
                end = time.monotonic() + options.grace_seconds
                while server_state.worker.in_flight and time.monotonic() < end:
                    time.sleep(0.05)
                if server_state.worker.in_flight:
                    log(f"jaxlab serve: grace over: aborting {server_state.worker.in_flight} requests")
                    server_state.worker.abort_all()
                    time.sleep(0.2)  # the aborts reach their streams before the server closes them
                self.should_exit = True

            threading.Thread(target=drain, daemon=True).start()

        async def startup(self, sockets=None):
            await super().startup(sockets)
            if self.started:
                log(
                    f"jaxlab serve: listening on http://{host}:{port} — model {options.model_name}, "
                    f"up to {engine.max_running} requests in {engine.pool.capacity * engine.page_size} KV positions, "
                    f"decode calls of up to {engine.slots} rows, context {engine.context}; chat page at /"
                )

    # proxy_headers off: X-Forwarded-For from loopback would name any client the sender likes (the rate limit is
    # per client); behind a real proxy, put the limit in the proxy
    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=5, proxy_headers=False
    )
    DrainingServer(config).run()
    return 0
