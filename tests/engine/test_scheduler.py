"""The continuous-batching scheduler on its own: admission, budget, chunks, pages, preemption, prefix reuse.

No model here: a step is "run" by telling the scheduler what was computed, as the engine does."""

from __future__ import annotations

import random

import pytest

from jaxlab.engine.pages import PagePool, page_hashes
from jaxlab.engine.scheduler import Scheduler
from jaxlab.errors import InvalidRequestError


def make(slots=2, pages=9, page_size=4, chunk=8, budget=None, max_len=64, reuse=True, watermark=None):
    pool = PagePool(pages, page_size)
    sched = Scheduler(slots, pool, chunk, budget or slots + chunk, max_len, prefix_reuse=reuse, watermark=watermark)
    return sched, pool


def run_step(sched, new_token=7):
    """Plan one step and apply it as the engine would (decode tokens appended unless replayed)."""
    plan = sched.schedule()
    for seq in plan.decode:
        replay = seq.replay
        sched.computed(seq, seq.computed + 1)
        if not replay:
            seq.generated.append(new_token)
    for ch in plan.chunks:
        sched.computed(ch.seq, ch.end)
        if ch.last and not ch.seq.generated:
            ch.seq.generated.append(new_token)
    for seq in list(sched.running):
        if len(seq.generated) >= seq.max_new_tokens and not seq.replay:
            sched.finish(seq)
    return plan


def check_pool(sched, pool):
    """Every page is free xor held, and each count equals the holders."""
    holders = {}
    for s in sched.running:
        for p in s.pages:
            holders[p] = holders.get(p, 0) + 1
    for p in range(1, pool.num_pages):
        assert pool.refs[p] == holders.get(p, 0), (p, pool.refs[p], holders.get(p))
        assert (p in pool.free) == (pool.refs[p] == 0)
    assert 0 not in pool.free and all(0 not in s.pages for s in sched.running)


def test_chunks_start_at_multiples_of_the_chunk_and_decode_shares_the_budget():
    sched, pool = make(slots=2, pages=20, chunk=8, budget=2 + 8)
    a = sched.add("a", list(range(1, 20)), 3)  # 19 prompt tokens: chunks [0,8) [8,16) [16,19)
    plan = run_step(sched)
    assert [(c.start, c.end) for c in plan.chunks] == [(0, 8)] and plan.decode == []
    assert [(c.start, c.end) for c in run_step(sched).chunks] == [(8, 16)]
    plan = run_step(sched)
    assert [(c.start, c.end) for c in plan.chunks] == [(16, 19)] and plan.chunks[0].last
    assert a.generated == [7] and not a.prefilling
    sched.add("b", [5] * 9, 2)
    plan = run_step(sched)  # a decodes (1 token of the budget), b's first chunk fits in the other 9
    assert plan.decode == [a] and [(c.seq.id, c.start, c.end) for c in plan.chunks] == [("b", 0, 8)]
    check_pool(sched, pool)


def test_admission_is_first_come_first_served_and_slots_refill_between_steps():
    sched, pool = make(slots=1, pages=20)
    x = sched.add("x", [1, 2, 3], 2)
    y = sched.add("y", [4, 5], 1)
    run_step(sched)
    assert x.slot == 0 and y.slot is None  # one slot: y waits
    run_step(sched)  # x's second token: x finishes, its slot is free at once
    assert x.done and pool.free_count == pool.capacity
    plan = run_step(sched)
    assert [c.seq for c in plan.chunks] == [y] and y.generated == [7] and y.done and y.slot is None


def test_the_newest_sequence_is_preempted_when_pages_run_out_and_recomputed_later():
    # 4 usable pages of 4 tokens; two sequences of 8 prompt tokens + 8 new need 4 pages each
    sched, pool = make(slots=2, pages=5, page_size=4, chunk=8, budget=2 + 16, reuse=False)
    old = sched.add("old", list(range(1, 9)), 8)
    new = sched.add("new", list(range(11, 19)), 8)
    preempted = []
    for _ in range(40):
        plan = run_step(sched)
        preempted += [s.id for s in plan.preempted]
        check_pool(sched, pool)
        if sched.idle():
            break
    assert sched.idle() and preempted and set(preempted) == {"new"}
    assert old.generated == [7] * 8 and new.generated == [7] * 8 and new.preemptions >= 1


def test_replay_feeds_the_generated_tokens_again_before_new_ones():
    sched, pool = make(slots=1, pages=20, reuse=False)
    s = sched.add("s", [1, 2, 3, 4, 5], 6)
    run_step(sched)
    run_step(sched)
    assert s.generated == [7, 7] and s.computed == 6
    sched.preempt(s)  # as if pages ran out
    assert s.computed == 0 and not s.pages and sched.waiting[0] is s
    run_step(sched, new_token=9)  # the prompt again: its sampled token is not a new one
    assert s.generated == [7, 7] and s.computed == 5
    assert s.replay
    run_step(sched, new_token=9)  # generated[0] fed again (known output)
    assert s.generated == [7, 7] and not s.replay
    run_step(sched, new_token=9)
    assert s.generated == [7, 7, 9]


def test_prefix_pages_are_reused_counted_and_freed():
    sched, pool = make(slots=2, pages=20, page_size=4, chunk=8, reuse=True)
    system = list(range(100, 110))  # 10 tokens: 2 full pages
    a = sched.add("a", system + [1, 2, 3], 6)
    run_step(sched)
    run_step(sched)  # a's prompt computed: pages 0-1 registered (page 2 holds 10, 11, 1.. not full of prompt)
    b = sched.add("b", system + [4], 2)
    run_step(sched)
    assert b.reused == 8 and b.pages[:2] == a.pages[:2]
    assert pool.refs[a.pages[0]] == 2 and pool.reused_pages == 2
    check_pool(sched, pool)
    while not sched.idle():
        run_step(sched)
    assert pool.free_count == pool.capacity  # every count back to 0
    # freed pages keep their hash until handed out again: a third request still finds them
    c = sched.add("c", system + [9, 9], 1)
    run_step(sched)
    assert c.reused == 8


def test_the_last_prompt_token_is_always_computed():
    sched, pool = make(slots=2, pages=20, page_size=4, chunk=8)
    p = list(range(1, 9))  # exactly 2 full pages
    sched.add("a", p, 1)
    run_step(sched)
    b = sched.add("b", p, 1)
    plan = run_step(sched)
    assert b.reused == 4 and [(c.start, c.end) for c in plan.chunks] == [(4, 8)]


def test_page_hashes_chain_the_prefix():
    assert page_hashes([1, 2, 3, 4, 5], 2)[1] == page_hashes([1, 2, 3, 4], 2)[1]
    assert page_hashes([1, 2, 3, 4], 2)[1] != page_hashes([9, 2, 3, 4], 2)[1]  # same page, other prefix
    assert len(page_hashes([1, 2, 3], 2)) == 1


def test_requests_that_cannot_fit_say_so():
    sched, _ = make(slots=2, pages=5, page_size=4, max_len=64)
    with pytest.raises(InvalidRequestError, match="pages"):
        sched.add("big", [1] * 10, 20)  # 30 positions: 8 pages, the pool has 4
    with pytest.raises(InvalidRequestError, match="at most 64"):
        sched.add("long", [1] * 60, 10)
    with pytest.raises(InvalidRequestError, match="multiple of the page size"):
        Scheduler(2, PagePool(5, 4), 6, 20, 64)
    with pytest.raises(InvalidRequestError, match="at least 10"):
        Scheduler(2, PagePool(5, 4), 8, 9, 64)


@pytest.mark.parametrize("seed", range(6))
def test_random_arrivals_every_request_finishes_and_pages_balance(seed):
    rng = random.Random(seed)
    sched, pool = make(slots=3, pages=12, page_size=4, chunk=8, budget=3 + 16, max_len=40)
    pending = [(rng.randrange(0, 30), f"r{i}", rng.randrange(1, 20), rng.randrange(1, 12)) for i in range(10)]
    pending.sort()
    seqs, t = [], 0
    while pending or not sched.idle():
        while pending and pending[0][0] <= t:
            _, rid, n, m = pending.pop(0)
            seqs.append(sched.add(rid, [rng.randrange(1, 5) for _ in range(n)], m))
        run_step(sched)
        check_pool(sched, pool)
        t += 1
        assert t < 2000, "the scheduler stopped making progress"
    assert all(s.done and len(s.generated) == s.max_new_tokens for s in seqs)
    assert pool.free_count == pool.capacity


def test_a_burst_with_one_prefix_computes_it_once():
    """Requests admitted together with the same system prompt: the first computes its pages, the others wait a
    step and read them."""
    sched, pool = make(slots=3, pages=40, page_size=4, chunk=8, budget=3 + 24)
    system = list(range(100, 116))  # 16 tokens: 4 full pages, 2 chunks
    seqs = [sched.add(f"s{i}", system + [i + 1, i + 2], 2) for i in range(3)]
    computed_chunks = []
    while not sched.idle():
        computed_chunks += [(c.seq.id, c.start, c.end) for c in run_step(sched).chunks]
    assert [c for c in computed_chunks if c[0] == "s0"] == [("s0", 0, 8), ("s0", 8, 16), ("s0", 16, 18)]
    assert all(c[1] >= 16 for c in computed_chunks if c[0] != "s0")  # the others computed only their own tail
    assert seqs[1].reused == seqs[2].reused == 16 and pool.reused_pages == 8


def test_admission_by_memory_waits_for_pages_and_keeps_the_watermark():
    """With a watermark, the head of the queue starts only if the free pages, less what the running sequences
    still need for their prompts, hold its prompt and leave the watermark free; nothing overtakes it; a request
    alone always starts; slots (max_running) still bound it."""
    sched, pool = make(slots=8, pages=1 + 10, page_size=4, chunk=8, budget=8 + 16, reuse=False, watermark=0.2)
    assert sched.watermark == 2  # pages: ceil(0.2 x 10)
    a = sched.add("a", [1] * 16, 4)  # 4 prompt pages
    b = sched.add("b", [2] * 16, 4)  # 4 more: 10 free - 4 reserved for a - 4 = 2 >= 2, starts
    c = sched.add("c", [3] * 4, 4)  # 1 page: 10 - 8 - 1 = 1 < 2, waits
    d = sched.add("d", [4], 2)  # would fit, but c is ahead of it
    sched.schedule()
    assert sched.running == [a, b] and list(sched.waiting) == [c, d]
    while not a.done:  # a finishes: its 5 pages come back, c and d start
        run_step(sched)
    run_step(sched)
    assert c in sched.running and d in sched.running
    check_pool(sched, pool)
    big, _ = make(slots=2, pages=1 + 5, page_size=4, chunk=8, watermark=0.5)
    alone = big.add("alone", [1] * 16, 4)  # 4 pages + a watermark of 3 do not fit 5, but nothing else runs
    big.schedule()
    assert big.running == [alone]
    slots, _ = make(slots=1, pages=40, watermark=0.01)
    x, y = slots.add("x", [1], 2), slots.add("y", [1], 2)
    slots.schedule()
    assert slots.running == [x] and list(slots.waiting) == [y]


def test_admission_by_memory_counts_a_preempted_sequences_tokens_and_shared_prefix_pages():
    """A preempted sequence needs pages for its prompt and the tokens it generated (fed again); prompt pages a
    running request holds are read, not taken from the free list, so they do not count against memory."""
    sched, pool = make(slots=4, pages=1 + 12, page_size=4, chunk=8, budget=4 + 16, watermark=0.0)
    system = list(range(10, 26))  # 16 tokens: 4 full pages
    a = sched.add("a", system + [1, 2], 6)
    while a.prefilling:
        run_step(sched)
    assert pool.held_prefix(a.hashes) == 4
    b = sched.add("b", system + [3, 4], 6)  # 5 prompt pages, 4 of them held by a: needs 1 of the 7 free
    assert sched.pages_to_resume(b) == 5
    sched.schedule()
    assert b in sched.running and b.reused == 16
    sched.preempt(b)
    b.generated = [7, 7, 7]  # as if it had generated 3 tokens: 18 + 3 positions = 6 pages to take again
    assert sched.pages_to_resume(b) == 6
