"""Continuous batching's scheduler: which sequences run in the next step, and what each computes.

Host-side bookkeeping only (no arrays, no model), so its rules are tested on their own. Every step
(:meth:`Scheduler.schedule`):

1. **Admit** waiting sequences into free slots, first come first served, while memory allows: with a
   ``watermark`` (a fraction of the pool), the sequence at the head of the queue is admitted only if the free
   pages, less those the running sequences still need for their prompts, hold its prompt and leave the
   watermark free for the running sequences' growth (admission by memory: how many run is decided by the KV
   budget, up to ``max_running``); without one, whenever a slot is free (the pages are found as positions are
   written, and preemption makes room). A sequence preempted earlier goes
   back to the waiting queue in its arrival order, so it is admitted before anything that arrived after it:
   no request is starved. The longest run of full prompt pages found in the prefix table
   (:class:`~jaxlab.engine.pages.PagePool`) is taken instead of computed (prefix reuse); a sequence whose
   next page an older one is computing at that moment (a burst of requests with one system prompt) waits
   for it and reads it, rather than computing the same page twice.
2. **Decode**: every running sequence whose prompt is in the cache feeds one token.
3. **Prefill** under the per-step token budget: what the budget leaves after the decode tokens goes to
   prompt chunks, oldest sequence first. Chunk boundaries are multiples of ``chunk`` counted from position 0,
   whatever else runs, so a prompt is computed the same way alone or in a crowd.
4. **Pages** are taken as positions are about to be written. When none is free, the newest running sequence
   is preempted: its pages are released (the prefix table keeps the full prompt pages findable) and it
   waits again; when readmitted, its prompt is prefilled and the tokens it had generated are fed again one
   decode step each (:attr:`Seq.replay`), the same computation as the first time, so its output is unchanged.

Finished sequences release their pages and slot at once (:meth:`Scheduler.finish`); :meth:`Scheduler.abort`
does the same for a request given up.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass, field

from jaxlab.engine.pages import PagePool, page_hashes
from jaxlab.errors import InvalidRequestError


@dataclass
class Seq:
    """One request's state on the host."""

    id: str
    prompt: list[int]
    max_new_tokens: int
    arrival: int  # arrival order (first come, first served)
    generated: list[int] = field(default_factory=list)
    computed: int = 0  # positions whose keys and values are in the pages
    pages: list[int] = field(default_factory=list)
    slot: int | None = None
    hashes: list[bytes] = field(default_factory=list)  # chained hashes of the full prompt pages
    registered: int = 0  # prompt pages entered in the prefix table
    reused: int = 0  # prompt positions read from the prefix table at the last admission
    preemptions: int = 0
    done: bool = False

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.generated

    @property
    def prefilling(self) -> bool:
        return self.computed < len(self.prompt)

    @property
    def replay(self) -> bool:
        """Feeding tokens generated before a preemption again (their outputs are known)."""
        return not self.prefilling and self.computed < len(self.tokens) - 1


@dataclass
class Chunk:
    seq: Seq
    start: int  # prompt positions [start, end)
    end: int

    @property
    def last(self) -> bool:
        return self.end == len(self.seq.prompt)


@dataclass
class StepPlan:
    decode: list[Seq]
    chunks: list[Chunk]
    preempted: list[Seq]

    @property
    def empty(self) -> bool:
        return not self.decode and not self.chunks


class Scheduler:
    """Slots, pages and the token budget of a continuous-batching engine (see the module's docstring).
    ``max_running``: sequences that may run at once (each holds a slot); ``watermark``: admission by memory, the
    fraction of the pool kept free for growth when admitting (None: admit whenever a slot is free)."""

    def __init__(
        self,
        max_running: int,
        pool: PagePool,
        chunk: int,
        token_budget: int,
        max_len: int,
        prefix_reuse: bool = True,
        watermark: float | None = None,
    ):
        if chunk % pool.page_size:
            raise InvalidRequestError(
                f"the prefill chunk ({chunk}) must be a multiple of the page size ({pool.page_size})"
            )
        if token_budget < max_running + chunk:
            raise InvalidRequestError(
                f"a token budget of {token_budget} cannot hold a decode token for each of {max_running} running "
                f"sequences and one prefill chunk of {chunk}: give at least {max_running + chunk}"
            )
        if watermark is not None and not 0 <= watermark < 1:
            raise InvalidRequestError(f"the watermark is a fraction of the page pool in [0, 1), got {watermark}")
        self.max_running, self.pool, self.chunk, self.token_budget = max_running, pool, chunk, token_budget
        self.watermark = None if watermark is None else math.ceil(watermark * pool.capacity)  # in pages
        self.max_len, self.prefix_reuse = max_len, prefix_reuse
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []  # by arrival
        self.free_slots = list(range(max_running))
        self._arrivals = 0
        self.preemptions = 0
        self._preempted: list[Seq] = []

    # ---- requests in and out -----------------------------------------------------------------------

    def add(self, request_id: str, prompt: list[int], max_new_tokens: int) -> Seq:
        need = len(prompt) + max_new_tokens
        if need > self.max_len:
            raise InvalidRequestError(
                f"the prompt ({len(prompt)} tokens) plus {max_new_tokens} new tokens needs {need} positions, "
                f"but this engine holds at most {self.max_len} per sequence: shorten the prompt or ask for fewer tokens"
            )
        pages = -(-need // self.pool.page_size)
        if pages > self.pool.capacity:
            raise InvalidRequestError(
                f"the request needs {pages} pages of {self.pool.page_size} tokens, the pool holds {self.pool.capacity}: "
                "give the engine more pages or ask for fewer tokens"
            )
        seq = Seq(request_id, list(prompt), max_new_tokens, self._arrivals)
        seq.hashes = page_hashes(seq.prompt, self.pool.page_size)
        self._arrivals += 1
        self.waiting.append(seq)
        return seq

    def finish(self, seq: Seq) -> None:
        """The sequence is done (or aborted): its pages and slot are free at once."""
        seq.done = True
        if seq in self.running:
            self._evict(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)

    def _evict(self, seq: Seq) -> None:
        self.running.remove(seq)
        self.pool.release(seq.pages)
        seq.pages, seq.computed, seq.registered = [], 0, 0
        self.free_slots.append(seq.slot)
        self.free_slots.sort()
        seq.slot = None

    def preempt(self, seq: Seq) -> None:
        """Release ``seq``'s pages and slot and put it back among the waiting, in its arrival order."""
        self._evict(seq)
        seq.preemptions += 1
        self.preemptions += 1
        self._preempted.append(seq)
        arrivals = [s.arrival for s in self.waiting]
        self.waiting.insert(bisect.bisect(arrivals, seq.arrival), seq)

    # ---- one step ----------------------------------------------------------------------------------

    def _admit(self) -> None:
        while self.free_slots and self.waiting:
            if not self._fits(self.waiting[0]):
                break  # first come, first served: nothing overtakes the head of the queue
            seq = self.waiting.popleft()
            seq.slot = self.free_slots.pop(0)
            seq.reused = 0
            self._reuse(seq)
            bisect.insort(self.running, seq, key=lambda s: s.arrival)

    def pages_to_resume(self, seq: Seq) -> int:
        """Pages ``seq`` still has to take before it decodes new tokens: its prompt (and, after a preemption, the
        tokens it generated, fed again), less the pages it holds."""
        return max(0, -(-len(seq.tokens) // self.pool.page_size) - len(seq.pages))

    def _fits(self, seq: Seq) -> bool:
        """Admission by memory: whether the free pages, less what the running sequences still need for their
        prompts, hold ``seq``'s (less its reusable prefix) and leave the watermark free. Always true without a
        watermark, and when nothing runs (a request that fits the pool at all must be able to start)."""
        if self.watermark is None or not self.running:
            return True
        reserved = sum(self.pages_to_resume(s) for s in self.running)
        need = self.pages_to_resume(seq)
        if self.prefix_reuse and not seq.pages:  # prompt pages another running request holds are read, not taken
            need -= self.pool.held_prefix(seq.hashes[: (len(seq.prompt) - 1) // self.pool.page_size])
        return self.pool.free_count - reserved - need >= self.watermark

    def _reuse(self, seq: Seq) -> None:
        """Take the registered pages that continue ``seq``'s prompt (never its last token's page: that token's
        logits are needed), when its cache ends on a page boundary."""
        ps = self.pool.page_size
        if not self.prefix_reuse or seq.computed != len(seq.pages) * ps:
            return
        usable = seq.hashes[len(seq.pages) : (len(seq.prompt) - 1) // ps]
        more = self.pool.match_prefix(usable)
        seq.pages += more
        seq.computed, seq.registered = len(seq.pages) * ps, len(seq.pages)
        seq.reused += len(more) * ps

    def _being_computed(self, seq: Seq) -> bool:
        """Whether an older running sequence is computing the page ``seq`` needs next (same chained hash, not
        registered yet): then ``seq`` waits a step and reads it instead of computing it twice."""
        i = len(seq.pages)
        if not self.prefix_reuse or i >= (len(seq.prompt) - 1) // self.pool.page_size:
            return False
        for other in self.running:
            if other is seq or other.arrival > seq.arrival:
                break
            if other.registered <= i < len(other.hashes) and other.hashes[i] == seq.hashes[i] and other.prefilling:
                return True
        return False

    def pages_for(self, seq: Seq, end: int) -> bool:
        """Take pages until ``seq`` can hold positions [0, end); preempt the newest sequences for them.
        False when ``seq`` itself was the newest and was preempted."""
        need = -(-end // self.pool.page_size)
        while len(seq.pages) < need:
            page = self.pool.allocate()
            if page is None:
                victim = self.running[-1]
                self.preempt(victim)
                if victim is seq:
                    return False
                continue
            seq.pages.append(page)
        return True

    def reserve(self, seq: Seq, end: int) -> int:
        """Take free pages until ``seq`` can hold positions [0, end), preempting nobody (speculative drafts: a row
        carries only the drafts its pages reach); -> the end it can hold, at most ``end``."""
        need = -(-end // self.pool.page_size)
        while len(seq.pages) < need:
            page = self.pool.allocate()
            if page is None:
                break
            seq.pages.append(page)
        return min(end, len(seq.pages) * self.pool.page_size)

    def schedule(self) -> StepPlan:
        self._admit()
        self._preempted = []
        decode = []
        for seq in list(self.running):
            if seq in self.running and not seq.prefilling and self.pages_for(seq, seq.computed + 1):
                decode.append(seq)
        budget = self.token_budget - len(decode)
        chunks = []
        for seq in list(self.running):
            if seq not in self.running or not seq.prefilling:
                continue
            self._reuse(seq)
            if self._being_computed(seq):
                continue
            at = seq.computed
            while seq in self.running and at < len(seq.prompt) and budget >= self.chunk:
                end = min((at // self.chunk + 1) * self.chunk, len(seq.prompt))
                if not self.pages_for(seq, end):
                    break
                chunks.append(Chunk(seq, at, end))
                budget -= self.chunk
                at = end
        preempted = list(self._preempted)
        decode = [s for s in decode if s in self.running]
        chunks = [c for c in chunks if c.seq in self.running]
        return StepPlan(decode, chunks, preempted)

    # ---- after the device ran the step -------------------------------------------------------------

    def computed(self, seq: Seq, end: int) -> None:
        """Positions [0, end) of ``seq`` are in its pages; full prompt pages become findable."""
        seq.computed = end
        if self.prefix_reuse:
            full = min(end, len(seq.prompt)) // self.pool.page_size
            for i in range(seq.registered, full):
                self.pool.register(seq.pages[i], seq.hashes[i])
            seq.registered = max(seq.registered, full)

    def idle(self) -> bool:
        return not self.waiting and not self.running

    def stored(self) -> tuple[int, int]:
        """(tokens stored, pages held) over the running sequences, shared prefix pages counted once."""
        held = {p for s in self.running for p in s.pages}
        pages, stored, ps = len(held), 0, self.pool.page_size
        for s in self.running:
            for i, p in enumerate(s.pages):
                if p in held:
                    stored += max(0, min(ps, s.computed - i * ps))
                    held.discard(p)
        return stored, pages

    def kv_use(self) -> float:
        """Stored tokens / pool capacity in tokens."""
        return self.stored()[0] / (self.pool.capacity * self.pool.page_size)

    def page_fill(self) -> float:
        """Stored tokens / the capacity of the pages held: what paging wastes (at most a page per sequence)."""
        stored, pages = self.stored()
        return stored / (pages * self.pool.page_size) if pages else 1.0
