"""The continuous engine's device side: parameters, the paged cache, compiled programs, and the arrays of a step.

:class:`Runner` knows nothing of queues or admission (:mod:`~jaxlab.engine.scheduler` decides who runs) nor of
text (:class:`~jaxlab.engine.continuous.Engine` turns tokens into outputs). Given the request records a step runs,
it packs their tokens, positions, page tables, sampling rows, seeds and grammar masks into fixed shapes, runs the
compiled program and returns each row's token, logprob and (when asked) top alternatives. A step may be started and
read apart (:meth:`Runner.launch`, :meth:`Runner.fetch`): the engine's look-ahead starts the next decode call, fed
this one's tokens on the device (:meth:`Runner.decode_next`), before it reads them.

Compiled shapes are fixed: the decode program takes ``slots`` rows of one token (or a smaller row bucket, with
``decode_buckets``; with ``speculative=k``, one token and up to ``k`` drafts per row: the verify program), the
prefill program one row of ``chunk`` tokens, each for a few page-table widths
(:attr:`Runner.widths`, a bucket of the longest row); one program serves greedy and sampling rows (the draw runs
under a branch taken only when a row samples) and top logprobs (likewise). :meth:`Runner.warmup` compiles them all;
after it no mix of requests compiles anything (a test counts).
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.engine import paged
from jaxlab.engine.grammar import allow_all
from jaxlab.engine.kvcache import key_layout_for
from jaxlab.engine.model import Params
from jaxlab.engine.paged import init_paged_cache
from jaxlab.engine.plan import TOP_LOGPROBS, bucket
from jaxlab.engine.programs import Programs, Verdicts
from jaxlab.engine.sampling import SamplingParams, stack_rows
from jaxlab.engine.steps import jit_rows, jit_rows_verify
from jaxlab.errors import InvalidRequestError

PAGE_SIZE = 16  # positions per page
CHUNK = 128  # prompt tokens per prefill call (benchmarks/NOTES.md 20)

#: Decode row buckets (what vLLM's and SGLang's captured batch sizes are): with ``decode_buckets``, a step decodes the
#: running sequences in the smallest of these (up to ``slots``) that holds them, instead of all ``slots`` rows
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


def default_chunk(context: int, page_size: int) -> int:
    """Prompt tokens per prefill call when none is given: :data:`CHUNK`, or fewer where the context is shorter (its
    positions rounded up to whole pages), so a small context's prefill computes no positions it cannot hold."""
    return min(CHUNK, -(-context // page_size) * page_size)


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


class Launched(NamedTuple):
    """A step started on the device (:meth:`Runner.launch`): its arrays, still being computed."""

    tokens: Any  # [rows] next tokens ([rows, 1 + k] with drafts)
    logp: Any
    tops: Any  # (top logprobs, their ids), or None when no row asked


def _row(tops, r: int):
    """Row ``r`` of a step's (top logprobs, their ids), or None when the step did not compute them."""
    return None if tops is None else (tops[0][r], tops[1][r])


#: the step each program name runs: one token per decode row, or one token then its drafts (speculative)
PROGRAMS = {"decode": jit_rows, "prefill": jit_rows, "verify": jit_rows_verify}


class Runner:
    """Programs, page tables and sampling rows of the continuous engine (see the module's docstring).

    A *row* is a request record (:class:`~jaxlab.engine.continuous.Stream`): the runner reads its ``seq`` (tokens,
    pages, positions computed), ``request`` (seed, sampling, top logprobs) and ``matcher`` (its grammar), or None for
    a free row. ``decode_buckets``: decode in the smallest row bucket (:data:`ROW_BUCKETS`) that holds the running
    sequences, among those :meth:`warmup` found batch-invariant (:meth:`probe_buckets`)."""

    def __init__(
        self,
        params: Params,
        *,
        slots: int,
        page_size: int,
        chunk: int,
        context: int,
        num_pages: int,
        cache_dtype,
        decode_buckets: bool = False,
        speculative: int = 0,
    ):
        self.params, self.config = params, params.config
        self.k = speculative  # draft tokens a decode row may carry (0: plain decode)
        self.slots, self.page_size, self.chunk, self.context = slots, page_size, chunk, context
        self.widths = table_widths(context, page_size)
        self.cache_dtype = jnp.dtype(cache_dtype)
        layout = key_layout_for(params.policy.attention, self.cache_dtype)  # keys transposed: XLA:CPU, float32
        self.cache = init_paged_cache(self.config, num_pages, page_size, dtype=self.cache_dtype, key_layout=layout)
        self.programs = Programs()
        self.decode_buckets = decode_buckets
        self.row_buckets: tuple[int, ...] = (slots,)  # the decode row counts in use (warmup() may add smaller ones)
        self.bucket_probe: dict[int, bool] = {}  # bucket -> its probe row equalled the full step's (after warmup)
        self.probe_stored = False  # the probe's verdicts came from an earlier run of the same programs on this host
        self.verdicts: Verdicts | None = None  # where warmup keeps the probe's verdicts (None: Verdicts(), beside
        # the persistent compile cache when one is on)
        self.bucket_steps: dict[int, int] = {}  # bucket -> decode calls it ran
        self.mask_seconds = 0.0  # host time spent filling grammar masks (structured output)
        self._free_masks: dict[int, jax.Array] = {}  # rows -> the all-ones grammar bitmask, on the device
        self._flags = {w: jax.device_put(np.bool_(w)) for w in (False, True)}  # "a row wants top logprobs"
        self._steps: dict[tuple, Any] = {}  # (program, tokens' shape, width) -> its compiled program
        self._greedy: dict[int, tuple] = {}  # rows -> an all-greedy step's settings, on the device

    # ---- the arrays of a step --------------------------------------------------------------------

    def width(self, positions: int) -> int:
        """The page-table width (positions) of a step whose longest row reaches ``positions``."""
        for w in self.widths:
            if positions <= w:
                return w
        raise InvalidRequestError(f"{positions} positions exceed the engine's context {self.context}")

    def table(self, seqs: Sequence, width: int) -> np.ndarray:
        per_row = width // self.page_size
        table = np.zeros((len(seqs), per_row), np.int32)
        for r, seq in enumerate(seqs):
            if seq is not None:  # a row may already hold pages for a later chunk of this step: not read now
                pages = seq.pages[:per_row]
                table[r, : len(pages)] = pages
        return table

    def sampling(self, rows: Sequence):
        """The step's per-row settings (:func:`~jaxlab.engine.sampling.stack_rows`); an all-greedy step's are kept
        on the device per row count, so they cost no transfer."""
        params = [r.request.sampling if r is not None else SamplingParams() for r in rows]
        if all(p.greedy for p in params):
            n = len(params)
            if n not in self._greedy:
                self._greedy[n] = jax.device_put(stack_rows([SamplingParams()] * n))
            return self._greedy[n]
        return stack_rows(params)

    def allowed(self, rows: Sequence):
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
        self.mask_seconds += time.perf_counter() - t0
        return jax.device_put(mask)

    def run(self, name: str, rows: Sequence, tokens, positions, width: int, table: np.ndarray | None = None):
        """One compiled step over ``rows`` (records or None): -> (next token, its logprob, top alternatives or
        None) per row, as NumPy arrays. ``table``: the page table to use instead of the rows' own (the probe)."""
        return self.fetch(self.launch(name, rows, tokens, positions, width, table))

    def launch(self, name: str, rows: Sequence, tokens, positions, width: int, table: np.ndarray | None = None):
        """Start one compiled step (what :meth:`run` does, without waiting for it): -> a :class:`Launched` whose
        arrays the device is still computing. ``tokens``: [rows, t] on the host, or for a decode step the [rows]
        tokens a launched step computes (:meth:`decode_next`)."""
        samp, greedy_rows = self.sampling(rows)
        if table is None:
            table = self.table([r.seq if r is not None else None for r in rows], width)
        cache = self.cache.with_table(table)
        seeds = np.asarray([r.request.seed if r is not None else 0 for r in rows], np.uint32)
        if name == "decode" and isinstance(tokens, np.ndarray):
            tokens = tokens[:, 0]  # the decode program takes one token per row, shaped as a step's output
        # device_put, not jnp.asarray: converting a NumPy array with jnp.asarray compiles a small program per shape
        tokens, positions, seeds = jax.device_put((tokens, positions, seeds))
        # every program can return the top alternatives; a step computes them only when a row asked (a branch in the
        # program: one program per shape serves both, half the programs to compile at warm-up)
        wanted = any(r is not None and r.request.top_logprobs for r in rows)
        flag = self._flags[wanted]
        args = (self.params, tokens, positions, cache, seeds, samp, greedy_rows, self.allowed(rows), flag)
        # the step's shapes follow from these three (the parameters and the pools never change): a dict lookup per
        # step instead of the full signature, which walks every parameter (~2 ms a step on a CPU)
        key = (name, tokens.shape, width)
        fn = self._steps.get(key)
        if fn is None:
            fn = self._steps[key] = self.programs.get(name, PROGRAMS[name], args, {"top": TOP_LOGPROBS})[0]
        nxt, logp, tops, self.cache = fn(*args)
        return Launched(nxt, logp, tops if wanted else None)

    @staticmethod
    def fetch(launched: Launched) -> tuple:
        """Wait for a launched step: -> (next tokens, logprobs, (top logprobs, their ids) or None) as NumPy arrays."""
        tops = launched.tops
        return (
            np.asarray(launched.tokens),
            np.asarray(launched.logp),
            None if tops is None else (np.asarray(tops[0]), np.asarray(tops[1])),
        )

    @property
    def decode_program(self) -> tuple[str, int]:
        """(program name, tokens per row) of a decode call: one token, or with drafts one token and ``k`` drafts."""
        return ("verify", 1 + self.k) if self.k else ("decode", 1)

    def decode_launch(self, rows: Sequence, drafts: Sequence[Sequence[int]] | None = None) -> Launched:
        """Start one step for each record in ``rows`` (at most ``slots``), packed into the first rows of the smallest
        row bucket that holds them (a row reads only its own pages, so which row a sequence takes does not matter; the
        call's row count is ``len(launched.tokens)``). With ``k`` drafts a row also carries its own ``drafts`` (up to
        ``k`` tokens after its last; its pages must hold them). :meth:`results` reads per record the model's tokens
        after its last token and after each draft, their logprobs, the top alternatives of the first or None."""
        size = bucket(len(rows), self.row_buckets)
        padded = list(rows) + [None] * (size - len(rows))
        name, t = self.decode_program
        tokens = np.zeros((size, t), np.int32)
        positions = np.full((size, t), -1, np.int32)
        reach = 0
        for r, row in enumerate(rows):
            c = row.seq.computed
            ahead = list(drafts[r]) if drafts is not None else []
            tokens[r, : 1 + len(ahead)] = [row.seq.tokens[c], *ahead]
            positions[r, : 1 + len(ahead)] = np.arange(c, c + 1 + len(ahead))
            reach = max(reach, c + 1 + len(ahead))
        return self._count(self.launch(name, padded, tokens, positions, self.width(reach)), size)

    def decode_next(self, launched: Launched, rows: Sequence) -> Launched:
        """Start the decode step after ``launched`` (a plain decode step) before its tokens reach the host: the same
        rows (None: a row that no longer decodes, now free), each fed the token ``launched`` computes for it, on
        the device, at the position after the one it decoded there. Each record's pages must hold that position
        (its ``seq.computed`` not yet advanced past ``launched``'s)."""
        positions = np.full((len(rows), 1), -1, np.int32)
        reach = 0
        for r, row in enumerate(rows):
            if row is not None:
                positions[r, 0] = row.seq.computed + 1
                reach = max(reach, row.seq.computed + 2)
        return self._count(self.launch("decode", rows, launched.tokens, positions, self.width(reach)), len(rows))

    def _count(self, launched: Launched, size: int) -> Launched:
        self.bucket_steps[size] = self.bucket_steps.get(size, 0) + 1
        return launched

    @staticmethod
    def results(fetched: tuple, rows: Sequence[int]) -> list[tuple]:
        """Per row index in ``rows``: (its tokens, their logprobs, its top alternatives or None) from a fetched
        decode step (:meth:`fetch`)."""
        out, logp, tops = fetched
        if out.ndim == 1:
            out, logp = out[:, None], logp[:, None]
        return [(out[r].tolist(), logp[r].tolist(), _row(tops, r)) for r in rows]

    def prefill(self, row, start: int, end: int) -> tuple[int, float, tuple | None]:
        """Prompt positions ``[start, end)`` of one record, left-padded to one chunk (the last column is real): ->
        the token after ``end``, its logprob and top alternatives (or None)."""
        n = end - start
        tokens = np.zeros((1, self.chunk), np.int32)
        positions = np.full((1, self.chunk), -1, np.int32)
        tokens[0, self.chunk - n :] = row.seq.prompt[start:end]
        positions[0, self.chunk - n :] = np.arange(start, end)
        nxt, logp, tops = self.run("prefill", [row], tokens, positions, self.width(end))
        return int(nxt[0]), float(logp[0]), _row(tops, 0)

    # ---- compiling ahead of time -----------------------------------------------------------------

    def warmup(self) -> float:
        """Compile every program a step can need (decode and prefill, each page-table width; each serves greedy and
        sampling rows, and returns top logprobs when a step's row asks), after probing the row buckets; the programs
        are lowered in turn and compiled side by side on the CPU's cores
        (:meth:`~jaxlab.engine.programs.Programs.compile_many`); nothing but the probe runs. Returns seconds spent
        compiling."""
        before = self.programs.compile_seconds_total
        candidates = self.candidate_buckets()
        name, t = self.decode_program
        if len(candidates) > 1:  # the probe runs each candidate once; only the kept ones get every page-table width
            full = self.programs.lower(*self.program(name, self.slots, t, self.widths[0]))
            verdicts = self.verdicts or Verdicts()
            key = verdicts.key("row-bucket probe", full.as_text(), candidates)
            stored = verdicts.get(key)
            if isinstance(stored, dict) and set(stored) == {str(b) for b in candidates}:
                self.bucket_probe = {b: bool(stored[str(b)]) for b in candidates}  # same program text, same host
                self.probe_stored = True
            else:
                self.programs.compile_many([self.program(name, b, t, self.widths[0]) for b in candidates])
                self.bucket_probe = self.probe_buckets(candidates)
                verdicts.put(key, {str(b): same for b, same in self.bucket_probe.items()})
            self.row_buckets = tuple(b for b in candidates if self.bucket_probe[b])
        shapes = [(name, b, t) for b in self.row_buckets] + [("prefill", 1, self.chunk)]
        items = [self.program(name, rows, t, width) for width in self.widths for name, rows, t in shapes]
        self.programs.compile_many(items)
        return self.programs.compile_seconds_total - before

    def program(self, name: str, rows: int, t: int, width: int) -> tuple:
        """(name, jitted step, arguments, static) of the program a step of ``rows`` rows of ``t`` tokens at page-table
        width ``width`` runs: what :meth:`warmup` compiles (free rows: every position -1)."""
        samp, greedy_rows = self.sampling([None] * rows)
        args = (
            self.params,
            jnp.zeros((rows,) if name == "decode" else (rows, t), jnp.int32),  # decode: one token per row
            jnp.full((rows, t), -1, jnp.int32),
            self.cache.with_table(np.zeros((rows, width // self.page_size), np.int32)),
            jnp.zeros(rows, jnp.uint32),
            samp,
            greedy_rows,
            self.allowed([None] * rows),  # the free rows' mask, cached for the steps
            self._flags[False],
        )
        return name, PROGRAMS[name], args, {"top": TOP_LOGPROBS}

    def candidate_buckets(self) -> tuple[int, ...]:
        """The decode row counts warm-up compiles: :data:`ROW_BUCKETS` below ``slots``, and ``slots``."""
        if not self.decode_buckets:
            return (self.slots,)
        return tuple(b for b in ROW_BUCKETS if b < self.slots) + (self.slots,)

    def probe_buckets(self, buckets: Sequence[int]) -> dict[int, bool]:
        """Whether one probe row (token 1 at position 0, in page 1 of the pool: its own, as a request's row has)
        gets the same token and the same log-probability, bit for bit, in each bucket as in the full ``slots``-row
        step: the buckets a request may run in without its tokens depending on how many run beside it. (The
        padding rows write to the null page: a probe row there would read their keys, not its own.)"""
        out = {}
        name, t = self.decode_program
        width = self.widths[0]
        for b in buckets:
            tokens = np.zeros((b, t), np.int32)
            positions = np.full((b, t), -1, np.int32)
            tokens[0, 0], positions[0, 0] = 1, 0
            table = np.zeros((b, width // self.page_size), np.int32)
            table[0, 0] = 1  # warm-up runs before any request holds a page
            nxt, logp, _ = self.run(name, [None] * b, tokens, positions, width, table)
            out[b] = (nxt[0].tobytes(), logp[0].tobytes())
        full = out[self.slots]
        return {b: out[b] == full for b in buckets}
