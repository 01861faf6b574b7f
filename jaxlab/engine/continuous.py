"""Continuous batching over the paged KV cache: the engine a server runs.

Requests come and go between steps: ``add_request`` puts one in the queue and returns its :class:`Stream`;
every :meth:`Engine.step` runs one decode token for each running sequence and prompt chunks under the token
budget (:mod:`jaxlab.engine.scheduler` decides which), then hands each request its new text. A finished
request frees its slot and pages at once and the next one takes them in the following step; ``abort``
frees them within one step.

Compiled shapes are fixed: the decode program takes ``slots`` rows of one token (or a smaller row bucket, with
``decode_buckets``; more running sequences than ``slots`` are decoded in several calls), the prefill program one
row of ``chunk`` tokens, each for a few page-table widths (:attr:`Engine.widths`, a bucket of the longest
row), greedy or sampling. How many sequences run is bounded by ``max_running`` and, with a ``watermark``, by the
KV memory (admission by memory, :mod:`~jaxlab.engine.scheduler`). :meth:`Engine.warmup` compiles them all; after
it no mix of requests compiles anything (a test counts).

**Batch invariance.** Each row computes only from its own tokens and pages, and its random key is derived
from its own seed and position (:func:`~jaxlab.engine.steps.rows_step`); prompt chunks start at multiples
of ``chunk`` whatever else runs; a preempted request is recomputed the way it was computed the first time.
So a request's tokens do not depend on which requests run beside it (a property test checks it over random
arrivals, lengths and preemptions).

**Structured output.** A request may carry a grammar (:class:`~jaxlab.engine.grammar.Constraint`: a JSON schema,
a regex, a list of choices); its matcher lives here on the host, fills the request's row of the step's bitmask
before each step and advances by the token it got after. Free rows pass all ones, so the same programs serve
both, and a preempted request's matcher keeps its place (its replayed tokens are not fed again).
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.engine import paged
from jaxlab.engine.generate import GenerationResult, TextStops
from jaxlab.engine.grammar import Constraint, Matcher, allow_all
from jaxlab.engine.model import Params
from jaxlab.engine.paged import init_paged_cache
from jaxlab.engine.pages import PagePool
from jaxlab.engine.plan import bucket, check_request
from jaxlab.engine.programs import Programs
from jaxlab.engine.sampling import SamplingParams, stack_rows
from jaxlab.engine.scheduler import Scheduler, Seq
from jaxlab.engine.steps import GREEDY, jit_rows
from jaxlab.errors import InvalidRequestError


@dataclass
class RequestOutput:
    """What one step gave one request: new token ids and text, and whether (and why) it finished."""

    request_id: str
    token_ids: list[int]
    text: str
    finished: bool = False
    finish_reason: str | None = None  # "eos", "stop", "length" or "abort"


@dataclass
class Stream:
    """A request's output as it arrives. Iterating yields text pieces, stepping the engine while none is
    ready; ``text``, ``token_ids``, ``finish_reason`` and the timings fill in as it runs."""

    request_id: str
    engine: Engine = field(repr=False)
    prompt_ids: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None  # per token: the most likely (id, logprob) pairs
    text: str = ""
    finished: bool = False
    finish_reason: str | None = None
    arrived: float = 0.0  # perf_counter() when added
    first_token_at: float | None = None
    finished_at: float | None = None
    pieces: deque = field(default_factory=deque, repr=False)

    def __iter__(self) -> Iterator[str]:
        while True:
            while self.pieces:
                yield self.pieces.popleft()
            if self.finished:
                return
            self.engine.step()

    def result(self) -> GenerationResult:
        """Run to the end; the request as a :class:`~jaxlab.engine.generate.GenerationResult`."""
        for _ in self:
            pass
        return GenerationResult(
            prompt_ids=list(self.prompt_ids),
            generated_ids=list(self.token_ids),
            text=self.text,
            finish_reason=self.finish_reason or "length",
            logprobs=self.logprobs,
        )


@dataclass
class _Request:
    seq: Seq
    stream: Stream
    stops: TextStops
    seed: int
    sampling: SamplingParams
    top: int = 0
    matcher: Matcher | None = None  # the request's place in its grammar (structured output), or None


#: the most alternatives a request may ask for with ``top_logprobs`` (OpenAI's limit)
TOP_LOGPROBS = 20


def _row(tops, r: int):
    """Row ``r`` of a step's (top logprobs, their ids), or None when the step did not compute them."""
    return None if tops is None else (tops[0][r], tops[1][r])


PAGE_SIZE = 16  # positions per page
CHUNK = 64  # prompt tokens per prefill call


#: Decode row buckets (what vLLM's and SGLang's captured batch sizes are): with ``decode_buckets``, a step decodes the
#: running sequences in the smallest of these (up to ``slots``) that holds them, instead of all ``slots`` rows
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


def table_widths(context: int, page_size: int) -> tuple[int, ...]:
    """Page-table widths in positions: one block (:data:`~jaxlab.engine.paged.BLOCK_TOKENS`), doubled up to
    ``context`` (each a whole number of blocks and pages)."""
    first = max(paged.BLOCK_TOKENS, page_size)
    out, w = [], first
    while w < context:
        out.append(w)
        w *= 2
    out.append(-(-context // first) * first)
    return tuple(out)


class Engine:
    """Continuous batching over a paged KV cache (see the module's docstring).

    ``slots``: rows of the decode program (its largest row bucket); ``max_running``: sequences that may run at
    once (default ``slots``; when more than ``slots`` decode, a step runs them in several calls of at most
    ``slots`` rows); ``page_size``: positions per page; ``chunk``: prompt tokens per prefill call (a multiple of
    ``page_size``); ``context``: positions a sequence may reach (prompt and new tokens).

    **Memory.** ``kv_tokens``: the KV budget in positions (the pool is that many pages, plus the null page; or give
    ``kv_bytes``, the memory the pool may take, or ``num_pages``; default: ``max_running`` sequences can each reach
    ``context``). ``watermark``: admission by memory (:mod:`~jaxlab.engine.scheduler`): a waiting request starts only
    if the free pages, less what the running requests still need for their prompts, hold its prompt and leave this
    fraction of the pool free for growth (default 0.01, vLLM's); None admits whenever fewer than ``max_running`` run, and preemption makes room.
    ``token_budget``: tokens computed per step (decode tokens plus prompt chunks; default ``max_running +
    2*chunk``); ``prefix_reuse``: read full prompt pages of an identical prefix instead of computing them.

    ``decode_buckets``: decode in the smallest row bucket (:data:`ROW_BUCKETS`) that holds the running sequences,
    so one request does not pay for ``slots`` rows. A backend's matmul may compute a row differently at different
    row counts (XLA:CPU does: rows at 1, 2-5 and 8-32 differ in their last bits, benchmarks/NOTES.md 11), which
    would make a request's tokens depend on its neighbours; so :meth:`warmup` runs one probe row through every
    bucket and keeps only those whose row equals the full step's bit for bit (:attr:`bucket_probe`). Until the
    warm-up, and without it, every step decodes ``slots`` rows."""

    def __init__(
        self,
        params: Params,
        tokenizer=None,
        *,
        slots: int = 8,
        page_size: int = PAGE_SIZE,
        chunk: int = CHUNK,
        context: int | None = None,
        num_pages: int | None = None,
        token_budget: int | None = None,
        cache_dtype=None,
        prefix_reuse: bool = True,
        decode_buckets: bool = False,
        max_running: int | None = None,
        kv_tokens: int | None = None,
        kv_bytes: int | None = None,
        watermark: float | None = 0.01,
    ):
        cfg = params.config
        self.params, self.tokenizer, self.config = params, tokenizer, cfg
        context = min(cfg.max_seq_len, 2048) if context is None else context
        if not 0 < context <= cfg.max_seq_len:
            raise InvalidRequestError(f"context must be in 1..{cfg.max_seq_len} (the model's), got {context}")
        max_running = slots if max_running is None else max_running
        if slots < 1 or page_size < 1 or chunk < 1 or max_running < 1:
            raise InvalidRequestError("slots, max_running, page_size and chunk must be >= 1")
        if sum(x is not None for x in (num_pages, kv_tokens, kv_bytes)) > 1:
            raise InvalidRequestError("give the KV budget once: kv_tokens (positions), kv_bytes or num_pages")
        self.slots, self.max_running, self.page_size, self.chunk = slots, max_running, page_size, chunk
        self.widths = table_widths(context, page_size)
        self.context = context
        self.cache_dtype = jnp.dtype(cache_dtype or params.policy.jnp_dtype)
        if kv_bytes is not None:
            kv_tokens = paged.kv_tokens_for(cfg, kv_bytes, page_size, self.cache_dtype)
            if kv_tokens < context:
                raise InvalidRequestError(
                    f"a KV budget of {kv_bytes / 2**20:.0f} MiB holds {kv_tokens} positions, fewer than one request's "
                    f"context ({context}): give more memory or a shorter context"
                )
        if kv_tokens is not None:
            if kv_tokens < page_size:
                raise InvalidRequestError(
                    f"kv_tokens must hold at least one page ({page_size} positions), got {kv_tokens}"
                )
            num_pages = kv_tokens // page_size + 1
        num_pages = num_pages or max_running * (self.widths[-1] // page_size) + 1
        self.cache = init_paged_cache(cfg, num_pages, page_size, dtype=self.cache_dtype)
        self.pool = PagePool(num_pages, page_size)
        self.scheduler = Scheduler(
            max_running,
            self.pool,
            chunk,
            token_budget or max_running + 2 * chunk,
            context,
            prefix_reuse=prefix_reuse,
            watermark=watermark,
        )
        self.programs = Programs()
        self.requests: dict[str, _Request] = {}
        self._ids = itertools.count()
        self.steps = 0
        self.kv_samples: list[float] = []  # KV use (stored / pool) after each step while requests waited
        self.fill_samples: list[float] = []  # stored / pages held, at the same steps
        self._free_masks: dict[int, jax.Array] = {}  # rows -> the all-ones grammar bitmask, on the device
        self.grammar_seconds = 0.0  # host time spent computing grammar masks (structured output)
        self.decode_buckets = decode_buckets
        self.row_buckets: tuple[int, ...] = (slots,)  # the decode row counts in use (warmup() may add smaller ones)
        self.bucket_probe: dict[int, bool] = {}  # bucket -> its probe row equalled the full step's (after warmup)
        self.bucket_steps: dict[int, int] = {}  # bucket -> decode calls it ran
        self.last_bucket: int | None = None  # the row bucket of the last decode call
        self.most_running = 0  # the most sequences that ran in one step

    # ---- requests ----------------------------------------------------------------------------------

    def add_request(
        self,
        prompt_ids: Sequence[int],
        sampling: SamplingParams | None = None,
        request_id: str | None = None,
        *,
        max_new_tokens: int = 32,
        seed: int = 0,
        stop: Sequence[str] = (),
        ignore_eos: bool = False,
        logprobs: bool = False,
        top_logprobs: int = 0,
        constraint: Constraint | None = None,
    ) -> Stream:
        """Queue a request; it joins the batch at the next step with a free slot. Returns its stream.
        ``top_logprobs`` (0..20): also keep each token's most likely alternatives and their logprobs (a step that
        carries such a request runs a program that also returns them). ``constraint``: the output must match
        this grammar (:class:`~jaxlab.engine.grammar.Constraint`; it ends when the grammar is complete)."""
        (prompt,) = check_request(self.config, [prompt_ids], max_new_tokens)
        if isinstance(top_logprobs, bool) or not (isinstance(top_logprobs, int) and 0 <= top_logprobs <= TOP_LOGPROBS):
            raise InvalidRequestError(f"top_logprobs must be a whole number in 0..{TOP_LOGPROBS}, got {top_logprobs!r}")
        matcher = None
        if constraint is not None:
            if ignore_eos:
                raise InvalidRequestError("ignore_eos cannot be combined with a constraint: a grammar ends the output")
            matcher = Matcher(constraint, self.tokenizer, self.config.vocab_size)
        request_id = str(next(self._ids)) if request_id is None else str(request_id)
        if request_id in self.requests:
            raise InvalidRequestError(f"request id {request_id!r} is already running: give each request its own id")
        stream = Stream(
            request_id,
            self,
            prompt,
            arrived=time.perf_counter(),
            logprobs=[] if logprobs or top_logprobs else None,
            top_logprobs=[] if top_logprobs else None,
        )

        def on_text(_row, piece):
            stream.text += piece
            stream.pieces.append(piece)

        stops = TextStops(
            1,
            self.tokenizer,
            self.config.eos_id,
            max_new_tokens,
            ignore_eos=ignore_eos,
            stop=stop,
            on_text=on_text if self.tokenizer is not None else None,
            logprobs=logprobs or bool(top_logprobs),
        )
        seq = self.scheduler.add(request_id, prompt, max_new_tokens)
        self.requests[request_id] = _Request(
            seq, stream, stops, int(seed), sampling or SamplingParams(), top_logprobs, matcher
        )
        return stream

    def abort(self, request_id: str) -> bool:
        """Give a request up: its slot and pages are free before the next step. False if it is unknown."""
        req = self.requests.pop(str(request_id), None)
        if req is None:
            return False
        self.scheduler.finish(req.seq)
        self._close(req, "abort")
        return True

    @property
    def has_work(self) -> bool:
        return not self.scheduler.idle()

    # ---- one step ----------------------------------------------------------------------------------

    def _width(self, positions: int) -> int:
        for w in self.widths:
            if positions <= w:
                return w
        raise InvalidRequestError(f"{positions} positions exceed the engine's context {self.context}")

    def _table(self, seqs: Sequence[Seq | None], width: int) -> np.ndarray:
        per_row = width // self.page_size
        table = np.zeros((len(seqs), per_row), np.int32)
        for r, seq in enumerate(seqs):
            if seq is not None:  # a row may already hold pages for a later chunk of this step: not read now
                pages = seq.pages[:per_row]
                table[r, : len(pages)] = pages
        return table

    def _sampling(self, reqs: Sequence[_Request | None]):
        params = [r.sampling if r is not None else SamplingParams() for r in reqs]
        greedy = all(p.greedy for p in params)
        if greedy:
            return GREEDY, jnp.ones(len(params), bool)
        return stack_rows(params)

    def _allowed(self, rows: Sequence[_Request | None]):
        """The step's grammar bitmask [rows, ceil(V/32)]: each constrained row's next tokens, all ones elsewhere
        (kept on the device for a step of free rows, so it costs no transfer)."""
        n = len(rows)
        if not any(r is not None and r.matcher is not None for r in rows):
            if n not in self._free_masks:
                self._free_masks[n] = jax.device_put(allow_all(n, self.config.vocab_size))
            return self._free_masks[n]
        mask = allow_all(n, self.config.vocab_size)
        t0 = time.perf_counter()
        for i, r in enumerate(rows):
            if r is not None and r.matcher is not None:
                r.matcher.fill(mask[i])
        self.grammar_seconds += time.perf_counter() - t0
        return jax.device_put(mask)

    def _run(self, name: str, rows: Sequence[_Request | None], tokens, positions, width: int):
        samp, greedy_rows = self._sampling(rows)
        seqs = [r.seq if r is not None else None for r in rows]
        cache = self.cache.with_table(self._table(seqs, width))
        seeds = np.asarray([r.seed if r is not None else 0 for r in rows], np.uint32)
        # device_put, not jnp.asarray: converting a NumPy array with jnp.asarray compiles a small program per shape
        tokens, positions, seeds = jax.device_put((tokens, positions, seeds))
        args = (self.params, tokens, positions, cache, seeds, samp, greedy_rows, self._allowed(rows))
        # a sampling step always returns the top logprobs: they cost nothing beside sampling's sort of the vocabulary
        # (benchmarks/NOTES.md 12), and one program fewer per shape is to compile at warm-up
        wanted = any(r is not None and r.top for r in rows) or not samp.greedy
        top = TOP_LOGPROBS if wanted else 0
        fn, _ = self.programs.get(name, jit_rows, args, {"top": top} if top else None)
        if top:
            nxt, logp, (top_v, top_i), self.cache = fn(*args)
            return np.asarray(nxt), np.asarray(logp), (np.asarray(top_v), np.asarray(top_i))
        nxt, logp, self.cache = fn(*args)
        return np.asarray(nxt), np.asarray(logp), None

    def step(self) -> list[RequestOutput]:
        """Admit, decode one token per running sequence, prefill chunks under the budget; -> what each
        request got in this step."""
        plan = self.scheduler.schedule()
        if plan.empty:
            return []
        self.steps += 1
        self.most_running = max(self.most_running, len(self.scheduler.running))
        outputs: list[RequestOutput] = []
        for at in range(0, len(plan.decode), self.slots):  # more running than rows: calls of at most `slots` rows
            outputs += self._decode(plan.decode[at : at + self.slots])
        for ch in plan.chunks:
            req = self.requests.get(ch.seq.id)
            if req is None or ch.seq.done:
                continue
            n = ch.end - ch.start
            tokens = np.zeros((1, self.chunk), np.int32)
            positions = np.full((1, self.chunk), -1, np.int32)
            tokens[0, self.chunk - n :] = ch.seq.prompt[ch.start : ch.end]  # left padding: the last column is real
            positions[0, self.chunk - n :] = np.arange(ch.start, ch.end)
            nxt, logp, tops = self._run("prefill", [req], tokens, positions, self._width(ch.end))
            self.scheduler.computed(ch.seq, ch.end)
            if ch.last and not ch.seq.generated:
                outputs += self._emit(req, int(nxt[0]), float(logp[0]), _row(tops, 0))
        if self.scheduler.waiting:
            self.kv_samples.append(self.scheduler.kv_use())
            self.fill_samples.append(self.scheduler.page_fill())
        return outputs

    def _decode(self, seqs: list[Seq]) -> list[RequestOutput]:
        """One token for each of ``seqs``, packed into the first rows of the smallest row bucket that holds them (a
        row reads only its own pages, so which row a sequence takes does not matter)."""
        size = bucket(len(seqs), self.row_buckets)
        self.bucket_steps[size] = self.bucket_steps.get(size, 0) + 1
        self.last_bucket = size
        rows: list[_Request | None] = [None] * size
        tokens = np.zeros((size, 1), np.int32)
        positions = np.full((size, 1), -1, np.int32)
        for r, seq in enumerate(seqs):
            rows[r] = self.requests[seq.id]
            tokens[r, 0] = seq.tokens[seq.computed]
            positions[r, 0] = seq.computed
        width = self._width(max(s.computed + 1 for s in seqs))
        nxt, logp, tops = self._run("decode", rows, tokens, positions, width)
        outputs: list[RequestOutput] = []
        for r, seq in enumerate(seqs):
            replay = seq.replay
            self.scheduler.computed(seq, seq.computed + 1)
            if not replay:
                outputs += self._emit(self.requests[seq.id], int(nxt[r]), float(logp[r]), _row(tops, r))
        return outputs

    def _emit(self, req: _Request, token: int, logp: float, top=None) -> list[RequestOutput]:
        stream, seq = req.stream, req.seq
        if stream.first_token_at is None:
            stream.first_token_at = time.perf_counter()
        seq.generated.append(token)
        before = len(stream.text)
        if req.matcher is not None:
            t0 = time.perf_counter()
            kept = req.matcher.advance(token)
            self.grammar_seconds += time.perf_counter() - t0
            if not kept:  # the mask forbade it: a bug of ours. End this request (its text so far), not the engine
                self.scheduler.finish(seq)
                self.requests.pop(seq.id, None)
                return [self._close(req, "stop", before)]
        going = req.stops.push(0, token, logp)
        if req.stops.ids[0][len(stream.token_ids) :]:
            stream.token_ids.append(token)
            if stream.logprobs is not None:
                stream.logprobs.append(logp)
            if stream.top_logprobs is not None and top is not None:
                values, ids = top
                stream.top_logprobs.append([(int(i), float(v)) for i, v in zip(ids[: req.top], values[: req.top])])
        if going:
            return [RequestOutput(seq.id, [token], stream.text[before:])]
        self.scheduler.finish(seq)
        self.requests.pop(seq.id, None)
        return [self._close(req, req.stops.finish[0] or "length", before)]

    def _close(self, req: _Request, reason: str, before: int | None = None) -> RequestOutput:
        stream = req.stream
        if before is None:
            before = len(stream.text)
        if self.tokenizer is not None and reason != "abort":
            req.stops.results([stream.prompt_ids])  # flush held-back text (and a stop string at the very end)
            stream.text = req.stops.safe[0] if req.stops.track else stream.text
        elif self.tokenizer is None:
            stream.text = ""
        stream.finished, stream.finish_reason, stream.finished_at = True, reason, time.perf_counter()
        new = stream.token_ids[-1:] if reason != "abort" else []
        return RequestOutput(stream.request_id, new, stream.text[before:], True, reason)

    # ---- conveniences ------------------------------------------------------------------------------

    def run(self) -> None:
        """Step until every request has finished."""
        while self.has_work:
            self.step()

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int = 32,
        sampling: SamplingParams | None = None,
        *,
        seed: int = 0,
        stop: Sequence[str] = (),
        ignore_eos: bool = False,
        logprobs: bool = False,
        on_text: Callable[[int, str], None] | None = None,
        constraint: Constraint | None = None,
    ) -> list[GenerationResult]:
        """Every prompt as a request (seeds ``seed``, ``seed + 1``, ...), run to the end; results in order.
        ``on_text(row, piece)`` is called as each row's text arrives. The results' timings: prefill = time to
        the row's first token, decode = the rest, compile = seconds this call spent compiling (inside the
        prefill)."""
        compiled = self.programs.compile_seconds_total
        t0 = time.perf_counter()
        streams = [
            self.add_request(
                p,
                sampling,
                max_new_tokens=max_new_tokens,
                seed=seed + i,
                stop=stop,
                ignore_eos=ignore_eos,
                logprobs=logprobs,
                constraint=constraint,
            )
            for i, p in enumerate(prompts)
        ]
        while True:
            if on_text is not None:
                for i, s in enumerate(streams):
                    while s.pieces:
                        on_text(i, s.pieces.popleft())
            if not self.has_work:
                break
            self.step()
        compile_s = self.programs.compile_seconds_total - compiled
        results = []
        for s in streams:
            r = s.result()
            first = s.first_token_at or s.finished_at
            r.prefill_seconds, r.decode_seconds, r.compile_seconds = first - t0, s.finished_at - first, compile_s
            results.append(r)
        return results

    def warmup(self, sampling: bool = False, top_logprobs: bool = False) -> float:
        """Compile every program the engine can need (decode and prefill, each page-table width; greedy, and
        greedy returning top logprobs when asked; sampling, which always returns them, when asked); returns seconds
        spent compiling."""
        before = self.programs.compile_seconds_total
        variants = [(SamplingParams(), 0)] + ([(SamplingParams(), TOP_LOGPROBS)] if top_logprobs else [])
        variants += [(SamplingParams(temperature=1.0), TOP_LOGPROBS)] if sampling else []
        candidates = self.candidate_buckets()
        if len(candidates) > 1:  # the probe compiles each candidate once; only the kept ones get every variant
            self.bucket_probe = self.probe_buckets(candidates)
            self.row_buckets = tuple(b for b in candidates if self.bucket_probe[b])
        shapes = [("decode", b, 1) for b in self.row_buckets] + [("prefill", 1, self.chunk)]
        for sp, top in variants:
            for width in self.widths:
                for name, rows, t in shapes:
                    samp, greedy_rows = GREEDY, jnp.ones(rows, bool)
                    if not sp.greedy:
                        samp, greedy_rows = stack_rows([sp] * rows)
                    cache = self.cache.with_table(np.zeros((rows, width // self.page_size), np.int32))
                    args = (
                        self.params,
                        jnp.zeros((rows, t), jnp.int32),
                        jnp.full((rows, t), -1, jnp.int32),
                        cache,
                        jnp.zeros(rows, jnp.uint32),
                        samp,
                        greedy_rows,
                        self._allowed([None] * rows),  # the free rows' mask, cached for the steps
                    )
                    fn, _ = self.programs.get(name, jit_rows, args, {"top": top} if top else None)
                    *_, self.cache = fn(*args)  # all positions -1: writes go to the null page only
        return self.programs.compile_seconds_total - before

    def candidate_buckets(self) -> tuple[int, ...]:
        """The decode row counts warm-up compiles: :data:`ROW_BUCKETS` below ``slots``, and ``slots``."""
        if not self.decode_buckets:
            return (self.slots,)
        return tuple(b for b in ROW_BUCKETS if b < self.slots) + (self.slots,)

    def probe_buckets(self, buckets: Sequence[int]) -> dict[int, bool]:
        """Whether one probe row (token 1 at position 0, reading and writing only the null page) gets the same
        token and the same log-probability, bit for bit, in each bucket as in the full ``slots``-row step: the
        buckets a request may run in without its tokens depending on how many run beside it."""
        out = {}
        for b in buckets:
            tokens = np.zeros((b, 1), np.int32)
            positions = np.full((b, 1), -1, np.int32)
            tokens[0, 0], positions[0, 0] = 1, 0
            nxt, logp, _ = self._run("decode", [None] * b, tokens, positions, self.widths[0])
            out[b] = (int(nxt[0]), logp[0].tobytes())
        full = out[self.slots]
        return {b: out[b] == full for b in buckets}
