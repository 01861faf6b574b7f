"""The engine's own thread: the only caller of :class:`~jaxlab.engine.continuous.Engine`.

HTTP handlers run on the event loop; the engine's steps block for tens of milliseconds each, so they run on a
thread of their own. Handlers talk to it through :meth:`EngineWorker.submit` (a request checked already, by
:func:`~jaxlab.engine.plan.check_generation`) and :meth:`EngineWorker.abort` (queued, carried out between two
steps); each request's :class:`~jaxlab.engine.continuous.RequestOutput` s come back, as the engine made them, on an
``asyncio.Queue`` of the handler's loop. An abort frees the request's slot and pages before the next step.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from dataclasses import dataclass, field

from jaxlab.engine.continuous import Engine, RequestOutput
from jaxlab.engine.plan import GenerationRequest
from jaxlab.errors import JaxlabError


@dataclass
class Failed:
    """A request the engine refused (status 400: the engine's own check) or could not run (500), in place of its
    :class:`~jaxlab.engine.continuous.RequestOutput` s."""

    error: str
    status: int = 500
    finished: bool = True
    finish_reason: str = "error"


@dataclass
class _Pending:
    request_id: str
    request: GenerationRequest
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue
    submitted: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    tokens: int = 0  # generated so far (the metrics' count)


class EngineWorker:
    """Runs ``engine.step()`` on its own thread while there is work; carries out submits and aborts between
    steps. ``on_finish(pending)`` (optional) is called on the engine thread when a request ends, ``on_step(engine)``
    after each step and ``on_change(engine)`` after submits and aborts were carried out between steps: metrics."""

    def __init__(self, engine: Engine, on_finish=None, on_step=None, on_change=None):
        self.engine = engine
        self.on_finish, self.on_step, self.on_change = on_finish, on_step, on_change
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._pending: dict[str, _Pending] = {}
        self._thread = threading.Thread(target=self.run, name="jaxlab-engine", daemon=True)
        self.error: BaseException | None = None

    # ---- the event loop's side -------------------------------------------------------------------

    def start(self) -> EngineWorker:
        self._thread.start()
        return self

    def submit(self, request_id: str, request: GenerationRequest) -> asyncio.Queue:
        """Queue a checked request; returns the queue its outputs arrive on (or one :class:`Failed`)."""
        loop = asyncio.get_running_loop()
        p = _Pending(request_id, request, loop, asyncio.Queue())
        self._inbox.put(("add", p))
        self._wake.set()
        if self.error is not None:  # the engine stopped while this was being sent: fail it now, not at the timeout
            self._fail_inbox()
        return p.out

    def abort(self, request_id: str) -> None:
        self._inbox.put(("abort", request_id))
        self._wake.set()

    def abort_all(self) -> None:
        self._inbox.put(("abort_all", None))
        self._wake.set()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        self._wake.set()
        self._thread.join(timeout)

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    # ---- the engine thread -----------------------------------------------------------------------

    def _send(self, p: _Pending, out: RequestOutput | Failed) -> None:
        try:
            p.loop.call_soon_threadsafe(p.out.put_nowait, out)
        except RuntimeError:  # the handler's loop is closed: nobody is listening
            pass

    def _forward(self, p: _Pending, o: RequestOutput, now: float) -> None:
        """Send one of the engine's outputs on as it is; at the end, the metrics."""
        p.tokens = o.total_tokens
        if o.token_ids and p.first_token_at is None:
            p.first_token_at = now
        if o.finished:
            self._pending.pop(o.request_id, None)
        self._send(p, o)
        if o.finished and self.on_finish is not None:
            self.on_finish(p, o.finish_reason)

    def _handle(self, kind: str, item) -> None:
        if kind == "add":
            p: _Pending = item
            try:
                self.engine.add_request(p.request, request_id=p.request_id)
            except JaxlabError as e:  # the engine's own check (a request that cannot fit)
                self._send(p, Failed(str(e), 400))
                return
            except Exception as e:  # a bug of ours: this request fails, the engine goes on
                self._send(p, Failed(f"{type(e).__name__}: {e}", 500))
                return
            self._pending[p.request_id] = p
        elif kind == "abort":
            p = self._pending.get(item)
            if p is not None:
                o = self.engine.abort(item)
                if o is not None:
                    self._forward(p, o, time.perf_counter())
        elif kind == "abort_all":
            for rid in list(self._pending):
                self._handle("abort", rid)

    def run(self) -> None:
        """The engine's thread (started by :meth:`start`): take what the HTTP side sent (new requests, aborts)
        between steps, run one step of the whole batch, hand each request its new tokens."""
        try:
            while not self._stopping.is_set():
                changed = False
                while True:
                    try:
                        kind, item = self._inbox.get_nowait()
                    except queue.Empty:
                        break
                    self._handle(kind, item)
                    changed = True
                if changed and self.on_change is not None:  # an abort frees a slot now, not at the next step
                    self.on_change(self.engine)
                if not self.engine.has_work:
                    self._wake.wait(0.5)
                    self._wake.clear()
                    continue
                outputs = self.engine.step()
                now = time.perf_counter()
                for o in outputs:
                    p = self._pending.get(o.request_id)
                    if p is not None:
                        self._forward(p, o, now)
                if self.on_step is not None:
                    self.on_step(self.engine)
        except BaseException as e:  # a bug: every waiting request learns of it instead of hanging
            self.error = e
            for p in list(self._pending.values()):
                self._send(p, self._stopped())
            self._pending.clear()
            self._fail_inbox()  # and so do the requests sent but not yet taken

    def _stopped(self) -> Failed:
        e = self.error
        return Failed(f"the engine stopped: {type(e).__name__}: {e}", 500)

    def _fail_inbox(self) -> None:
        while True:
            try:
                kind, item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                self._send(item, self._stopped())
