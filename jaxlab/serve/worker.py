"""The engine's own thread: the only caller of :class:`~jaxlab.engine.continuous.Engine`.

HTTP handlers run on the event loop; the engine's steps block for tens of milliseconds each, so they run on a
thread of their own. Handlers talk to it through :meth:`EngineWorker.submit` and :meth:`EngineWorker.abort`
(queued, carried out between two steps); each request's outputs come back on an ``asyncio.Queue`` of the
handler's loop. An abort frees the request's slot and pages before the next step.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from dataclasses import dataclass, field

from jaxlab.engine.continuous import Engine
from jaxlab.errors import JaxlabError


@dataclass
class Delta:
    """What a request got in one step: text, token ids and their logprobs; at the end, why it finished."""

    text: str
    token_ids: list[int]
    logprobs: list[float]
    finished: bool = False
    reason: str | None = None  # "eos", "stop", "length", "abort"
    error: str | None = None  # the engine refused the request, or stopped
    status: int = 200  # with an error: 400 when the request was at fault (the engine's own check), else 500
    total_tokens: int = 0  # generated so far (the completion's usage)
    top: list = field(default_factory=list)  # per new token: [(id, logprob), ...] when top logprobs were asked


@dataclass
class _Pending:
    request_id: str
    kwargs: dict
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue
    submitted: float = field(default_factory=time.perf_counter)
    stream: object = None
    ids_sent: int = 0
    first_token_at: float | None = None
    tokens: int = 0


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

    def submit(self, request_id: str, prompt_ids, **kwargs) -> asyncio.Queue:
        """Queue a request (``Engine.add_request`` keywords); returns the queue its :class:`Delta` s arrive on."""
        loop = asyncio.get_running_loop()
        p = _Pending(request_id, dict(kwargs, prompt_ids=list(prompt_ids)), loop, asyncio.Queue())
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

    def _send(self, p: _Pending, delta: Delta) -> None:
        try:
            p.loop.call_soon_threadsafe(p.out.put_nowait, delta)
        except RuntimeError:  # the handler's loop is closed: nobody is listening
            pass

    def _end(self, p: _Pending, reason: str, text: str = "") -> None:
        self._pending.pop(p.request_id, None)
        self._send(p, Delta(text, [], [], True, reason, total_tokens=p.tokens))
        if self.on_finish is not None:
            self.on_finish(p, reason)

    def _handle(self, kind: str, item) -> None:
        if kind == "add":
            p: _Pending = item
            try:
                p.stream = self.engine.add_request(request_id=p.request_id, **p.kwargs)
            except JaxlabError as e:  # the engine's own check (a request that cannot fit)
                self._send(p, Delta("", [], [], True, "error", error=str(e), status=400))
                return
            except Exception as e:  # a bug of ours: this request fails, the engine goes on
                self._send(p, Delta("", [], [], True, "error", error=f"{type(e).__name__}: {e}", status=500))
                return
            self._pending[p.request_id] = p
        elif kind == "abort":
            p = self._pending.get(item)
            if p is not None and self.engine.abort(item):
                self._end(p, "abort")
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
                    if p is None:
                        continue
                    ids = p.stream.token_ids[p.ids_sent :]
                    lp = p.stream.logprobs[p.ids_sent :] if p.stream.logprobs is not None else []
                    top = p.stream.top_logprobs[p.ids_sent :] if p.stream.top_logprobs is not None else []
                    p.ids_sent = p.tokens = len(p.stream.token_ids)
                    if ids and p.first_token_at is None:
                        p.first_token_at = now
                    delta = Delta(
                        o.text, list(ids), list(lp), o.finished, o.finish_reason, total_tokens=p.tokens, top=top
                    )
                    if o.finished:
                        self._pending.pop(o.request_id, None)
                    self._send(p, delta)
                    if o.finished and self.on_finish is not None:
                        self.on_finish(p, o.finish_reason)
                if self.on_step is not None:
                    self.on_step(self.engine)
        except BaseException as e:  # a bug: every waiting request learns of it instead of hanging
            self.error = e
            for p in list(self._pending.values()):
                self._send(p, self._stopped())
            self._pending.clear()
            self._fail_inbox()  # and so do the requests sent but not yet taken

    def _stopped(self) -> Delta:
        e = self.error
        return Delta("", [], [], True, "error", error=f"the engine stopped: {type(e).__name__}: {e}", status=500)

    def _fail_inbox(self) -> None:
        while True:
            try:
                kind, item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                self._send(item, self._stopped())
