"""A server on a thread of this process: what a notebook (or a test) starts to talk to ``jaxlab serve``'s app
without a second process. The same app, the same uvicorn; only SIGTERM draining is ``jaxlab serve``'s alone."""

from __future__ import annotations

import threading
import time

from jaxlab.errors import JaxlabError
from jaxlab.serve.app import ServeOptions, build_app


class BackgroundServer:
    """uvicorn serving :func:`~jaxlab.serve.app.build_app` over ``engine`` on ``host:port`` (port 0: a free one),
    on a daemon thread. ``url`` is its address once :meth:`start` returns; :meth:`stop` ends it (also on ``with``
    exit). ``state`` is the app's :class:`~jaxlab.serve.app.Server` (engine, worker, metrics)."""

    def __init__(self, engine, options: ServeOptions | None = None, host: str = "127.0.0.1", port: int = 0):
        import uvicorn

        self.app = build_app(engine, options or ServeOptions())
        self.state = self.app.state.server
        self.server = uvicorn.Server(
            uvicorn.Config(self.app, host=host, port=port, log_level="warning", proxy_headers=False)
        )
        self.thread = threading.Thread(target=self.server.run, name="jaxlab-serve", daemon=True)
        self.host, self.url = host, None

    def start(self, timeout: float = 60.0) -> "BackgroundServer":
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive():
                raise JaxlabError("the server thread stopped while starting (is the port in use?)")
            if time.monotonic() > deadline:
                raise JaxlabError(f"the server did not start within {timeout:g} s")
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://{self.host}:{port}"
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self.server.should_exit = True
        if self.thread.is_alive():
            self.thread.join(timeout)

    def __enter__(self):
        return self.start() if self.url is None else self

    def __exit__(self, *exc):
        self.stop()
