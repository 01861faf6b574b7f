# %% [markdown]
# # 04 · jit and generation: from the naive loop to the whole loop on device
#
# *About 45 minutes (35 on the 3-hour workshop path, which skips the sections marked so).* Generating text is a loop: run the model, pick the next token, append it, repeat. How you write
# that loop decides how often XLA compiles, how much work each token repeats, and how often Python
# has to step in. This notebook builds the loop four times on the real SmolLM2-135M model, from
# the obvious version to the fast one. Every version must give **the same greedy tokens**: the ones
# the PyTorch reference produced. We measure each one on your machine.
#
# **Learning goals**
#
# - See why a new input shape means a new compilation, and count compilations with `CompileCounter`.
# - Use fixed shapes, length *buckets* and padding (position −1) so that one compiled program serves
#   many lengths.
# - Write a jitted one-token decode step with a KV cache, then move the whole loop onto the device
#   with `lax.fori_loop`.
# - Measure compile time apart from steady-state time, and warm up a generator so that it never
#   compiles while someone is chatting.
# - Test three claims about `jit` and compilation against measurements.
#
# Links: [`jax.jit` and its cache](https://docs.jax.dev/en/latest/jit-compilation.html) ·
# [ahead-of-time lowering and compilation](https://docs.jax.dev/en/latest/aot.html) ·
# [`jax.lax.fori_loop`](https://docs.jax.dev/en/latest/_autosummary/jax.lax.fori_loop.html) ·
# [buffer donation](https://docs.jax.dev/en/latest/faq.html#buffer-donation) ·
# [Efficiently Scaling Transformer Inference (Pope et al., 2022)](https://arxiv.org/abs/2211.05102) ·
# [Attention Is All You Need (Vaswani et al., 2017)](https://arxiv.org/abs/1706.03762)
#
# **The claims.** The seed article of this lab says:
#
# > "A JIT-compiled inference pipeline can often achieve 2-3x speed improvements over eager execution"
#
# > "the first call will be slower (due to compilation overhead), but every subsequent call will be
# > dramatically faster"
#
# and a glossary entry on JAX says:
#
# > "the first call may take several seconds to compile, but subsequent calls run fast [...] but the
# > compilation overhead makes it impractical for interactive chat."

# %% tags=["nbval-ignore-output"]
import jax
import jax.numpy as jnp
import numpy as np

import jaxlab
from jaxlab.lab import stages
from jaxlab.engine.plan import bucket
from jaxlab.tools.profile import CompileCounter
from jaxlab.tools.reference import compare_greedy, load_golden
import matplotlib.pyplot as plt

from jaxlab.engine import generate as engine_generate, steps
from jaxlab.lab import essentials
from jaxlab.lab.notebook import check, setup, show_source, table, verdict

setup()
m = jaxlab.load()

# %% [markdown]
# We use one prompt from the lab's golden file: the token ids of a chat prompt and the 32 tokens
# that Hugging Face `transformers` generated greedily from it (computed once, in float32, from the
# same model file). Our chat template must give the same prompt ids.

# %%
golden = load_golden()["prompts"][1]
prompt_ids, golden_ids = golden["prompt_ids"], golden["greedy_ids"]
ids = m.tokenizer.apply_chat_template([{"role": "user", "content": golden["prompt"]}], tokenize=True)
check("our chat template gives the golden prompt ids", ids == prompt_ids, f"{len(ids)} tokens")
print(repr(golden["prompt"]), "->", repr(golden["greedy_text"]))

# %% [markdown]
# ## 1 · The naive loop: recompute everything, compile every token
#
# The obvious loop runs the whole sequence through `jax.jit(forward)`, takes the most likely token
# at the last position and appends it. It works, but `jit` compiles one program *per input shape
# and dtype*. The sequence is one token longer every time, so every token is a new shape: JAX
# traces the Python code again, and XLA compiles a new program, before it can compute anything.
#
# `stages.naive_generate` is that loop. It compiles ahead of time (`jit(f).lower(...).compile()`),
# so compiling and running are timed separately, and counts the compilations with
# `jaxlab.tools.profile.CompileCounter`. (It counts a program loaded from the persistent compilation cache
# on disk, which `setup()` turned on, as a compilation too: the trace and the lowering still happen.)
#
# Each stage's tokens are compared with the golden ones by `jaxlab.tools.reference.compare_greedy`: exactly
# on a CPU, where the model runs in float32; on TPU and recent GPUs, in bfloat16, where a near-tie can
# flip a token, the first 16 must be identical, and the check prints how many leading tokens agree.
# The loop itself (`Meter` is bookkeeping: it compiles ahead of time, counts and times):

# %% tags=["nbval-ignore-output"]
_ = show_source(stages.naive_generate, skip_docstring=True)
_ = show_source(stages.next_from_full, skip_docstring=True)

# %% [markdown]
# **Predict first:** the prompt has 40 tokens. How many compilations will 4 generated tokens cost?

# %%
N_NAIVE = 4
naive = stages.naive_generate(m.params, prompt_ids, N_NAIVE)
check("naive greedy tokens == golden", *compare_greedy(naive.tokens, golden_ids, detail=f"{N_NAIVE} tokens"))
print(f"{N_NAIVE} tokens, sequence lengths {len(prompt_ids)}..{len(prompt_ids) + N_NAIVE - 1}: "
      f"{naive.compiles} compilations")

# %% tags=["nbval-ignore-output"]
print(f"per token: {naive.compile_s / N_NAIVE:.2f} s tracing + compiling, {naive.run_s / N_NAIVE:.3f} s computing"
      f" ({naive.from_disk} of {naive.compiles} programs came from the disk cache)")

# %% [markdown]
# Most of the time goes into compiling, and even more on a first run, when nothing is in the disk
# cache yet. A chat reply of a few hundred tokens would compile a few hundred programs.
#
# ## 2 · Fixed shapes: pad to a bucket
#
# The fix is to stop changing the shape. Give the sequence a fixed-size buffer, put the tokens at the
# start and mark the unused slots as padding. In jaxlab a token at position −1 is padding: attention
# never looks at it. The buffer length is a **bucket**: the smallest of a few fixed sizes that holds
# the prompt plus the new tokens. A few buckets serve every length with a handful of programs,
# and padding wastes at most half the buffer. `jaxlab.engine.generate.bucket` picks one (past the largest,
# the next multiple of it):

# %%
print({n: bucket(n, stages.SEQ_BUCKETS) for n in (40, 46, 64, 65, 300, 513)})
tokens, positions = stages.pad_to_bucket([101, 102, 103], buckets=(4, 8), pad_id=2)
print("tokens   ", tokens)
print("positions", positions)

# %% [markdown]
# (`pad_to_bucket` pads on the *left*, as a prompt is padded for prefill: the last real token sits in
# the last column. The padded loop below fills its buffer from the left instead, so it can append.)
#
# `stages.padded_generate` still recomputes the whole buffer for every token, but the shape never
# changes: one compilation, and a second prompt of a different length that fits the same bucket
# compiles nothing.

# %% tags=["nbval-ignore-output"]
_ = show_source(stages.padded_generate, skip_docstring=True)

# %%
padded = stages.padded_generate(m.params, prompt_ids, 6)
check("padded greedy tokens == golden", *compare_greedy(padded.tokens, golden_ids, detail="6 tokens"))
print(f"{padded.name}: {len(padded.tokens)} tokens, {padded.compiles} compilation")

other = load_golden()["prompts"][3]
again = stages.padded_generate(m.params, other["prompt_ids"], 4)
check("its greedy tokens == golden", *compare_greedy(again.tokens, other["greedy_ids"], detail="4 tokens"))
print(f"another prompt ({len(other['prompt_ids'])} tokens, same bucket): {again.compiles} new compilations")

# %% [markdown]
# ## 3 · A jitted decode step with the KV cache
#
# The padded loop recomputes the keys and values of every earlier token at every step, and that work
# grows with the length (notebook 05 measures it). With a **KV cache** the prompt is run once
# (*prefill*, left-padded to a prefill bucket), and then each step feeds only the newest token: its
# query attends to the keys and values already in the cache, and its own go into the next slot.
#
# The decode step is a pure function, `(params, token [B], pos [B], cache) -> (next token [B], cache)`:
# it calls `jaxlab.forward` on `token[:, None]` at `pos[:, None]` with the cache and takes the argmax
# of the logits. This stage runs the engine's own step (`jaxlab.engine.steps.decode_step`, greedy),
# the one `jaxlab.Generator` runs. Its shapes never change, so it compiles once. The cache is *donated* to the jitted
# step, so XLA updates it in place instead of copying 30 layers of keys and values each token. The
# loop stays in Python and reads every token back to the host: a real chat needs that, to stream text
# and to stop at the end-of-turn token. The step (the engine's; `next_logits` is the model's forward pass
# on one token per row, with the cache, keeping the last position's logits) and the loop that drives it:

# %% tags=["nbval-ignore-output"]
_ = show_source(steps.greedy_step)
_ = show_source(stages.cached_generate, skip_docstring=True)

# %%
N = 32
cached = stages.cached_generate(m.params, prompt_ids, N)
check("cached greedy tokens == golden", *compare_greedy(cached.tokens, golden_ids, detail=f"{N} tokens"))
print(f"{cached.name}: {N} tokens, {cached.compiles} compilations (prefill + decode step)")

# %% [markdown]
# To measure what `jit` itself buys, run the very same step **eagerly**: no `jit`, every one of its
# operations dispatched from Python one at a time. (Eager JAX compiles too: each operation gets a
# small program of its own the first time it meets a shape; `CompileCounter` counts those, and the
# table below shows how many.)

# %%
eager = stages.cached_generate(m.params, prompt_ids, 5, jit=False)
check("eager greedy tokens == golden", *compare_greedy(eager.tokens, golden_ids, detail="5 tokens"))
_ = check("its first step compiled dozens of small programs (one per operation and shape)", eager.compiles > 20)

# %% [markdown]
# ## 4 · The whole loop on device *(3-hour path: skip)*
#
# The host loop still pays for one dispatch from Python and one device-to-host copy per token. If we
# do not need to see each token as it is made (a benchmark, a batch job, a fixed-length answer),
# the whole loop can be one program: `jaxlab.engine.generate.decode_on_device` runs the decode step inside a
# `lax.fori_loop`. It is compiled once for a given number of steps; the prefill program is reused
# from stage 3 (same shapes), so only the loop is new. The loop, and the stage that calls it:

# %% tags=["nbval-ignore-output"]
_ = show_source(engine_generate.decode_on_device, skip_docstring=True)
_ = show_source(stages.on_device_generate, skip_docstring=True)

# %%
on_device = stages.on_device_generate(m.params, prompt_ids, N)
check("on-device greedy tokens == golden", *compare_greedy(on_device.tokens, golden_ids, detail=f"{N} tokens"))
print(f"{on_device.name}: {N} tokens, {on_device.compiles} new compilation")

# %% [markdown]
# ## 5 · Every stage, the same tokens *(3-hour path: skip)*
#
# Each stage is an optimization of the one before, so none may change the answer (on TPU and GPU, in
# bfloat16, each program may round differently: there the first 16 tokens must agree, as above):

# %%
runs = [naive, padded, eager, cached, on_device]
for r in runs:
    check(f"{r.name:40s} == golden greedy ids", *compare_greedy(r.tokens, golden_ids, detail=f"{len(r.tokens)} tokens"))
print(repr(m.tokenizer.decode(on_device.tokens)))

# %% [markdown]
# ### Measured here
#
# *Compile s* is tracing + lowering + compiling (or loading from the disk cache); *tokens/s* counts
# execution only, prefill included; *tokens/s incl. compile* is what the very first request would
# see. **Predict first:** rank the five runs by tokens/s, with and without compilation counted.

# %% tags=["nbval-ignore-output"]
_ = table([r.row() for r in runs], title=f"Measured here ({jax.default_backend()}, batch 1)")
fig = stages.plot_stage_speed(runs)
plt.show()

# %% [markdown]
# Where each stage's time went: compiling (red) or running (green), with the number of programs it
# compiled:

# %% tags=["nbval-ignore-output"]
fig = stages.plot_compile_vs_run(runs)
plt.show()

# %% [markdown]
# How to read it:
#
# - **naive**: nearly all of its time is compilation, once per token. Even its execution-only speed
#   is low: each token recomputes the whole prompt.
# - **padded**: one compilation, but each step still recomputes the whole buffer (64 positions).
# - **cached**: each step computes one position and reads the weights once. At batch 1 that read is
#   the cost: every step moves all the float32 weights through memory to produce one token
#   (decode is *memory-bound*; notebook 06 shows how batching changes that).
# - **on device**: the same step without the per-token trip through Python and back. On a CPU the
#   step itself takes tens of milliseconds, so the trip is a modest share (the table says how much
#   here); on a GPU or TPU, where a step of this small model takes a millisecond or less, the launch
#   and copy overhead per token is a much larger share, and keeping the loop on device matters more.
#
# ## 6 · Claims: the first call is slow, later calls fast; jit is 2-3× faster than eager
#
# Compare the decode step's compilation with one run of it, and the same step jitted and eager, in
# steady state (compilation excluded; the best step of each, the one least disturbed by other work
# on the machine). Notebook 01 judged the same two claims on a model block and on one large matmul; here
# the settings are the decode step and one matmul of the model's own size: the output head of a
# 64-token prefill, `[64, 576] @ [576, 49152]` with the real embedding matrix.
# **Predict first:** jit's speed-up on the decode step, and on that one matmul?

# %% tags=["nbval-ignore-output"]
jit_step, eager_step = min(cached.step_s), min(eager.step_s)  # best of each: the least disturbed by other work
speedup = eager_step / jit_step
print(f"decode step (best of {len(eager.step_s)} eager, {len(cached.step_s)} jitted): eager {eager_step * 1e3:.1f} ms, "
      f"jitted {jit_step * 1e3:.1f} ms -> jit is {speedup:.1f}x faster")
print(f"the step's compilation ({cached.compile_s:.1f} s, prefill included) pays for itself after "
      f"{stages.break_even_tokens(cached.compile_s, jit_step, eager_step):.0f} tokens")
x64 = jax.random.normal(jax.random.key(0), (64, m.config.dim), jnp.float32)
head = essentials.eager_vs_jit(lambda x, e: jnp.einsum("td,vd->tv", x, e), x64, m.params.flat()["embed"], repeats=5)
print(f"one matmul [64, 576] @ [576, 49152]: eager {head.eager_s * 1e3:.1f} ms, jitted {head.jit_s * 1e3:.1f} ms "
      f"-> {head.speedup:.2f}x; first jitted call {head.first_call_x:.1f}x a later one")

# %% tags=["nbval-ignore-output"]
STEP, MATMUL = "decode step (30 layers, 1 token)", "one matmul of the model's size"
_ = verdict("first_call_slower", {STEP: (cached.compile_s + jit_step) / jit_step, MATMUL: head.first_call_x},
            "the decode step's first call compiles (or loads) the prefill and decode programs, seconds for 30 "
            "layers; the matmul compiles in milliseconds and runs for tens of them")
_ = verdict("jit_speedup_2_3x", {STEP: speedup, MATMUL: head.speedup},
            "the decode step is hundreds of small operations, each dispatched from Python when eager; the matmul "
            "is one operation, the same kernel either way")

# %% [markdown]
# The verdicts are the same as notebook 01's, for the same reason. On a CPU the decode step's speed-up
# is usually *larger* than the claim's 2-3×: eager mode dispatches each of the step's hundreds of
# operations from Python, and `jit` replaces them with one fused program; one big matmul gains nothing.
# On a GPU or TPU the gap grows further, because the math gets much faster while the per-operation
# dispatch cost stays about the same. But the claim hides the price: the first call compiles, and
# compiling the 30-layer model takes seconds.
#
# ## 7 · Claim: compilation makes JAX impractical for interactive chat
#
# Compilation is real: the *compile s* column above shows what each stage's programs cost to
# compile (or to load from the disk cache, if this machine ran the notebook before), and the naive
# loop pays it for every token. But a server does not have to pay it while someone waits. Two things make
# the steady state compile-free:
#
# 1. **Fixed shapes.** `jaxlab.Generator` pads prompts to prefill buckets (by default 32, 64, 128, 256
#    and 512 tokens; here just 64 and 512, to keep the notebook quick) and the cache to cache buckets,
#    so the set of programs is small and known in advance.
# 2. **Warm-up.** `Generator.warmup` compiles those programs before the first user arrives (and the
#    persistent compilation cache that `setup()` enabled makes the next start load them from disk).
#
# First, what a user would meet without warm-up: the first request to a fresh generator. Then the
# warm-up, and prompts of many different lengths. **Predict first:** how many programs does the first
# request compile, and how many do the eight requests after warm-up compile?

# %% tags=["nbval-ignore-output"]
gen = jaxlab.Generator(m.params, m.tokenizer, prefill_buckets=(64, 512))
with CompileCounter() as cold_cc:
    cold_reply = gen.generate([prompt_ids], 3)[0]
print(f"first request, no warm-up: {cold_cc.count} programs compiled or loaded, "
      f"{cold_reply.compile_seconds:.1f} s of it while the user waited")
warm_s = gen.warmup(prompt_lens=(64,), max_new_tokens=8)
print(f"warm-up (prompt bucket 64) afterwards: {warm_s:.1f} s (the first request compiled its programs already)")

# %% [markdown]
# Warm-up is that first request, made by the server itself before it opens: here the first request had
# already compiled the bucket-64 programs, so `warmup` found nothing left to compile. Now eight requests:

# %%
prompts = [row["prompt_ids"] for row in load_golden()["prompts"]]
prompts += [m.tokenizer.encode("Hi"), prompt_ids[:20]]
per_request, replies = [], []
for p in prompts:
    with CompileCounter() as cc:
        replies.append(gen.generate([p], 3)[0])
    per_request.append(cc.count)
print("prompt lengths:", sorted({len(p) for p in prompts}))
print("compilations per request after warm-up:", per_request)
_ = check("no compilation after warm-up", sum(per_request) == 0)

# %% tags=["nbval-ignore-output"]
first_label = (f"first request, no warm-up ({cold_cc.cache_hits} of {cold_cc.count} programs "
               "from the disk cache)")
_ = verdict("compile_impractical_for_chat",
            {first_label: cold_reply.compile_seconds,
             "each request after warm-up (most)": max(r.compile_seconds for r in replies)},
            f"compilation happens once per shape; after a warm-up, {len(prompts)} requests of "
            f"{len({len(p) for p in prompts})} different lengths compiled nothing (notebook 07 times a fresh "
            "process with an empty and a filled cache)")

# %% tags=["nbval-ignore-output"]
print(f"first-request cost (a server pays it at warm-up): {cold_reply.compile_seconds:.1f} s; per request afterwards: "
      f"prefill {np.median([r.prefill_seconds for r in replies]) * 1e3:.0f} ms, "
      f"{np.median([r.tokens_per_second for r in replies]):.1f} tokens/s while decoding")


# %% [markdown]
# Whatever the first request waited here (the verdict above gives it, with how many programs came
# from the disk cache), it is a start-up cost: paid once per shape, and a server pays it before it
# opens, at warm-up, so no user waits for it. (What
# *does* hurt is a program that quietly recompiles: a Python value baked into the trace, or a shape
# that changes every call, as in the naive loop. That is why the lab counts compilations in its
# tests.)
#
# **On GPU and TPU** the picture shifts but the conclusions stand: compile times are similar
# (seconds for this model), steps are much faster, so jit's advantage over eager mode and the gain
# from keeping the loop on device are both larger, and compilation is an even bigger share of a cold
# first request.
#
# ## Summary
#
# - Four loops gave the same greedy tokens as the reference: naive (a new shape, hence a compilation,
#   per token), padded to a bucket (one compilation, but the whole buffer recomputed), cached with a
#   jitted decode step (one position per token), and the whole loop in one `lax.fori_loop`.
# - jit's speed-up over eager is large on the decode step (many small operations) and nothing on one
#   big matmul: "2-3x" holds only for the first kind, as in notebook 01.
# - The first call is slow because it compiles; afterwards a step costs milliseconds.
# - Compilation is a per-shape start-up cost: a first request without warm-up compiled its programs,
#   and after a warm-up requests of seven different lengths compiled nothing.
#
# **Quiz**
#
# 1. Why does the naive loop compile once per generated token?
#    <details><summary>Answer</summary>Its input is one token longer every step: a new shape, and jit
#    compiles one program per input shape and dtype.</details>
# 2. What does position −1 mean in the padded buffer, and why is it safe?
#    <details><summary>Answer</summary>It marks a padding slot; the attention mask never lets a query see
#    a key at position −1, so the padding cannot change the result.</details>
# 3. Why donate the KV cache to the jitted decode step?
#    <details><summary>Answer</summary>So XLA may write the new keys and values into the old buffers
#    instead of copying the whole cache (30 layers of keys and values) every token.</details>
# 4. When is the `fori_loop` version the wrong choice for a chat server?
#    <details><summary>Answer</summary>When text must stream or stop at the end-of-turn token: the loop
#    runs a fixed number of steps on the device and the host sees no token until it ends.</details>
#
# ## Exercises
#
# Solutions are in `notebooks/solutions/04_jit_and_generation.py`. Both functions are pieces of the build-the-engine
# track (notebook 11, `jaxlab check track`): there your bucketing pads every prompt and your decode step makes every
# token after the first, in a generation loop built from your own functions.
#
# **1. Pad a prompt to its bucket.** Write `my_pad_to_bucket(ids, buckets, pad_id)` returning
# `(tokens, positions)`, two int32 arrays of the bucket's length: the prompt left-padded with
# `pad_id`, and positions `0..n-1` under the prompt and `-1` under the padding. The length is the
# smallest bucket `>= len(ids)`; past the largest bucket, the next multiple of the largest.

# %%
def my_pad_to_bucket(ids, buckets, pad_id):
    raise NotImplementedError


from jaxlab.lab.exercises import nb04

passed = nb04.check_pad_to_bucket(my_pad_to_bucket)


# %% [markdown]
# **2. One greedy decode step.** Write `my_decode_step(params, token, pos, cache)`: `token` and `pos`
# are int arrays of shape `[B]` (one new token per row and its position); return the greedy next
# token `[B]` (int32) and the updated cache. Use `jaxlab.forward(params, tokens, positions, cache)`,
# which wants `[B, T]` inputs. The checker rolls your step forward 4 times on a tiny random model
# (under `jax.jit`) and compares the tokens and the cache with the lab's step: a step that forgets to
# return the new cache is caught.

# %%
def my_decode_step(params, token, pos, cache):
    raise NotImplementedError


passed = nb04.check_decode_step(my_decode_step)

# %% [markdown]
# **An experiment of your own.** Give `jaxlab.Generator` the default prefill buckets (32 to 512) and send
# prompts of 10, 50, 100 and 300 tokens without warm-up: count the compilations of each request and time
# the first token. Which bucket set would you choose for a server whose prompts are mostly short, and
# how much does padding a 33-token prompt to 64 cost in prefill time?
