# %% [markdown]
# # 11 · Continuous batching over a paged KV cache
#
# *About 40 minutes.* Notebook 06 batched requests the simple way: pad them to one length, run them in
# lockstep, and return when the longest is done. A server cannot work like that: requests arrive at any
# moment and want different numbers of tokens. Real inference servers (vLLM, SGLang, JetStream,
# tpu-inference) rest on three ideas, and this notebook builds and measures each on the real SmolLM2-135M:
#
# 1. every sequence has **its own position** in the cache;
# 2. the cache is allocated in **pages** from one pool, with a page table per sequence;
# 3. the batch is **refilled between decode steps**: a finished request leaves at once, a new one joins.
#
# **Learning goals**
#
# - Draw the difference between a static and a continuous batch, and say where static batching wastes time.
# - Read a page table: where the key and value of position *p* live, and why memory then grows with each
#   sequence's own length.
# - Check *batch invariance*: a request's tokens do not depend on which requests run beside it.
# - Measure throughput and time to first token for both policies on a trace of arriving requests.
# - Explain prefix reuse: why a shared system prompt is computed once.
# - Size an engine by memory: admit requests while their pages fit, and decode them in row buckets.
#
# Links: [vLLM / PagedAttention paper](https://arxiv.org/abs/2309.06180) ·
# [Orca (iteration-level scheduling)](https://www.usenix.org/conference/osdi22/presentation/yu) ·
# [JAX `jit`](https://docs.jax.dev/en/latest/jit-compilation.html) ·
# [Pallas TPU paged attention](https://docs.jax.dev/en/latest/pallas/tpu/index.html)

# %% tags=["nbval-ignore-output"]
import matplotlib.pyplot as plt
import numpy as np

import jaxlab
from jaxlab.engine.continuous import Engine
from jaxlab.engine.generate import Generator
from jaxlab.engine.sampling import SamplingParams
from jaxlab.lab import batching
from jaxlab.lab.notebook import check, setup, show_source, table, verdict
from jaxlab.tools.profile import CompileCounter

setup()
m = jaxlab.load()
tok = m.tokenizer

# %% [markdown]
# ## 1 · Where static batching loses time
#
# Eight requests arrive over a few steps; each wants a different number of tokens. Below, each row is a
# *slot* (a row of the decode batch) and each coloured bar one request. **Predict first:** with three slots,
# how many steps does each policy need for all eight?
#
# The picture counts decode steps only (no model): it shows the scheduling alone.

# %% tags=["nbval-ignore-output"]
requests = [(0, 12), (0, 3), (1, 5), (2, 2), (3, 9), (4, 2), (5, 4), (6, 6)]  # (arrival step, tokens)
fig = batching.plot_timelines(requests, slots=3)
plt.show()

# %%
steps = {p: max(b[3] for b in batching.schedule_steps(requests, 3, p)) for p in ("static", "continuous")}
print(f"static: {steps['static']} steps, continuous: {steps['continuous']} steps")

# %% [markdown]
# Static batching holds every slot until its batch's longest request ends (the hatched bars), and a request
# that arrives during a batch waits for the whole batch. Continuous batching hands a slot to the next request
# the step after its last one finished.
#
# That needs each row to have its **own position**: in notebook 05's cache the batch shares one write index
# (rows are left-padded and move in lockstep), so a new row cannot start in the middle.
#
# ## 2 · Pages and the page table
#
# `jaxlab.engine.paged` stores keys and values in **pages** of `page_size` positions in one pool per layer,
# shaped `[kv_heads, num_pages, page_size, head_dim]` (the layout the Pallas TPU paged-attention kernel reads; on a
# CPU the float32 engine keeps each page's keys transposed, `[kv_heads, num_pages, head_dim, page_size]`: XLA:CPU's
# score matmul runs about twice as fast from them, `benchmarks/NOTES.md` 17).
# Each sequence has a **page table**: its position *p* lives in page `table[p // page_size]` at offset
# `p % page_size`. Pages are taken one at a time as a sequence grows, so a sequence holds at most one
# partly filled page, and finished sequences give their pages back at once. Page 0 is a *null page* that no
# sequence owns: padding writes go there.
#
# Taking a page is a pop from the pool's free list; the scheduler takes pages until a sequence can hold the
# positions it is about to compute (and preempts the newest sequence when none is free). Writing a token's key
# and value is one scatter through the page table:

# %% tags=["nbval-ignore-output"]
from jaxlab.engine.paged import write_pages
from jaxlab.engine.pages import PagePool
from jaxlab.engine.scheduler import Scheduler

_ = show_source(PagePool.allocate)
_ = show_source(Scheduler.pages_for)
_ = show_source(write_pages, skip_docstring=True)

# %% [markdown]
# Here is the engine after a few steps with three requests, two of which share a system prompt:

# %%
engine = Engine(m.params, tok, slots=4, page_size=16, chunk=64, context=256)
compile_s = engine.warmup()
print(f"compiled {len(engine.programs)} programs (decode and prefill, {len(engine.runner.widths)} page-table width)")


def chat(text, system=None):
    """A user message (and a system prompt) through the chat template, as token ids."""
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    return tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)


# %% tags=["nbval-ignore-output"]
system = "You are a helpful assistant. You answer in one short sentence, plainly, without lists. " * 2
a = engine.add_request(chat("What is the capital of France?", system), max_new_tokens=12, request_id="a")
b = engine.add_request(chat("Write a haiku about the sea."), max_new_tokens=12, request_id="b")
engine.step()
c = engine.add_request(chat("Name a large river.", system), max_new_tokens=12, request_id="c")
for _ in range(3):
    engine.step()
fig, tables = batching.plot_pool(engine, "after 4 steps")
plt.show()
print(tables)

# %% [markdown]
# Request `c` arrived later with the same system prompt as `a`: its first full pages are **the same
# physical pages** as `a`'s (hatched). That is prefix reuse (section 5).
#
# Attention reads a row's keys through its table, and a query at position *p* sees positions `0..p`. XLA gathers
# the row's pages into a copy (up to 256 positions at once, then block by block with an online softmax); on a CPU
# with AVX-512 a decode step reads them where they lie instead, in a kernel of jaxlab's own
# (`jaxlab.engine.kernels.cpu`, `benchmarks/NOTES.md` 27: XLA:CPU writes that copy at under half the memory
# bandwidth). So the check below also compares two implementations of attention. Is it the same computation as the
# contiguous cache? On the real model:

# %%
engine.run()
prompts = [chat(t) for t in ("What is the capital of France?", "Write a haiku about the sea.", "Why do rivers bend?")]
with CompileCounter() as cc:
    paged_out = engine.generate(prompts, max_new_tokens=12, ignore_eos=True)
contiguous = Generator(m.params, tok).generate(prompts, max_new_tokens=12, ignore_eos=True)
same = all(p.generated_ids == q.generated_ids for p, q in zip(paged_out, contiguous))
_ = check("paged engine gives the contiguous cache's greedy tokens", same, "3 prompts, 12 tokens each")
_ = check("no compilation after warm-up", cc.count == 0)

# %% [markdown]
# **One step of the engine.** Between two decode steps the scheduler admits waiting requests into free slots,
# plans one decode token for every running sequence, and fills the rest of the step's token budget with prompt
# chunks; the engine then runs one compiled decode program for all slots and one prefill program per chunk:

# %% tags=["nbval-ignore-output"]
_ = show_source(Scheduler.schedule)
_ = show_source(Engine.step, skip_docstring=True)

# %% [markdown]
# (`tests/engine/test_paged.py` also checks the logits: within 1e-5 of the contiguous cache in float32,
# int8 pages too.)
#
# ## 3 · Batch invariance
#
# **Predict first:** if the same request runs alone, and then in a crowd where others arrive, leave, and are even
# *preempted* because the pool is too small, are its tokens the same?
#
# They should be, by construction: every row computes only from its own tokens and pages; its random key
# comes from its own seed and position; prompt chunks start at multiples of `chunk` whatever else runs; and a
# preempted request is recomputed the way it was computed the first time (prompt chunks, then its generated
# tokens fed again one decode step each). Here with greedy requests (the tests mix in sampled ones, each
# drawing with its own seed):

# %%
rng = np.random.default_rng(0)
crowd = []
for i in range(4):
    text = ["Tell me about the moon.", "List three fruits.", "Why is the sky blue?"][i % 3]
    sp = SamplingParams()  # greedy here; tests/engine/test_continuous.py mixes in sampled requests
    crowd.append((int(rng.integers(0, 3)), chat(text), int(rng.integers(4, 9)), sp, i))

# 4 slots but 5 pages of 16 positions: four requests of ~40 positions do not fit, so some are preempted.
# watermark=None: admit whenever a slot is free, whatever the memory (section 6 admits by memory)
small = Engine(m.params, tok, slots=4, page_size=16, chunk=64, context=256, num_pages=1 + 5, watermark=None)
small.warmup()
streams, by_slots = batching.run_arrivals(small, crowd)  # -> streams by seed, the engine's state at each step
alone = []
for _, ids, n, sp, i in crowd:
    one = small.add_request(ids, sp, max_new_tokens=n, seed=i, ignore_eos=True)
    small.run()
    alone.append(one.token_ids == streams[i].token_ids)
_ = check("every request's tokens in the crowd equal its tokens alone", all(alone), f"{len(alone)} requests")
_ = check("the crowd preempted at least one request", small.scheduler.preemptions > 0)

# %% [markdown]
# (`tests/engine/test_continuous.py` runs this as a property test over random arrival orders, lengths and
# preemptions.)
#
# ## 4 · The claim, measured: a trace of arriving requests
#
# > Continuous batching "gives several times the throughput of static batching" (the usual claim for vLLM
# > and its descendants).
#
# A reduced trace (the full one, 64 requests, is `jaxlab bench --trace`): requests arrive at random
# (Poisson), prompts and outputs long-tailed, EOS ignored so both systems do the same work, arrivals
# scaled so the offered load is four times what static batching sustained on a warm-up slice (a system cannot
# serve more than it is offered). Static = today's `Generator` taking up to 4 waiting requests whenever it is
# idle; continuous = the engine with the same KV memory, admitting up to 8 requests while their pages fit
# (section 6) and decoding them 4 rows at a time. **Predict first:** which wins on time to first token, and by
# how much on throughput?
#
# The claim is judged in two settings: this reduced trace, measured here, and the full trace's recorded run
# (64 requests, outputs of 8 to 256 tokens, static batches of 8; `benchmarks/results-trace-cpu.json`).

# %% tags=["nbval-ignore-output"]
from jaxlab.bench.trace import make_trace

trace = make_trace(seed=1, n=6, prompt=(8, 30), output=(4, 20))
served = batching.serve_both(m.params, tok, trace, max_batch=4, max_running=8)
table(
    [
        {
            "policy": name,
            "tokens/s": served[name]["throughput"],
            "TTFT p50 (s)": served[name]["ttft_s"]["p50"],
            "TTFT p99 (s)": served[name]["ttft_s"]["p99"],
            "TPOT p50 (s)": served[name]["tpot_s"]["p50"],
        }
        for name in ("static", "continuous")
    ],
    title=f"{served['requests']} requests at {served['offered_tokens_per_s']:.1f} tok/s offered",
)
fig = batching.plot_serving(served)
plt.show()

# %% tags=["nbval-ignore-output"]
full = batching.STORED_TRACE
here, stored = "6 requests, outputs 4-20 tokens (here)", "64 requests, outputs 8-256 tokens (stored run)"
_ = verdict(
    "continuous_batching_throughput",
    {here: served["throughput_ratio"], stored: full["throughput_ratio"]},
    because="static batching wastes a slot for as long as its batch's longest row runs; a short trace with "
    "short outputs leaves little of that to win back",
    source=f"measured now and {full['label']}",
)
p99 = {here: served["static"]["ttft_s"]["p99"] / served["continuous"]["ttft_s"]["p99"]}
p99[stored] = full["ttft_p99_s"]["static"] / full["ttft_p99_s"]["continuous"]
_ = verdict(
    "continuous_batching_ttft_p99",
    p99,
    because="a request that arrives during a static batch waits for the whole batch; a continuous one waits for "
    "one slot",
    source=f"measured now and {full['label']}",
)

# %% [markdown]
# Throughput is output tokens divided by the wall time from the first arrival to the last token. How large
# the gain is depends on the trace: the more the output lengths vary, the more static batching waits for its
# longest row. Time per output token is usually *higher* for continuous batching: its steps also carry other
# requests' prompt chunks (the per-step token budget bounds that).
#
# ## 5 · Prefix reuse
#
# Many requests start with the same system prompt. A full page of prompt tokens is registered under a hash
# of its tokens *and every token before it*, so equal hashes mean equal prefixes. A new request reads the
# pages of its longest registered prefix instead of computing them; pages are reference-counted, and a page
# no one holds keeps its content until it is handed out again.
#
# > "prefix caching is almost a free lunch and won't change model outputs" (vLLM's design notes, "Automatic
# > Prefix Caching")
#
# **Predict first:** with 8 requests sharing a system prompt of about 150 tokens and 4 slots, how much sooner does
# the median request get its first token?

# %% tags=["nbval-ignore-output"]
import time

sys_prompt = "You are a careful assistant. Answer briefly and precisely, in plain words. " * 9
asks = [chat(f"Question {i}: name a colour.", sys_prompt) for i in range(8)]
ttft, outs, shared = {}, {}, None
for reuse in (False, True):
    eng = Engine(m.params, tok, slots=4, context=256, prefix_reuse=reuse)
    eng.programs = shared = shared or eng.programs  # both engines run the same shapes: compile them once
    eng.warmup()
    t0 = time.perf_counter()
    ss = [eng.add_request(p, max_new_tokens=4, ignore_eos=True) for p in asks]
    eng.run()
    ttft[reuse] = [s.first_token_at - t0 for s in ss]
    outs[reuse] = [s.token_ids for s in ss]
fig = batching.plot_prefix_reuse(ttft)
plt.show()
gain = np.median(ttft[False]) / np.median(ttft[True])
print(f"p50 TTFT: {np.median(ttft[False]):.2f} s without reuse, {np.median(ttft[True]):.2f} s with it ({gain:.1f}x)")
pre = full["prefix"]
_ = verdict(
    "prefix_reuse_ttft",
    {
        "8 requests, ~150-token prompt, 4 slots (here)": gain,
        f"{pre['requests']} requests, {pre['system_tokens']}-token prompt, KV for {pre['slots']} (stored run)": pre[
            "ttft_ratio"
        ],
    },
    because="reuse removes the shared prompt's prefill, not the decode steps a request waits for a free slot",
    source=f"measured now and {full['label']}",
)

# %%
_ = check("prefix reuse gives the same tokens", outs[True] == outs[False], "8 requests")

# %% [markdown]
# ## 6 · Sizing the engine by memory and load
#
# So far an engine ran at most `slots` requests, and a pool too small for them preempted (section 3). A server
# does better by looking at its memory: `jaxlab serve` **admits by memory**: the request at the head of the queue
# starts only if the free pages, less what the running requests still need for their prompts, hold its prompt
# and leave a *watermark* free for growth (1 % of the pool, vLLM's default), up to `--max-running` requests
# (default 64) in `--kv-tokens` positions of KV memory (or `--kv-memory`, a fraction of the free memory). Nothing
# overtakes the head of the queue, so no request starves; preemption stays, for growth the watermark did not
# cover.
#
# And it decodes in **row buckets**: a step runs the running requests in the smallest compiled row count that
# holds them (1, 2, 4, 8, ... up to `slots`), so one client does not pay for 32 rows. On XLA:CPU a row's last
# bits depend on how many rows its float matmul has (1, 2-5, 8-32 and 64 rows compute differently here), and a
# small array's rows are summed in another order than a large one's (the model computes its norms and softmaxes
# as a large array's: `kernels.common.rows_alike`; int8 matmuls are exact), which would make a request's tokens
# depend on its neighbours (`benchmarks/NOTES.md` 11 and 14); so warm-up probes each bucket with one row and keeps
# only those whose row equals the full step's bit for bit.
#
# **Predict first:** the crowd of section 3 again, in the same 5 pages, admitted by memory: more preemptions or
# fewer? More steps or fewer?

# %% tags=["nbval-ignore-output"]
by_memory = Engine(m.params, tok, slots=4, page_size=16, chunk=64, context=256, num_pages=1 + 5, decode_buckets=True)
by_memory.programs = small.programs  # the same shapes: only the smaller buckets' programs are new
by_memory.warmup()
kept = by_memory.runner.row_buckets
how = "verdicts kept from an earlier run of these programs" if by_memory.runner.probe_stored else "probed now"
print(f"row buckets {sorted(by_memory.runner.bucket_probe)} ({how}), kept {list(kept)}")
streams_mem, by_mem = batching.run_arrivals(by_memory, crowd)
fig = batching.plot_engine_state({"by slots": by_slots, "by memory": by_mem}, pool_pages=small.pool.capacity)
plt.show()
_ = table(
    [
        {"admission": "slots only", "steps": len(by_slots), "preemptions": by_slots[-1]["preemptions"]},
        {"admission": "by memory", "steps": len(by_mem), "preemptions": by_mem[-1]["preemptions"]},
    ],
    title="the same 4 requests in 5 pages",
)

# %%
same = all(streams_mem[i].token_ids == streams[i].token_ids for *_, i in crowd)
_ = check("admitted by memory, in row buckets: every request's tokens as before", same, f"{len(crowd)} requests")
_ = check(
    "admission by memory preempted no more than admission by slots",
    by_mem[-1]["preemptions"] <= by_slots[-1]["preemptions"],
)
_ = check("the full-size bucket is kept (it is the reference)", by_memory.slots in kept)


# %% [markdown]
# Read the table with the figure: admitted whenever a slot is free, the four requests start together, outgrow
# the 5 pages and are preempted and recomputed again and again; admitted by memory, they run about one at a
# time and nothing is computed twice. Here that costs steps (a pool this small holds one request); with memory
# for several, as in `jaxlab bench --trace` (8,192 positions), admission by memory ran up to 36 requests at once
# with no preemption (the stored run, `benchmarks/results-trace-cpu.json`). The right panel is the decode bucket in use: with fewer requests running, the step runs
# fewer rows (when the probe kept that bucket). `/metrics` of `jaxlab serve` shows the same four numbers live
# (`jaxlab_running_requests`, `jaxlab_queue_length`, `jaxlab_kv_pages_held` of `jaxlab_kv_pages_total`,
# `jaxlab_decode_bucket_rows`), and `jaxlab bench --trace` measures admission by memory on the 64-request trace
# (KV use, the share of the memory holding tokens while requests wait).
#
# One more thing the engine does in every run above: a step's host work (reading the tokens, detokenizing, stop
# strings, a server's streaming) would leave the device idle between steps, since the next step needs this one's
# tokens. In steady decoding the engine **launches the next decode call before it reads this one's tokens**, feeding
# them to it on the device (`Engine(overlap=True)`, the default; `jaxlab serve --no-overlap` turns it off); a row
# that finished meanwhile is dropped from that call, and the tokens are the same bits either way (a test compares
# them with and without). Measured on a 2-core Intel Xeon (`benchmarks/NOTES.md` 16, 2026-12-06): a lone request's
# int8 step 23.3-23.6 ms without it, 20.1-20.8 ms with it; `/metrics` counts the calls taken and dropped
# (`jaxlab_lookahead_calls_total`).

# %% [markdown]
# ## Summary
#
# - A **paged** cache gives every sequence its own positions and memory that grows with its own length; the
#   attention reads through the page table and computes what the contiguous cache computes.
# - **Continuous batching** refills the batch between steps: finished requests leave at once, new ones join,
#   long prompts are prefilled in chunks between decode steps. Compiled shapes stay fixed (slots x page-table
#   width x chunk), so nothing compiles after warm-up.
# - A request's tokens do not depend on its neighbours (batch invariance), even across preemption.
# - **Prefix reuse** computes a shared system prompt once.
# - An engine **sized by memory** admits a request when its pages fit (with a watermark for growth) instead of
#   when a slot is free, and decodes in the smallest batch-invariant **row bucket** that holds the running rows,
#   launching the next decode call before it reads this one's tokens, so the host's work overlaps the device's.
# - Measured, not assumed: the throughput gain over static batching grows with the trace (short here, about 2.7x
#   on the recorded 64-request trace), the p99 time to first token falls, and prefix reuse gives the same tokens
#   sooner: it shortens the prefill part of the wait, not the wait for a free slot.
#
# The engine behind all this is `jaxlab.engine.continuous.Engine`; `jaxlab generate` and `jaxlab chat` run on
# it, and the server of the next notebooks will too.
#
# **Quiz**
#
# 1. Why does static batching's time to first token grow with the *longest* output in the batch ahead?
#    <details><summary>Answer</summary>A request that arrives during a batch waits until every row of it has
#    finished, and the batch lasts as long as its longest row.</details>
# 2. A sequence of 100 tokens with pages of 16 positions holds how many pages, and how many slots go unused?
#    <details><summary>Answer</summary>7 pages (112 slots); 12 unused, all in the last page.</details>
# 3. Why must the page holding the prompt's *last* token be computed even when it is in the prefix table?
#    <details><summary>Answer</summary>The first new token is sampled from the logits at that position, and
#    the cache holds keys and values, not logits.</details>
#
# ## Exercises
#
# Solutions are in `notebooks/solutions/11_continuous_batching.py`.
#
# **1. Read the table.** `my_locate(positions, page_table_row, page_size)`: for each position, return its
# physical page and its offset in that page (two arrays).

# %%
def my_locate(positions, page_table_row, page_size):
    raise NotImplementedError


from jaxlab.lab.exercises import nb11

passed = nb11.check_locate(my_locate)


# %% [markdown]
# **2. Reusable pages.** `my_reusable_pages(cached, prompt, page_size)`: how many leading *full* pages of
# `prompt` equal the same pages of `cached`, never counting the page that holds the prompt's last token.

# %%
def my_reusable_pages(cached, prompt, page_size):
    raise NotImplementedError


passed = nb11.check_reusable_pages(my_reusable_pages)


# %% [markdown]
# **3. The token budget.** `my_chunks(budget, n_decode, chunk, prompt_left)`: how many prompt chunks one step
# can prefill when each of `n_decode` sequences also decodes one token, and `prompt_left` prompt tokens remain.

# %%
def my_chunks(budget, n_decode, chunk, prompt_left):
    raise NotImplementedError


passed = nb11.check_chunks(my_chunks)


# %% [markdown]
# **4. Page allocation.** `my_allocate(free_pages, tokens, page_size)`: the pages a request of `tokens` positions
# takes, one per `page_size` positions, from the front of the list `free_pages` (the pool hands out the least
# recently freed first); `None` when too few are free. Leave `free_pages` as it is: the caller removes the pages.

# %%
def my_allocate(free_pages, tokens, page_size):
    raise NotImplementedError


passed = nb11.check_allocate(my_allocate)


# %% [markdown]
# **5. One scheduler step.** `my_admit(waiting, free_slots, free_pages, page_size, budget, n_decode)`: `waiting`
# lists the waiting requests as `(prompt_len, max_new_tokens)`, first come first; `n_decode` running requests each
# decode one token this step. Admit requests from the front while a slot is free (take `free_slots` in order), the
# request's whole prompt fits in what the `budget` leaves (after the decode tokens and the prompts admitted before
# it), and `my_allocate` finds pages for its prompt and all its new tokens (from what the earlier admissions left);
# stop at the first request that does not fit: no overtaking. Return `[(slot, pages), ...]`, one pair per admitted
# request, in order. (The engine above takes pages as positions are written and preempts when they run out; yours
# reserves them at admission, so nothing is ever preempted, at the price of admitting fewer at once.)

# %%
def my_admit(waiting, free_slots, free_pages, page_size, budget, n_decode):
    raise NotImplementedError


passed = nb11.check_admit(my_admit)

# %% [markdown]
# **The build-the-engine track.** Six of your functions make a whole engine: `my_pad_to_bucket` and
# `my_decode_step` (notebook 04), `my_cache_update` (05), `my_sample` (06), `my_allocate` and `my_admit` (here).
# With the four notebooks solved and saved, run in a terminal
#
# ```
# jaxlab check track
# ```
#
# It takes your functions from your saved notebooks, checks each one, and builds a generation loop from them
# (`generate` in `jaxlab/lab/exercises/track.py`): your scheduler admits requests for three golden prompts into two
# slots with your allocator's pages, your bucketing pads each prompt, the model writes its cache with your cache
# write, your sampler picks each first token, and your decode step makes every later one, all slots in one call. A
# request starts the moment another one frees its slot. It passes when every request's tokens are the golden ones
# (Hugging Face transformers' greedy continuation, the reference of notebooks 00 and 03); a piece that fails is
# named with its notebook.
#
# **An experiment of your own.** Rerun section 4 with `make_trace(..., output=(32, 48))`: outputs of nearly
# equal length. What happens to the throughput ratio, and why?
