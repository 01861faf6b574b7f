# %% [markdown]
# # 05 · The KV cache
#
# *About 40 minutes (35 on the 3-hour workshop path, which skips the sections marked so).* To generate token *n + 1*, attention needs the keys and values of all *n* tokens before it. They do
# not change once computed (a token only attends backwards), so a model can keep them: the **KV cache**.
# Without it, every new token recomputes the whole prefix. In this notebook the cache is explicit state,
# a pytree passed into the jitted step and returned from it, and we measure what it costs and what it buys.
#
# **Learning goals**
#
# - Read the cache as a pytree: per-layer K and V arrays, the `pos` array (with −1 for padding) and the
#   write `index`.
# - Tell prefill (the whole prompt in one call) from decode (one token per call), and check that cached
#   decoding gives the same logits as the full forward pass.
# - Use buffer donation so a step updates the cache in place instead of copying it, and see the cost.
# - Predict the cache's memory from the config (and how grouped-query attention shrinks it), and check
#   the prediction against the arrays actually allocated.
# - Measure per-token latency against context length with and without the cache, and judge the claim.
# - Know how left padding and rollback work with positions.
#
# Links: [pytrees](https://docs.jax.dev/en/latest/pytrees.html) ·
# [buffer donation](https://docs.jax.dev/en/latest/faq.html#buffer-donation) ·
# [`jax.lax.dynamic_update_slice`](https://docs.jax.dev/en/latest/_autosummary/jax.lax.dynamic_update_slice.html) ·
# [Efficiently Scaling Transformer Inference (Pope et al., 2022)](https://arxiv.org/abs/2211.05102) ·
# [multi-query attention (Shazeer, 2019)](https://arxiv.org/abs/1911.02150) ·
# [GQA (Ainslie et al., 2023)](https://arxiv.org/abs/2305.13245) ·
# [PagedAttention (Kwon et al., 2023)](https://arxiv.org/abs/2309.06180)

# %%
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

import jaxlab
from jaxlab.lab.notebook import setup, show_source, table, verdict, check
from jaxlab.engine.kvcache import cache_bytes, init_cache, left_pad, rollback, write_slots
from jaxlab.engine.model import Attention
from jaxlab.engine.steps import next_logits
from jaxlab.tools.reference import agreement_rtol, load_golden, compare_logits
from jaxlab.lab import anatomy
from jaxlab.lab.anatomy import cache_structure, prefill, decode_step, greedy_with_cache, uncached_logits, max_logit_error, time_prefill_decode, one_token_kv, write_token, time_cache_write, cache_memory_rows, live_growth, latency_vs_context, cached_growth, plot_latency, plot_speedup, plot_cache_fill

_ = setup()

# %% [markdown]
# ## 1 · The cache is a pytree
#
# `init_cache(cfg, batch, slots, dtype)` allocates, for each of the 30 layers, one K and one V array with room
# for `slots` tokens per row, plus `pos` (the position of the token in each slot, −1 while empty) and
# `index` (the next slot to write). The layout printed below is chosen for speed, not for reading:
# batch and KV heads share the first axis, and the slot axis sits where each attention matmul wants it,
# so XLA reads and updates the cache where it lies instead of moving a copy of it every step (the
# `jaxlab.engine.kvcache` docstring tells how that was measured). This is key layout `"sd"`, the default and the
# Pallas kernel's. On a CPU, `jaxlab.Generator` makes its float32 cache with `key_layout="ds"` instead (K
# `[B·KVH, 64, S]`, V `[B·KVH, S, 64]`): XLA:CPU's batched float32 matmul runs 2–3× faster with the contraction on
# the big operand's major axis, and the tokens are the same (`benchmarks/NOTES.md` 17–18).

# %%
m = jaxlab.load()
cfg, params = m.config, m.params
SLOTS = 576  # room for a 512-token context plus a few new tokens; one size for the whole notebook
cache = init_cache(cfg, batch=1, length=SLOTS, dtype=params.policy.jnp_dtype)  # the weights' dtype
_ = cache_structure(cache, cfg)

# %% [markdown]
# Where does the model read and write it? In every layer's attention: the new tokens' K and V go into the slots
# `index .. index + T − 1` with one `dynamic_update_slice` each, and the queries then attend to *all* slots,
# the mask (from `pos`) hiding the empty ones and the padding. Here is attention's whole call: the cache is one
# line, `cache.write(k, v, positions)`, then `layer.attend(q, ...)`. Each kind of cache (contiguous float,
# contiguous int8, paged) is a small layer object with those two methods; the contiguous cache's is `KVLayer`,
# whose `write` follows:

# %% tags=["nbval-ignore-output"]
from jaxlab.engine.kvcache import KVLayer

_ = show_source(Attention.__call__)
_ = show_source(KVLayer.write)

# %% [markdown]
# Because `KVCache` is registered as a pytree, every JAX transformation sees through it: `jax.jit`
# takes it as an argument and returns a new one, `jax.tree.map` walks its 62 leaves. A seed text of
# this lab says:
#
# > "JAX programs are functional: state such as model weights and the KV cache is passed in and out
# > explicitly so jax.jit can trace a step into a graph."
#
# ## 2 · Prefill, then decode
#
# **Prefill** runs the whole prompt through the model in one call and writes all its keys and values
# into the cache. **Decode** then feeds one token at a time: its query attends to everything in the
# cache, and its own K and V go into the next slot. Both are one function, the engine's model step
# (`jaxlab.engine.steps.next_logits`: `jaxlab.forward` with a cache, returning the logits of the last
# position), jitted with the cache *donated* (section 4); prefill gives it the prompt, decode one token.
# `anatomy.model_step` wraps it with a counter of how often its Python body runs, which happens only while
# `jax.jit` traces it:

# %% tags=["nbval-ignore-output"]
_ = show_source(anatomy.model_step)
_ = show_source(next_logits)

# %% [markdown]
# **Predict first:** over the next two code cells we prefill twice (same prompt) and decode 8 tokens, each call
# handing the cache it got back to the next call. How many times will the Python body of the step run?

# %%
traces_before = anatomy.TRACES["model_step"]
golden = load_golden()
row = golden["prompts"][2]
prompt = row["prompt_ids"]
tokens = jnp.asarray([prompt])  # [1, T]
positions = jnp.arange(len(prompt))[None]  # [1, T]
logits, cache = prefill(params, tokens, positions, cache)
print(f"prompt: {row['prompt']!r} ({len(prompt)} tokens)")
print("prefill logits", logits.shape, "| cache.index", int(cache.index), "| slots filled:", int((cache.pos >= 0).sum()))
prefill_traces = anatomy.TRACES["model_step"] - traces_before
first = int(jnp.argmax(logits[0]))  # logits of the prompt's last position: [1, V]
step_logits, cache = decode_step(params, jnp.asarray([[first]]), jnp.asarray([[len(prompt)]]), cache)
print("decode logits", step_logits.shape, "| cache.index", int(cache.index), "| slots filled:", int((cache.pos >= 0).sum()))

# %% [markdown]
# The same two functions make a greedy generation: `greedy_with_cache` prefills and then loops over
# decode steps on the host, taking the most likely token each time:

# %% tags=["nbval-ignore-output"]
_ = show_source(greedy_with_cache, skip_docstring=True)

# %% [markdown]
# Its tokens must be the golden ones of the PyTorch reference. We keep `pos` after every step, to see the cache
# fill, and count the traces once more:

# %%
filled = []
new_tokens, step_logits, cache = greedy_with_cache(
    params, prompt, n=8, slots=SLOTS, on_step=lambda c: filled.append(np.asarray(c.pos[0])))
check("8 greedy tokens with the cache == transformers' greedy tokens", new_tokens == row["greedy_ids"][:8])
print(repr(m.tokenizer.decode(new_tokens)), "| cache.index", int(cache.index))
decode_traces = anatomy.TRACES["model_step"] - traces_before - prefill_traces
print(f"Python traces of the step: {prefill_traces} for 2 prefills of one shape, {decode_traces} for 8 decode steps")

# %%
_ = verdict("state_passed_explicitly",
            {"prefill: 2 calls, one prompt shape": prefill_traces, "decode: 8 calls, 8 caches": decode_traces},
            because="each call takes the cache the previous one returned; new cache contents are new input data "
            "for the one traced graph")

# %% [markdown]
# What the cache holds after each step: the prompt's 41 slots after the prefill, then one more slot per decode
# step (left), and, for one layer, the keys themselves (right): the filled slots carry vectors, the rest are
# still the zeros `init_cache` wrote. The empty slots cost memory and, since attention reads every slot, some time.

# %%
labels = ["after prefill"] + [f"after decode {i}" for i in range(1, len(filled))]
fig = plot_cache_fill(list(zip(labels, filled)), cache.k[0], cfg, show=56)
plt.show()

# %% [markdown]
# How different are the two phases? **Predict first:** a prefill of 41 tokens against one decode step: which
# costs more in total, and which per token? A prefill processes many tokens per weight it reads (matrix ×
# matrix: compute-bound), a decode step reads all 538 MB of float32 weights to produce one token
# (matrix × vector: memory-bound). So prefill costs far less *per token*:

# %% tags=["nbval-ignore-output"]
_ = table(time_prefill_decode(params, prompt, SLOTS), title="Measured here (best of 3)")

# %% [markdown]
# ## 3 · Cached == uncached
#
# The cache is an optimization, so it must not change the result. We feed the prompt plus the
# generated tokens through the model *without* a cache (one forward pass over everything) and compare
# its logits, position by position, with the logits each decode step produced.

# %%
seq = prompt + new_tokens[:-1]  # the tokens whose logits the cached run produced
full = uncached_logits(params, jnp.asarray([seq]), jnp.arange(len(seq))[None])  # [1, T, V]
err, rtol = max_logit_error(step_logits, full[0, len(prompt) - 1:]), agreement_rtol(params)
_ = check(f"logits of prefill + {len(new_tokens) - 1} decode steps == one uncached forward pass", err < rtol,
          f"every logit within {rtol:g} of the largest, the {params.policy.dtype} tolerance")

# %% [markdown]
# They agree to rounding, not bit for bit: the uncached pass multiplies matrices of a different shape, and XLA
# may sum in a different order. How close is close enough depends on the dtype the model computes in
# (`jaxlab.tools.reference.AGREEMENT_RTOL`): 1e-4 of the largest logit in float32, 3 % in bfloat16, where every
# matmul's inputs keep 8 significant bits (on a TPU, or here under the accelerator proxy, cached and uncached
# logits differed by up to 1.3 %).
#
# ## 4 · Donation: update in place instead of copying
#
# JAX arrays are immutable: a jitted function returns *new* arrays. A decode step that takes the cache
# and returns an updated cache would therefore copy the whole cache every token, even though only one
# slot changed. `jax.jit(..., donate_argnums=...)` tells XLA that the caller gives up the input buffer,
# so the output can reuse it and the write happens in place. The article this lab tests puts the general
# point this way:
#
# > "Memory fragmentation, particularly on GPUs with limited VRAM, requires careful management of array
# > lifetimes."
#
# Donation is exactly that: the old cache's lifetime ends at the call. `write_token` writes one token's
# K and V into every layer, the cache traffic of a decode step without the model around it, with the same
# write the attention layer does (`KVLayer.write` calls it for the keys, the values and the positions):

# %% tags=["nbval-ignore-output"]
_ = show_source(write_slots)

# %%
big = init_cache(cfg, batch=1, length=4096)
k1, v1 = one_token_kv(cfg, batch=1)
kept = write_token(big, k1, v1, 0, cfg, donate=False)
print("without donation: input deleted?", big.k[0].is_deleted())
donated = write_token(big, k1, v1, 0, cfg, donate=True)
print("with donation:    input deleted?", big.k[0].is_deleted(), "| the new cache's index:", int(donated.index))

# %% [markdown]
# A donated array is gone; using it again is an error (this cell is expected to fail):

# %% tags=["raises-exception", "nbval-ignore-output"]
big.k[0] + 1

# %% [markdown]
# **Predict first:** the copying write moves the whole 189 MB cache, the donated one 46 KB. How much faster will
# the donated write be: 2×, 10×, 1000×?

# %% tags=["nbval-ignore-output"]
del kept, donated
copy_s = time_cache_write(cfg, batch=1, slots=4096, donate=False)
inplace_s = time_cache_write(cfg, batch=1, slots=4096, donate=True)
_ = table([{"write one token into a 4096-slot cache": "copy (no donation)", "ms (best of 5)": 1e3 * min(copy_s)},
           {"write one token into a 4096-slot cache": "in place (donated)", "ms (best of 5)": 1e3 * min(inplace_s)}],
          title="Measured here")
_ = verdict("donation_writes_in_place", min(copy_s) / min(inplace_s),
            because=f"without donation XLA must return a new {cache_bytes(cfg, 1, 4096) / 1e6:.0f} MB cache every call")

# %% [markdown]
# Donation is a promise to XLA, not a guarantee that nothing is copied: if the compiled program needs
# the data in another layout, it may still move the cache around inside the step (jaxlab measured
# exactly that with an earlier cache layout). What we can check cheaply is that the real decode step
# hands back the very buffers it was given. We feed the 8th generated token:

# %%
before = [a.unsafe_buffer_pointer() for a in (*cache.k, *cache.v)]
_, cache = decode_step(params, jnp.asarray([[new_tokens[-1]]]), jnp.asarray([[int(cache.index)]]), cache)
after = [a.unsafe_buffer_pointer() for a in (*cache.k, *cache.v)]
_ = check(f"decode_step updated all {len(before)} K/V arrays in place (same buffers before and after)", before == after)

# %% [markdown]
# Without donation a step also holds *two* caches at its peak, the old and the new. Every function in
# this notebook that returns a cache (`prefill`, `decode_step`, `write_token(donate=True)`) donates it,
# and so does `jaxlab.Generator`. The price: you must always continue with the cache a step returns.
# Donation works on CPU, GPU and TPU; on a GPU the copy is cheaper in time (HBM bandwidth is far higher)
# but the doubled peak memory hurts more, since device memory is the scarce resource.
#
# ## 5 · Memory: formula against measurement
#
# Each layer stores K and V for every row, slot, **KV head** and head dimension:
#
# `bytes = 2 × layers × batch × slots × kv_heads × head_dim × bytes per number`
#
# For SmolLM2 that is 2 × 30 × 3 × 64 × 4 = 46 080 bytes per token in float32. The table compares the
# formula with `KVCache.nbytes()` of caches that are only *shaped* (`jax.eval_shape`, nothing
# allocated, so we can ask about 8 × 8192 slots for free), and shows what the cache would take
# without grouped-query attention: one KV head per query head, 9 instead of 3. **Predict first:** at 8 rows
# of 8192 tokens, is the float32 cache smaller or larger than the 538 MB of weights?

# %%
rows = cache_memory_rows(cfg, [(1, SLOTS), (1, 8192), (8, 8192)])
table(rows, title="KV cache size (MB = 10^6 bytes)")
check("formula == KVCache.nbytes() for every shape", all(r["same"] for r in rows))
weights_mb = sum(a.nbytes for a in jax.tree.leaves(params)) / 1e6
print(f"GQA: {cfg.n_heads} query heads share {cfg.n_kv_heads} KV heads -> the cache is {cfg.n_heads // cfg.n_kv_heads}x smaller")
print(f"for scale, the {params.policy.dtype} weights: {weights_mb:.0f} MB")

# %% [markdown]
# At 8 rows of 8192 tokens the float32 cache (3 GB) is more than five times the weights: at long
# contexts and large batches the cache, not the model, decides what fits in memory, and a decode step
# reads it all. That is why GQA exists, and why caches are often stored in bfloat16 or 8 bits.
#
# Is the formula what really gets allocated? We measure the bytes of all live device arrays
# (`jaxlab.tools.profile.memory_stats`) before and after creating a cache. The extra 4 bytes per slot are
# `pos` (int32), and 4 more are `index`:

# %%
c, grew = live_growth(lambda: init_cache(cfg, batch=2, length=SLOTS))
expected = cache_bytes(cfg, 2, SLOTS) + 2 * SLOTS * 4 + 4
check("live device arrays grew by formula + pos + index", grew == expected, f"{grew:,} bytes")
del c

# %% [markdown]
# ## 6 · Per-token latency against context length
#
# The seed texts mention KV caches only in passing ("KV-cache optimization" as something emerging,
# "KV-cache management" as less mature in JAX) and never say what a cache buys. The usual promise is:
# **with a cache the cost of the next token stays roughly flat as the context grows; without one it
# grows with the context, because the whole prefix is recomputed.** We measure one new token at
# contexts of 8 to 512 tokens:
#
# - *without cache*: one forward pass over `context + 1` tokens (logits of the last one only);
# - *with cache*: one decode step against a cache that holds `context` tokens.
#
# **Predict first:** at 8 tokens of context, is the cached step 10× cheaper, 2× cheaper, or about the same?
# And at 512?

# %% tags=["nbval-ignore-output"]
lat = latency_vs_context(params, [8, 128, 512], slots=SLOTS, repeats=2)
table(lat, title="Measured here: ms for the next token (best of 2)")
print(f"the cached step grew {cached_growth(lat):.1f}x from the shortest to the longest context")
fig = plot_latency(lat)
plt.show()

# %% tags=["nbval-ignore-output"]
fig = plot_speedup(lat)
plt.show()
_ = verdict("kv_cache_cheaper_next_token", {f"{r['context']} tokens of context": r["speed-up"] for r in lat},
            because="recomputing costs a forward pass over the whole prefix; the cached step reads the weights "
            "and the cache once, whatever the context")

# %% [markdown]
# Why it looks like this on a CPU:
#
# - **Without cache** the cost grows roughly in proportion to the context: a forward pass over *n*
#   tokens does about 135 M × *n* multiply-adds (2 × 135 M × *n* FLOPs) (attention's *n²* part is still small at 512).
#   Generating *N* tokens this way costs *O(N²)*.
# - **With cache** a decode step reads the weights once (538 MB) plus the cache. Our cache has a fixed
#   576 slots, and attention reads all of them (empty ones are masked), so the step does the same work
#   at every context: flat, and any wiggle in the table is noise. What grows with a real context is
#   the cache the step must read: 46 KB per token, small next to the weights until thousands of tokens.
# - **On a GPU or TPU** we expect a different picture (we have not measured it here): a few hundred
#   tokens cost little more than one, because the chip has compute to spare and both cases are
#   dominated by reading the weights. The uncached curve should start flat, and the cache pay off only
#   at longer contexts, where the verdict above may well read differently. Run the notebook there and see.
#
# ## 7 · Left padding and positions −1 *(3-hour path: skip)*
#
# A batch needs one array, but prompts have different lengths. jaxlab pads on the **left** and gives
# padding tokens position **−1**. Attention lets a query at position *p* see keys whose position lies in
# `[0, p]`, so padding is invisible; the cache stores these positions in `pos`, so padded slots stay
# invisible in every later decode step too. And because every row's last token sits in the same column,
# the next token of every row goes into the same cache slot: one write for the whole batch.
#
# Notebook 03 checked a padded batch of all six golden prompts against the reference. Here we pad one
# short prompt on the left to the length of section 3's sequence (so the compiled program is reused):
# its logits must still be those of the prompt alone.

# %%
short = golden["prompts"][0]
tok1, pos1 = left_pad([short["prompt_ids"], seq], cfg.pad_id)  # pad to the longer one, then keep row 0
print(f"{len(short['prompt_ids'])} prompt tokens padded to {tok1.shape[1]}; positions start with",
      pos1[0, :14].tolist())
last = uncached_logits(params, jnp.asarray(tok1[:1]), jnp.asarray(pos1[:1]))[0, -1]
print(short["prompt"], "|", compare_logits(np.asarray(last), short["last_logits"], rtol=agreement_rtol(params))[1])

# %% [markdown]
# ## 8 · Rollback *(3-hour path: skip)*
#
# Speculative decoding guesses several tokens, checks them, and must *forget* the rejected ones.
# `rollback(cache, index)` does that without touching K or V: it moves `index` back and marks the later
# slots empty (position −1); they are overwritten by the next writes. Our cache now holds the prompt and
# all 8 generated tokens. We keep the prompt and the first 3, forget the rest, and decode again from
# the 4th: we must get the same tokens. This is all of `rollback`:

# %% tags=["nbval-ignore-output"]
_ = show_source(rollback)

# %%
keep = len(prompt) + 3  # the prompt and the first 3 new tokens
cache = rollback(cache, keep)
print("after rollback: index", int(cache.index), "| slots filled:", int((cache.pos >= 0).sum()))
# feed the 4th new token again (into slot 44): the model must predict the 5th to 8th again
again, _, cache = greedy_with_cache(params, [new_tokens[3]], n=4, slots=SLOTS, cache=cache)
_ = check("tokens decoded again after a rollback == the first time", again == new_tokens[4:8])

# %% [markdown]
# ## Summary
#
# - The KV cache is a pytree (62 leaves: K and V per layer, `pos`, `index`) that the jitted step takes and
#   returns; the step traced once per shape, for 2 prefills and 8 decode steps each with a new cache.
# - Prefill writes the whole prompt in one call and costs far less per token than a decode step, which reads all
#   the weights for one token. Cached decoding gave the uncached logits (to float32 rounding) and the reference's
#   greedy tokens.
# - Donation let XLA write one token in place instead of copying the whole cache: many times faster on a 189 MB
#   cache, and the real decode step kept its buffers.
# - Memory: 46,080 bytes per token in float32 (`2 × layers × kv_heads × head_dim × 4`), confirmed by the
#   allocation; GQA makes it 3× smaller; at long contexts and large batches the cache outgrows the weights.
# - Per-token latency: flat with the cache, growing with the context without it; the speed-up grew with the
#   context (figures), and "much cheaper" held only once the context was long.
# - Left padding and rollback are both just positions: −1 hides a slot from every query.
#
# **Quiz**
#
# 1. Why does the cache store K and V but not Q?
#    <details><summary>Answer</summary>A token's query is used only for that token's own output; later tokens
#    need the earlier tokens' keys (to score them) and values (to mix them), never their queries.</details>
# 2. Our cached step took the same time at 8 and at 512 tokens of context. Why, and when would it grow?
#    <details><summary>Answer</summary>The cache has a fixed 576 slots and attention reads all of them, so the work
#    does not depend on how many are filled; and at these sizes reading the 538 MB of weights dominates anyway.
#    It grows when the cache itself becomes a large share of the bytes read: thousands of tokens, or large
#    batches (and with caches sized to the context instead of fixed).</details>
# 3. After `rollback(cache, 44)`, the K and V of slots 44 onwards still hold the forgotten tokens. Why is that
#    safe?
#    <details><summary>Answer</summary>Their positions are set to −1, so the mask hides them from every query,
#    and the next writes (starting at index 44) overwrite them before they could be made visible again.</details>
# 4. What goes wrong if you keep using the cache you passed into a donating step?
#    <details><summary>Answer</summary>Its buffers were given to XLA and are deleted (or now hold the new
#    contents); JAX raises an error when a deleted array is used, as the cell in section 4 showed.</details>
#
# ## Exercises
#
# Solutions: `notebooks/solutions/05_kv_cache.py`.
#
# **Exercise 1: the cache write.** `cache` is one layer's K (or V) array, `new` holds `T` new tokens'
# values (the same shape, with `T` on the slot axis), `axis` is the slot axis. Return `cache` with
# `new` written at slots `index .. index + T − 1`. Hint: `jax.lax.dynamic_update_slice(operand,
# update, start_indices)` takes one start index per axis. This is a piece of the build-the-engine track (notebook
# 11): there the model writes every key, value and position of its cache with your function.

# %%
import jaxlab.lab.exercises.nb05 as ex


def my_cache_update(cache, new, index, axis):
    raise NotImplementedError  # your code here


_ = ex.check_cache_update(my_cache_update)


# %% [markdown]
# **Exercise 2: the memory formula.** Return the bytes of K and V of a cache for `batch` rows and
# `slots` tokens, with numbers of `itemsize` bytes, reading what you need from `cfg` (a `LlamaConfig`).

# %%
def my_kv_cache_bytes(cfg, batch, slots, itemsize):
    raise NotImplementedError  # your code here


_ = ex.check_kv_cache_bytes(my_kv_cache_bytes)

# %% [markdown]
# **Exercise 3 (think).** SmolLM2's context is 8192 tokens. At what batch size does a float32 cache of
# full contexts take more memory than the float32 weights? And in bfloat16? How many full-context rows fit on a
# 16 GB accelerator in bfloat16, next to the bfloat16 weights?
# <details><summary>Answer</summary>One row of 8192 tokens takes 46,080 × 8192 = 377,487,360 bytes (377 MB) in
# float32; the weights take 134,515,008 × 4 = 538 MB. One row is less, two rows (755 MB) are more: batch 2. In
# bfloat16 both halve (189 MB per row, 269 MB of weights), so the answer is again batch 2; with float32 weights
# and a bfloat16 cache it would be batch 3. On 16 GB: (16 × 10^9 − 269 × 10^6) / 188.7 × 10^6 = 83 rows, before
# activations and the runtime's own memory, which is why servers page the cache and cap the batch.</details>
#
# **An experiment of your own.** Make the cache's slot count follow the context (for example, slots = context +
# 8, one compiled program per size) in `latency_vs_context`, or time the cached step at a batch of 8 with 4096
# filled slots. From what context on does reading the cache, not the weights, decide the cost of a decode step
# on this machine? Compare with the formula: the weights are 538 MB, the cache 46 KB per token per row.
#
# **Next:** notebook 06 batches several prompts together and samples instead of taking the argmax.
