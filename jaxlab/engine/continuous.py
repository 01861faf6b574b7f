"""Continuous batching over the paged KV cache: the engine a server runs.

Requests come and go between steps: ``add_request`` puts one in the queue and returns its :class:`Stream`;
every :meth:`Engine.step` runs one decode token for each running sequence and prompt chunks under the token
budget (:mod:`jaxlab.engine.scheduler` decides which), then hands each request its new text. A finished
request frees its slot and pages at once and the next one takes them in the following step; ``abort``
frees them within one step.

A step reads as **schedule → run → postprocess**: the :class:`~jaxlab.engine.scheduler.Scheduler` (host
bookkeeping: admission, pages, the token budget) says which sequences decode and which prompt chunks run; the
:class:`~jaxlab.engine.runner.Runner` (the device side: parameters, the paged cache, compiled programs of fixed
shapes) runs them, more running sequences than ``slots`` in several decode calls; the engine then hands each
request's record its tokens and text. How many sequences run is bounded by ``max_running`` and, with a
``watermark``, by the KV memory (admission by memory). :meth:`Engine.warmup` compiles every program; after it no
mix of requests compiles anything (a test counts).

**One record per request.** A request is checked once, by :func:`~jaxlab.engine.plan.check_generation` (the CLI,
the server and the bench call it; :meth:`Engine.add_request` takes its :class:`~jaxlab.engine.plan.GenerationRequest`
as is). Its :class:`Stream` owns what happens to it: the scheduler's sequence, its grammar's place, its token ids,
logprobs, text (detokenized once, here) and finish state; each step's :class:`RequestOutput` carries what is new,
ready to forward (a server sends it on without slicing the record).

**Batch invariance.** Each row computes only from its own tokens and pages, and its random key is derived
from its own seed and position (:func:`~jaxlab.engine.steps.rows_step`); prompt chunks start at multiples
of ``chunk`` whatever else runs; a preempted request is recomputed the way it was computed the first time.
So a request's tokens do not depend on which requests run beside it (a property test checks it over random
arrivals, lengths and preemptions).

**Speculative decoding** (``speculative=k``): a greedy request (no grammar, no top logprobs) carries up to ``k``
drafts of its own each step, prompt lookup's proposal from its own tokens
(:func:`~jaxlab.engine.speculative.ngram_propose`), in a decode program of ``1 + k`` tokens per row
(:func:`~jaxlab.engine.steps.rows_verify_step`); it keeps the drafts that equal the model's greedy choices plus
the model's next token, so **each row advances by its own accepted count** (the lockstep
:class:`~jaxlab.engine.speculative.SpeculativeDecoder` moves a batch by its worst row's), and its tokens are plain
greedy's. Drafts only take free pages (a draft preempts nobody); rejected positions are overwritten later and never
read (a query reads positions up to its own). Sampling and constrained rows carry none and are chosen as before;
a preempted request replays its known tokens as drafts, all kept.

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

import jax.numpy as jnp

from jaxlab.engine import paged
from jaxlab.engine.generate import GenerationResult, TextStops
from jaxlab.engine.grammar import Constraint, Matcher
from jaxlab.engine.model import Params
from jaxlab.engine.pages import PagePool
from jaxlab.engine.plan import GenerationRequest, bucket, check_generation
from jaxlab.engine.runner import PAGE_SIZE, Launched, Runner, default_chunk, table_widths
from jaxlab.engine.sampling import SamplingParams
from jaxlab.engine.scheduler import Scheduler, Seq
from jaxlab.engine.speculative import ngram_propose
from jaxlab.errors import InvalidRequestError

MAX_DRAFTS = 16  # the most draft tokens a row may carry (speculative)
#: prompt lookup's n-grams, longest first (the speculative decoder's defaults: a single recurring token predicts
#: little)
NGRAMS = (3, 2)


@dataclass
class RequestOutput:
    """What one step gave one request, ready to forward: its new token ids and text, and whether (and why) it
    finished. With logprobs asked: each new token's logprob and own text, and its top alternatives as (text,
    logprob) pairs when asked (the tokens are detokenized here, once)."""

    request_id: str
    token_ids: list[int]
    text: str
    finished: bool = False
    finish_reason: str | None = None  # "eos", "stop", "length" or "abort"
    logprobs: list[float] = field(default_factory=list)
    token_texts: list[str] = field(default_factory=list)
    top: list[list[tuple[str, float]]] = field(default_factory=list)
    total_tokens: int = 0  # the request's tokens so far (its usage)


@dataclass
class Stream:
    """One request on the engine, from arrival to end: what was asked (``request``), where it stands in the scheduler
    (``seq``: pages, positions computed), its grammar's place (``matcher``) and its output, each kept once: token
    ids and logprobs (held by ``stops``, which checks them against EOS, stop strings and the length), the text, the
    top alternatives, the finish state and the timings. Iterating yields text pieces, stepping the engine while none
    is ready."""

    request_id: str
    engine: Engine = field(repr=False)
    request: GenerationRequest = field(repr=False)
    seq: Seq = field(repr=False)
    stops: TextStops = field(repr=False)
    matcher: Matcher | None = field(default=None, repr=False)
    top_logprobs: list[list[tuple[int, float]]] | None = None  # per token: the most likely (id, logprob) pairs
    text: str = ""
    finished: bool = False
    finish_reason: str | None = None
    arrived: float = 0.0  # perf_counter() when added
    first_token_at: float | None = None
    finished_at: float | None = None
    compiled_at_first: float = 0.0  # the engine's compile seconds so far, at the first token and at the end
    compiled_at_finish: float = 0.0
    pieces: deque = field(default_factory=deque, repr=False)
    sent: int = 0  # tokens handed out in outputs so far

    @property
    def prompt_ids(self) -> list[int]:
        return list(self.request.prompt_ids)

    @property
    def token_ids(self) -> list[int]:
        return self.stops.ids[0]

    @property
    def logprobs(self) -> list[float] | None:
        return self.stops.logp[0] if self.request.logprobs else None

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
            prompt_ids=self.prompt_ids,
            generated_ids=list(self.token_ids),
            text=self.text,
            finish_reason=self.finish_reason or "length",
            logprobs=self.logprobs,
        )


def accepted(drafts: Sequence[int], out: Sequence[int]) -> int:
    """How many of a row's drafts the model agreed with: the longest prefix where each draft equals the model's
    greedy token after the tokens before it (``out[j]``: its token after column ``j``)."""
    n = 0
    while n < len(drafts) and drafts[n] == out[n]:
        n += 1
    return n


@dataclass
class _Ahead:
    """A decode call launched one step early (:meth:`Engine._decode`): who sits in each of its rows (None: free),
    the position each decodes there, and the call."""

    layout: list
    positions: list[int]
    launched: Launched

    def rows_of(self, rows: Sequence) -> list[int] | None:
        """The row of each record in ``rows``, if every one sits in this call at the position it decodes now."""
        index = {id(r): i for i, r in enumerate(self.layout) if r is not None}
        out = []
        for r in rows:
            i = index.get(id(r))
            if i is None or self.positions[i] != r.seq.computed:
                return None
            out.append(i)
        return out


class Engine:
    """Continuous batching over a paged KV cache (see the module's docstring).

    ``slots``: rows of the decode program (its largest row bucket); ``max_running``: sequences that may run at
    once (default ``slots``; when more than ``slots`` decode, a step runs them in several calls of at most
    ``slots`` rows); ``page_size``: positions per page; ``chunk``: prompt tokens per prefill call (a multiple of
    ``page_size``; default :func:`~jaxlab.engine.runner.default_chunk`: 128, or the context if shorter; on a CPU,
    64-token calls stored prompts too slowly for a loaded engine to fill its pool, benchmarks/NOTES.md 20);
    ``context``: positions a sequence may reach (prompt and new tokens).

    **Memory.** ``kv_tokens``: the KV budget in positions (the pool is that many pages, plus the null page; or give
    ``kv_bytes``, the memory the pool may take, or ``num_pages``; default: ``max_running`` sequences can each reach
    ``context``). ``watermark``: admission by memory (:mod:`~jaxlab.engine.scheduler`): a waiting request starts only
    if the free pages, less what the running requests still need for their prompts, hold its prompt and leave this
    fraction of the pool free for growth (default 0.01, vLLM's); None admits whenever fewer than ``max_running`` run,
    and preemption makes room. ``token_budget``: tokens computed per step (decode tokens plus prompt chunks; default
    ``max_running + 2*chunk``); ``prefix_reuse``: read full prompt pages of an identical prefix instead of computing
    them.

    ``speculative``: draft tokens per greedy row and step, 0..16 (module docstring; 0: off).

    ``overlap``: in steady decoding, launch the next step's decode call before this step's tokens reach the host, so
    the host's work (reading tokens, detokenizing, stops, streaming) overlaps the device's (:meth:`_decode`); the
    tokens are the same either way (``ahead_steps`` counts the calls taken and dropped).

    ``decode_buckets``: decode in the smallest row bucket (:data:`~jaxlab.engine.runner.ROW_BUCKETS`) that holds the
    running sequences, so one request does not pay for ``slots`` rows. A backend's matmul may compute a row
    differently at different row counts (XLA:CPU does: rows at 1, 2-5 and 8-32 differ in their last bits,
    benchmarks/NOTES.md 11), which would make a request's tokens depend on its neighbours; so :meth:`warmup` runs
    one probe row through every bucket and keeps only those whose row equals the full step's bit for bit
    (``runner.bucket_probe``). Until the warm-up, and without it, every step decodes ``slots`` rows."""

    def __init__(
        self,
        params: Params,
        tokenizer=None,
        *,
        slots: int = 8,
        page_size: int = PAGE_SIZE,
        chunk: int | None = None,
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
        speculative: int = 0,
        overlap: bool = True,
    ):
        cfg = params.config
        self.params, self.tokenizer, self.config = params, tokenizer, cfg
        context = min(cfg.max_seq_len, 2048) if context is None else context
        if not 0 < context <= cfg.max_seq_len:
            raise InvalidRequestError(f"context must be in 1..{cfg.max_seq_len} (the model's), got {context}")
        max_running = slots if max_running is None else max_running
        if slots < 1 or page_size < 1 or (chunk is not None and chunk < 1) or max_running < 1:
            raise InvalidRequestError("slots, max_running, page_size and chunk must be >= 1")
        chunk = default_chunk(context, page_size) if chunk is None else chunk
        if isinstance(speculative, bool) or not isinstance(speculative, int) or not 0 <= speculative <= MAX_DRAFTS:
            raise InvalidRequestError(f"speculative is the draft tokens per row, 0..{MAX_DRAFTS}, got {speculative!r}")
        if sum(x is not None for x in (num_pages, kv_tokens, kv_bytes)) > 1:
            raise InvalidRequestError("give the KV budget once: kv_tokens (positions), kv_bytes or num_pages")
        self.slots, self.max_running, self.page_size, self.chunk = slots, max_running, page_size, chunk
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
        num_pages = num_pages or max_running * (table_widths(context, page_size)[-1] // page_size) + 1
        self.runner = Runner(
            params,
            slots=slots,
            page_size=page_size,
            chunk=chunk,
            context=context,
            num_pages=num_pages,
            cache_dtype=self.cache_dtype,
            decode_buckets=decode_buckets,
            speculative=speculative,
        )
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
        self.requests: dict[str, Stream] = {}
        self._ids = itertools.count()
        self.steps = 0
        self.kv_samples: list[float] = []  # KV use (stored / pool) after each step while requests waited
        self.fill_samples: list[float] = []  # stored / pages held, at the same steps
        self.advance_seconds = 0.0  # host time spent advancing grammars by the tokens they got
        self.most_running = 0  # the most sequences that ran in one step
        self.speculative = speculative
        self.drafted = self.accepted = 0  # draft tokens proposed and kept (speculative)
        self.row_calls = 0  # decode rows run (one per running sequence per step)
        self.overlap = overlap  # launch the next decode call before this one's tokens reach the host (_decode)
        self._ahead: _Ahead | None = None
        self.ahead_steps = {"used": 0, "dropped": 0}  # look-ahead calls a step took, and dropped
        self.last_bucket: int | None = None  # the row bucket of the last decode call a step took

    @property
    def programs(self):
        """The compiled programs (:class:`~jaxlab.engine.programs.Programs`), as a Generator's."""
        return self.runner.programs

    @programs.setter
    def programs(self, programs) -> None:  # engines of one config and shapes may share their compiled programs
        self.runner.programs = programs

    @property
    def grammar_seconds(self) -> float:
        """Host time spent on grammars (structured output): filling masks before steps, advancing after."""
        return self.runner.mask_seconds + self.advance_seconds

    # ---- requests ----------------------------------------------------------------------------------

    def check(self, prompt_ids: Sequence[int], max_new_tokens: int = 32, **options) -> GenerationRequest:
        """:func:`~jaxlab.engine.plan.check_generation` against this engine's vocabulary and context."""
        return check_generation(
            prompt_ids, max_new_tokens, vocab_size=self.config.vocab_size, context=self.context, **options
        )

    def add_request(
        self,
        request: GenerationRequest | Sequence[int],
        sampling: SamplingParams | None = None,
        request_id: str | None = None,
        **options,
    ) -> Stream:
        """Queue a request; it joins the batch at a step that has room for it. Returns its stream.

        ``request``: a :class:`~jaxlab.engine.plan.GenerationRequest` (checked already by
        :func:`~jaxlab.engine.plan.check_generation`, taken as is), or prompt token ids, checked here (:meth:`check`)
        with ``sampling`` and ``options``, the keywords of :func:`~jaxlab.engine.plan.check_generation`:
        ``max_new_tokens`` (default 32), ``seed``, ``stop``, ``ignore_eos``, ``logprobs``, ``top_logprobs`` (0..20:
        each token's most likely alternatives too; a step that carries such a request runs a program that also
        returns them) and ``constraint`` (the output must match this grammar, and ends when it is complete)."""
        if not isinstance(request, GenerationRequest):
            request = self.check(request, sampling=sampling, **options)
        elif sampling is not None or options:
            given = ["sampling"] * (sampling is not None) + sorted(options)
            raise InvalidRequestError(
                f"a checked GenerationRequest carries its own settings: drop {', '.join(given)} (or pass prompt ids)"
            )
        request_id = str(next(self._ids)) if request_id is None else str(request_id)
        if request_id in self.requests:
            raise InvalidRequestError(f"request id {request_id!r} is already running: give each request its own id")
        matcher = None
        if request.constraint is not None:
            matcher = Matcher(request.constraint, self.tokenizer, self.config.vocab_size)

        def on_text(_row, piece):
            stream.text += piece
            stream.pieces.append(piece)

        stops = TextStops(
            1,
            self.tokenizer,
            self.config.eos_id,
            request.max_new_tokens,
            ignore_eos=request.ignore_eos,
            stop=request.stop,
            on_text=on_text if self.tokenizer is not None else None,
            logprobs=request.logprobs,
        )
        # last of what may refuse the request (it can never fit), so a refused request leaves nothing queued
        seq = self.scheduler.add(request_id, list(request.prompt_ids), request.max_new_tokens)
        stream = Stream(
            request_id,
            self,
            request,
            seq,
            stops,
            matcher,
            top_logprobs=[] if request.top_logprobs else None,
            arrived=time.perf_counter(),
        )
        self.requests[request_id] = stream
        return stream

    def abort(self, request_id: str) -> RequestOutput | None:
        """Give a request up: its slot and pages are free before the next step. -> its last output (finish reason
        ``abort``), or None if it is unknown."""
        stream = self.requests.pop(str(request_id), None)
        if stream is None:
            return None
        self.scheduler.finish(stream.seq)
        return self._close(stream, "abort")

    @property
    def has_work(self) -> bool:
        return not self.scheduler.idle()

    # ---- one step: schedule, run, postprocess ------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Admit, decode one token per running sequence, prefill chunks under the budget; -> what each
        request got in this step."""
        plan = self.scheduler.schedule()
        if plan.empty:
            if self._ahead is not None:  # every row finished
                self._ahead, self.ahead_steps["dropped"] = None, self.ahead_steps["dropped"] + 1
            return []
        self.steps += 1
        self.most_running = max(self.most_running, len(self.scheduler.running))
        outputs: list[RequestOutput] = []
        early, self._ahead = self._ahead, None  # the call the last step launched for this one, if it did
        if early is not None and not 0 < len(plan.decode) <= self.slots:
            early, self.ahead_steps["dropped"] = None, self.ahead_steps["dropped"] + 1
        for at in range(0, len(plan.decode), self.slots):  # more running than rows: calls of at most `slots` rows
            seqs = plan.decode[at : at + self.slots]
            rows = [self.requests[seq.id] for seq in seqs]
            drafts = [self._drafts(r) for r in rows] if self.speculative else None
            results = self._decode(rows, drafts, early, plan)
            for i, (stream, (out, logp, top)) in enumerate(zip(rows, results)):
                seq, ahead = stream.seq, drafts[i] if drafts else []
                replay = seq.replay
                kept = len(ahead) if replay else accepted(ahead, out)  # a replay's drafts are its own known tokens
                self.scheduler.computed(seq, seq.computed + 1 + kept)
                self.row_calls += 1
                if not replay:
                    self.drafted, self.accepted = self.drafted + len(ahead), self.accepted + kept
                    outputs += self._emit(stream, out[: kept + 1], logp[: kept + 1], top)
        for ch in plan.chunks:
            stream = self.requests.get(ch.seq.id)
            if stream is None or ch.seq.done:
                continue
            token, logp, top = self.runner.prefill(stream, ch.start, ch.end)
            self.scheduler.computed(ch.seq, ch.end)
            if ch.last and not ch.seq.generated:
                outputs += self._emit(stream, [token], [logp], top)
        if self.scheduler.waiting:
            self.kv_samples.append(self.scheduler.kv_use())
            self.fill_samples.append(self.scheduler.page_fill())
        return outputs

    def _decode(self, rows: list[Stream], drafts, early: _Ahead | None, plan) -> list[tuple]:
        """Run one decode call over ``rows``; -> per row (tokens, logprobs, top alternatives or None).

        **Look-ahead** (``overlap``): when the rows will decode again in the next step for sure but for their stops
        (plain decode: no drafts, grammars or replays; their pages, or a free page, hold the next position; none
        reaches its token limit; no prompt finishes in this step, so nobody joins), the next step's call is launched
        before this one's tokens reach the host, fed its tokens on the device: the host's work of this step (reading
        tokens, detokenizing, stops, the server's streaming) overlaps the device's next step. The next step takes that
        call (``early``) if its rows sit in it at the expected positions: a row that finished meanwhile is dropped
        from it (when the rows left fit a smaller bucket, the step after re-packs them); the tokens are those a fresh
        call computes (the same bucket rules, batch invariance). Otherwise the call is dropped and the step runs as
        usual: its writes went to positions that a later write of the same position, or a page's new owner,
        overwrites before any read."""
        where = early.rows_of(rows) if early is not None else None
        if where is None:
            if early is not None:
                self.ahead_steps["dropped"] += 1
            launched = self.runner.decode_launch(rows, drafts)
            layout: list[Stream | None] = list(rows) + [None] * (len(launched.tokens) - len(rows))
            where = list(range(len(rows)))
        else:
            self.ahead_steps["used"] += 1
            launched = early.launched
            kept = {id(r) for r in rows}
            layout = [r if r is not None and id(r) in kept else None for r in early.layout]
        self.last_bucket = len(layout)
        smaller = bucket(len(rows), self.runner.row_buckets) < len(layout)  # rows left: the next call re-packs them
        if self.overlap and drafts is None and not smaller and self._may_look_ahead(rows, plan):
            self._ahead = _Ahead(
                layout,
                [r.seq.computed + 1 if r is not None else -1 for r in layout],
                self.runner.decode_next(launched, layout),
            )
        return self.runner.results(self.runner.fetch(launched), where)

    def _may_look_ahead(self, rows: list[Stream], plan) -> bool:
        if len(plan.decode) > self.slots or any(ch.last for ch in plan.chunks):  # a finished prompt joins next step
            return False
        for r in rows:
            seq = r.seq
            nxt = seq.computed + 1  # the position the next step decodes
            if (
                r.matcher is not None
                or seq.replay
                or nxt + 1 > self.context
                or len(seq.generated) + 1 >= r.request.max_new_tokens
                or self.scheduler.reserve(seq, nxt + 1) <= nxt  # its next page a step early, if one is free
            ):
                return False
        return True

    def _drafts(self, stream: Stream) -> list[int]:
        """The tokens ``stream`` carries after its last one in this step (speculative): replaying after a preemption,
        the known tokens it must feed again; a greedy request with no grammar and no top logprobs, prompt lookup's
        proposal (:func:`~jaxlab.engine.speculative.ngram_propose`); none otherwise. Never past its new tokens or
        the context, and only as far as the pages it holds, or free ones, reach (drafting preempts nobody)."""
        seq, req = stream.seq, stream.request
        c = seq.computed
        if seq.replay:
            ahead = seq.tokens[c + 1 : min(len(seq.tokens) - 1, c + 1 + self.speculative)]
        elif not req.sampling.greedy or stream.matcher is not None or req.top_logprobs:
            return []
        else:
            room = min(self.speculative, req.max_new_tokens - len(seq.generated) - 1, self.context - c - 1)
            ahead = (ngram_propose(seq.tokens, room, *NGRAMS) or []) if room > 0 else []
        if not ahead:
            return []
        return ahead[: self.scheduler.reserve(seq, c + 1 + len(ahead)) - c - 1]

    def _emit(self, stream: Stream, tokens: Sequence[int], logps: Sequence[float], top=None) -> list[RequestOutput]:
        """Hand ``stream`` the tokens it got in this step (one, or a speculative run; ``top``: the first one's
        alternatives) until it finishes; -> its output."""
        seq = stream.seq
        if stream.first_token_at is None:
            stream.first_token_at = time.perf_counter()
            stream.compiled_at_first = self.programs.compile_seconds_total
        before = len(stream.text)
        for j, (token, logp) in enumerate(zip(tokens, logps)):
            seq.generated.append(token)
            if stream.matcher is not None:
                t0 = time.perf_counter()
                kept = stream.matcher.advance(token)
                self.advance_seconds += time.perf_counter() - t0
                if not kept:  # the mask forbade it: a bug of ours. End this request (its text so far), not the engine
                    self.scheduler.finish(seq)
                    self.requests.pop(seq.id, None)
                    return [self._close(stream, "stop", before)]
            kept_before = len(stream.token_ids)
            going = stream.stops.push(0, token, logp)
            if j == 0 and len(stream.token_ids) > kept_before and stream.top_logprobs is not None and top is not None:
                values, ids = top
                n = stream.request.top_logprobs
                stream.top_logprobs.append([(int(i), float(v)) for i, v in zip(ids[:n], values[:n])])
            if not going:
                self.scheduler.finish(seq)
                self.requests.pop(seq.id, None)
                return [self._close(stream, stream.stops.finish[0] or "length", before)]
        return [self._output(stream, before)]

    def _close(self, stream: Stream, reason: str, before: int | None = None) -> RequestOutput:
        if before is None:
            before = len(stream.text)
        if self.tokenizer is not None and reason != "abort":
            stream.stops.results([stream.prompt_ids])  # flush held-back text (and a stop string at the very end)
            stream.text = stream.stops.safe[0]
        elif self.tokenizer is None:
            stream.text = ""
        stream.finished, stream.finish_reason, stream.finished_at = True, reason, time.perf_counter()
        stream.compiled_at_finish = self.programs.compile_seconds_total
        return self._output(stream, before, reason)

    def _output(self, stream: Stream, before: int, reason: str | None = None) -> RequestOutput:
        """The request's output since its last one: new tokens (with their logprobs, own texts and alternatives when
        asked) and the text from ``before``."""
        at, stream.sent = stream.sent, len(stream.token_ids)
        new = stream.token_ids[at:]
        out = RequestOutput(stream.request_id, list(new), stream.text[before:], reason is not None, reason)
        out.total_tokens = len(stream.token_ids)
        if stream.request.logprobs:
            out.logprobs = list(stream.logprobs[at:])
            if self.tokenizer is not None:
                out.token_texts = [self.tokenizer.decode([t]) for t in new]
                alts = stream.top_logprobs[at:] if stream.top_logprobs is not None else []
                out.top = [[(self.tokenizer.decode([i]), v) for i, v in a] for a in alts]
        return out

    # ---- conveniences ------------------------------------------------------------------------------

    def run(self) -> None:
        """Step until every request has finished."""
        while self.has_work:
            self.step()

    def generate(
        self,
        prompts: Sequence[GenerationRequest | Sequence[int]],
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
        """Every prompt as a request, run to the end; results in order. A prompt is a checked
        :class:`~jaxlab.engine.plan.GenerationRequest` (taken as is) or token ids, checked with the keywords (seeds
        ``seed``, ``seed + 1``, ...). ``on_text(row, piece)`` is called as each row's text arrives. The results'
        timings, as Generator's: prefill = time to the row's first token, decode = the rest, each without the compiles
        that ran in it; compile = seconds this call spent compiling (a decode program first needed after the first
        token compiles in the decode's time, and is taken out of it)."""
        compiled = self.programs.compile_seconds_total
        t0 = time.perf_counter()
        options = dict(max_new_tokens=max_new_tokens, stop=stop, ignore_eos=ignore_eos, logprobs=logprobs)
        streams = [
            self.add_request(p)
            if isinstance(p, GenerationRequest)
            else self.add_request(p, sampling, seed=seed + i, constraint=constraint, **options)
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
            at_first = s.compiled_at_first if s.first_token_at is not None else s.compiled_at_finish
            r.prefill_seconds = first - t0 - (at_first - compiled)
            r.decode_seconds = s.finished_at - first - (s.compiled_at_finish - at_first)
            r.compile_seconds = compile_s
            results.append(r)
        return results

    def warmup(self) -> float:
        """Compile every program the engine can need (:meth:`~jaxlab.engine.runner.Runner.warmup`: decode and
        prefill, each page-table width, each serving greedy and sampling rows and top logprobs when a row asks),
        probing the row buckets first; returns seconds spent compiling."""
        return self.runner.warmup()
