# %% [markdown]
# # 06 · Batching and sampling
#
# *About 40 minutes (30 on the 3-hour workshop path, which skips the sections marked so).* A decode step at batch 1 reads every weight of the model to produce a single token. Serving many
# requests at once is how an inference server gets more out of each read: it is the biggest
# throughput lever there is. This notebook batches the real SmolLM2-135M model two ways (with `vmap`
# and natively), handles prompts of different lengths, measures throughput against batch size, and
# then turns to *which* token to pick: greedy, temperature, top-k, top-p and min-p sampling with
# explicit random keys.
#
# **Learning goals**
#
# - Batch a single-sequence decode step with `jax.vmap` and check it equals the natively batched model.
# - Batch prompts of different lengths with left padding and position −1, and check that batching
#   changes no row's result.
# - Measure throughput against batch size and explain it with the roofline: decode is memory-bound
#   at small batches and becomes compute-bound as the batch grows.
# - Sample with temperature, top-k, top-p and min-p using explicit PRNG keys; same key, same tokens.
# - Drive generation from an interactive widget whose callback also runs headless.
#
# **The claims.** The seed article says:
#
# > "vmap automatically vectorizes a function that operates on a single input, transforming it into a
# > function that operates on a batch of inputs."
#
# > "With vmap, the weights are loaded once, and the computation is structured to maximize data reuse.
# > This reduces memory bandwidth pressure and allows the GPU to operate at peak utilization."
#
# and a glossary entry on JAX: "randomness requires explicit PRNG keys".
#
# Links: [`jax.vmap`](https://docs.jax.dev/en/latest/_autosummary/jax.vmap.html) ·
# [automatic vectorization](https://docs.jax.dev/en/latest/automatic-vectorization.html) ·
# [pseudorandom numbers in JAX](https://docs.jax.dev/en/latest/random-numbers.html) ·
# [roofline model (Williams et al., 2009)](https://doi.org/10.1145/1498765.1498785) ·
# [nucleus (top-p) sampling (Holtzman et al., 2019)](https://arxiv.org/abs/1904.09751) ·
# [min-p sampling (Nguyen et al., 2024)](https://arxiv.org/abs/2407.01082)

# %% tags=["nbval-ignore-output"]
import jax
import jax.numpy as jnp
import numpy as np
import matplotlib.pyplot as plt

import jaxlab
from jaxlab.lab import stages
from jaxlab import SamplingParams
from jaxlab.engine.kernels import cpu as cpu_kernels
from jaxlab.engine.kvcache import KVCache, init_cache
from jaxlab.tools.reference import agreement_rtol
from jaxlab.tools.profile import CompileCounter, Roofline
from jaxlab.lab.masks import plot_masks
from jaxlab.lab.vectorize import count_primitives, plot_distributions, plot_throughput
from jaxlab.lab.notebook import setup, show_source, table, verdict, check

setup()
m = jaxlab.load()
print(m, f"| weights: {m.params.nbytes() / 1e6:.0f} MB")

# %% [markdown]
# ## 1 · A batch of prompts of different lengths
#
# Four short prompts, of different lengths. To run them as one batch they must be padded to one
# length. We pad on the **left**, so that every row's last prompt token sits in the last column and
# every row writes its next token into the same cache slot. Padding tokens get position −1, which
# the model's attention mask treats as "never look here":

# %%
texts = ["The capital of France is", "Once upon a time", "def add(a, b):", "Water boils at"]
prompts = [m.tokenizer.encode(t) for t in texts]
tokens, positions = stages.left_pad(prompts, m.config.pad_id)
print("tokens\n", tokens)
print("positions\n", positions)

# %% [markdown]
# What each row's attention may see, from the positions alone (`0 <= key position <= query position`): every row
# is causal over its own tokens, and no query sees a padding column.

# %%
fig = plot_masks(positions, titles=[repr(t) for t in texts])
plt.show()

# %% [markdown]
# ## 2 · `vmap` over one sequence vs the natively batched model
#
# `stages.single_sequence_step` is written for **one** sequence: a token and a position with no batch
# axis, and a batch-1 cache. It is the model step with a batch axis of 1 added and removed:

# %% tags=["nbval-ignore-output"]
_ = show_source(stages.single_sequence_step)

# %% [markdown]
# `jax.vmap` turns it into a batched function: `in_axes` says the parameters are shared (`None`), tokens and
# positions are mapped over axis 0, and so is every cache array except the write index, which all rows share.
# Here it is, applied to a stack of 4 batch-1 caches and traced (not run) for the 4 last prompt tokens;
# `jax.make_jaxpr` shows the program vmap built. **Predict first:** does the vmapped program loop over the 4
# rows, i.e. have 4 times the matrix multiplications of the one-sequence step?

# %%
L = m.config.n_layers
axes = stages.cache_axes(L)  # KVCache(k=(0,) * L, v=(0,) * L, pos=0, index=None)
vmapped_step = jax.vmap(stages.single_sequence_step, in_axes=(None, 0, 0, axes), out_axes=(0, axes))

one = init_cache(m.config, 1, 16, m.params.policy.jnp_dtype)  # a batch-1 cache, as single_sequence_step expects
stack = lambda a: jnp.stack([a] * len(prompts))  # noqa: E731
row_caches = KVCache(tuple(map(stack, one.k)), tuple(map(stack, one.v)), stack(one.pos), one.index)
last_tok, last_pos = jnp.asarray(tokens[:, -1]), jnp.asarray(positions[:, -1])
with cpu_kernels.xla_only():  # XLA's own program: where a CPU has AVX-512, jaxlab's kernels run a step's few rows
    batched_jaxpr = jax.make_jaxpr(vmapped_step)(m.params, last_tok, last_pos, row_caches)
    single_jaxpr = jax.make_jaxpr(stages.single_sequence_step)(m.params, last_tok[0], last_pos[0], one)
ops_v, ops_1 = count_primitives(batched_jaxpr), count_primitives(single_jaxpr)
print("vmapped step: logits", batched_jaxpr.out_avals[0].shape, "|", ops_v["dot_general"], "matmuls,",
      sum(ops_v.values()), "operations")
print("one sequence: logits", single_jaxpr.out_avals[0].shape, "|", ops_1["dot_general"], "matmuls,",
      sum(ops_1.values()), "operations")
_ = check("vmap added a batch axis to the same matmuls: no loop over the rows", ops_v["dot_general"] == ops_1["dot_general"])

# %% [markdown]
# `stages.vmap_step` wraps exactly this (viewing the batched cache as rows and back, a free reshape), and
# `stages.batched_step` is the model used as written, on `[B, 1]` inputs. `stages.step_generate` feeds
# the padded batch through either step one token per call (first the prompt columns, then 8 greedy
# tokens), and keeps each step's compiled program.

# %% tags=["nbval-ignore-output"]
_ = show_source(stages.vmap_step)

# %%
N = 8
batched = stages.step_generate(m.params, prompts, N, step="batched")
vmapped = stages.step_generate(m.params, prompts, N, step="vmap")
check("vmap over one sequence == natively batched model: same tokens", (vmapped.tokens == batched.tokens).all(),
      f"{len(prompts)} rows x {N} tokens")
RTOL = agreement_rtol(m.params)  # 1e-4 of the largest logit in float32, 3e-2 in bfloat16 (notebook 05)
check("... and the same logits", stages.logits_agree(vmapped.last_logits, batched.last_logits, RTOL),
      f"within {RTOL:g} of the largest, the {m.params.policy.dtype} tolerance")
for text, row in zip(texts, batched.tokens):
    print(repr(text + m.tokenizer.decode(row.tolist())))

# %% [markdown]
# Does the `vmap` version read the weights once per step for the whole batch, or once per row?
# XLA's own cost model of the two compiled programs answers it:

# %%
cost_b = stages.step_cost(m.params, len(prompts), "batched")
cost_v = stages.step_cost(m.params, len(prompts), "vmap")
same_flops = check("vmapped and batched steps do the same arithmetic", abs(cost_v["flops"] / cost_b["flops"] - 1) < 0.01,
      "FLOPs within 1%")
weights_once = check("both read the weights once per step, not once per row",
      max(cost_v["bytes accessed"], cost_b["bytes accessed"]) < 2 * m.params.nbytes(),
      "bytes accessed < 2x the weights' size")

# %% tags=["nbval-ignore-output"]
table([{"step": name, "GFLOP": c["flops"] / 1e9, "MB accessed": c["bytes accessed"] / 1e6,
        "best step ms": r.best_step_s * 1e3, "median step ms": r.median_step_s * 1e3}
       for name, c, r in (("batched", cost_b, batched), ("vmap", cost_v, vmapped))],
      title=f"Measured here: one decode step, batch {len(prompts)}");

# %% [markdown]
# `vmap` does not loop over the rows: it pushes the batch axis through every operation, so a matmul
# of one row by a weight matrix becomes a matmul of all rows by the same matrix, read once. The
# vmapped program may move a few more bytes (XLA's cost model shows whether it copies the cache
# rows around), so its step can be a little slower than the native one, but the arithmetic is
# identical.

# %% [markdown]
# ### Batched == each alone
#
# Padding must not leak into the real tokens: every row of the batch must get exactly what the
# prompt would get alone (batch 1, no padding at all).

# %%
alone = [stages.step_generate(m.params, [p], N) for p in prompts]
same_tokens = check("each batched row == the same prompt alone: tokens",
      all((a.tokens[0] == batched.tokens[i]).all() for i, a in enumerate(alone)), f"{len(prompts)} prompts")
same_logits = check("each batched row == the same prompt alone: logits",
      all(stages.logits_agree(batched.last_logits[i], a.last_logits[0], RTOL) for i, a in enumerate(alone)),
      f"within {RTOL:g} of the largest")

# %% [markdown]
# That is also the measurement the vmap claim asks for: `vmap(step)` over the 4 prompts against the model's
# step on each prompt alone (batch 1, which is what `single_sequence_step` computes), on the last logits.

# %% tags=["nbval-ignore-output"]
gap = max(float(np.abs(vmapped.last_logits[i] - a.last_logits[0]).max()) for i, a in enumerate(alone))
scale = float(np.abs(vmapped.last_logits).max())
_ = verdict("vmap_vectorizes", gap / scale / RTOL,
            because="the vmapped one-sequence step gives each prompt's own logits and tokens, from one program "
            "with the single step's matmuls")

# %% [markdown]
# (`jaxlab.Generator` does the same left padding, with the whole prompt in one prefill call instead
# of one token per call; `tests/tools/test_reference.py` checks its batched results against each-alone too.)
#
# ## 3 · Throughput against batch size
#
# At batch 1, each decode step reads all the float32 weights (about 540 MB) to do roughly 2 FLOPs per
# weight: half a FLOP per byte read (2 FLOPs per 4-byte weight). Every processor can compute far
# faster than its memory can feed it at that ratio, so the step waits on memory: it is
# **memory-bound**. A batch of B rows reads the same weights once and does
# B times the arithmetic, so the tokens per second should grow almost in proportion to B, until the
# arithmetic catches up with the memory traffic (the *ridge point* of the roofline) and the step
# becomes **compute-bound**.
#
# We time the jitted batched step at batch 1, 2, 4, 8 and 16 (best of a few steps each, after a
# 32-token context), and measure this machine's two ceilings: memory bandwidth and matmul FLOP/s.
# **Predict first:** batch 16 does 16 times the arithmetic of batch 1. How many times the tokens/s will it give?

# %% tags=["nbval-ignore-output"]
rows = stages.throughput_vs_batch(m.params, (1, 2, 4, 8, 16), steps=5)
roofline = Roofline.measure(nbytes=1 << 29, n=1024, repeats=3, dtype=m.params.policy.jnp_dtype)
stages.add_roofline(rows, m.params, roofline)
print(roofline)
table(rows, title="Measured here: decode throughput against batch size");

# %% tags=["nbval-ignore-output"]
fig = plot_throughput(rows)
plt.show()

# %% [markdown]
# How to read it: the roofline bound (dashed) rises in proportion to the batch while the step is
# memory-bound, and flattens once it is compute-bound; the *bound* column says which applies. The
# measured tokens/s rise with the batch because adding rows costs far less than a whole step: the
# weights are read once anyway. They stay below the bound, and on a CPU they bend earlier than it:
# XLA's matmuls with only a few rows reach a fraction of the matmul peak we measured on large square
# matrices. (On a CPU shared with other work the curve is also noisy; each point is the best of a
# few steps. The ceilings are measurements too: a *% of bound* above 100 means the bandwidth test
# ran slower than the model's own weight reads, not that the model beat physics.)
#
# On a GPU or TPU the ridge sits much further right (hundreds of FLOPs per byte in bfloat16), so
# throughput keeps growing to batches of tens or hundreds, until the KV cache, which grows with the
# batch and the context, becomes the memory traffic that dominates.

# %% [markdown]
# The claim is about memory traffic, so we measure that: the bytes XLA's cost model says one step reads, per
# generated token, for the vmapped step over 4 rows against the one-sequence step alone (the program the
# "each alone" runs above compiled).

# %% tags=["nbval-ignore-output"]
best = max(rows, key=lambda r: r["tokens/s"])
gain = best["tokens/s"] / rows[0]["tokens/s"]
check("the best batch size gives more than twice batch 1's tokens/s", gain > 2 and best["batch"] > 1)
cost_1 = stages.step_cost(m.params, 1, "batched")
per_token = (cost_v["bytes accessed"] / len(prompts)) / cost_1["bytes accessed"]
print(f"bytes per step: {cost_1['bytes accessed'] / 1e6:.0f} MB alone, {cost_v['bytes accessed'] / 1e6:.0f} MB "
      f"vmapped over {len(prompts)} rows")
_ = verdict("vmap_loads_weights_once", per_token,
            because="the vmapped step reads the weights once for all its rows; 'peak utilization' is another "
            "matter: see the % of bound column")

# %% [markdown]
# ## 4 · Sampling: greedy, temperature, top-k, top-p, min-p
#
# The model gives logits; a *sampler* turns them into one token. `jaxlab.engine.sampling.filter_logits`
# applies the filters in the order Hugging Face `transformers` does:
#
# - **temperature** divides the logits: below 1 sharpens the distribution, above 1 flattens it
#   (temperature 0 means *greedy*: always the most likely token);
# - **top-k** keeps the k most likely tokens;
# - **top-p** (nucleus) keeps the smallest set of most likely tokens whose probabilities add up to p;
# - **min-p** keeps the tokens at least min_p times as likely as the most likely one.
#
# Here is what each leaves of a toy distribution over six tokens:

# %%
toy = np.array([2.0, 1.5, 1.0, 0.0, -0.5, -2.0], np.float32)
settings = {
    "greedy": SamplingParams(),
    "temperature 1": SamplingParams(temperature=1.0),
    "temperature 0.5": SamplingParams(temperature=0.5),
    "temperature 2": SamplingParams(temperature=2.0),
    "top-k 2": SamplingParams(temperature=1.0, top_k=2),
    "top-p 0.9": SamplingParams(temperature=1.0, top_p=0.9),
    "min-p 0.3": SamplingParams(temperature=1.0, min_p=0.3),
}
dists = {name: stages.filtered_probabilities(toy, sp) for name, sp in settings.items()}
toy_table = table([[name] + [f"{p:.2f}" for p in d] for name, d in dists.items()],
                  headers=["sampler"] + [f"token {i}" for i in range(len(toy))])

# %%
fig = plot_distributions(dists)
plt.show()

# %% [markdown]
# ### Explicit random keys
#
# JAX has no hidden random state: a draw takes a **key**, and the same key always gives the same draw
# (`jax.random.split` makes new independent keys from one). So sampling is reproducible by
# construction:

# %%
key = jax.random.key(0)
k1, k2 = jax.random.split(key)  # two new, independent keys; `key` itself should not be used again
print("same key twice:", jax.random.uniform(k1, (3,)), jax.random.uniform(k1, (3,)))
print("another key:   ", jax.random.uniform(k2, (3,)))

# %% [markdown]
# Does the sampler draw from the filtered distribution? Take 4000 draws, each with its own key split from one seed:

# %%
freq = stages.sample_frequencies(toy, settings["top-p 0.9"], draws=4000, seed=0)
check("4000 top-p draws follow the filtered distribution", np.abs(freq - dists["top-p 0.9"]).max() < 0.03,
      "every frequency within 0.03 of its probability")
no_leak = check("no draw ever picks a filtered-out token", freq[dists["top-p 0.9"] == 0].sum() == 0)

# %% [markdown]
# Now on the real model, through `jaxlab.Generator` (its sampler runs inside the jitted step). The
# seed becomes the key; the same seed gives the same reply, another seed another reply:
#
# **Predict first:** four replies of 12 tokens with seeds 0, 0, 1, 1. Of the 6 pairs of replies, how many are
# equal?

# %%
gen = jaxlab.Generator(m.params, m.tokenizer)
chat = m.tokenizer.apply_chat_template([{"role": "user", "content": "Write a haiku about the sea."}], tokenize=True)
sp = SamplingParams(temperature=0.8, top_p=0.95)
seeds = (0, 0, 1, 1)
replies = [gen.generate([chat], 12, sp, seed=s)[0].generated_ids for s in seeds]
pairs = [(i, j) for i in range(len(seeds)) for j in range(i + 1, len(seeds))]
consistent = [(replies[i] == replies[j]) == (seeds[i] == seeds[j]) for i, j in pairs]
print(f"{sum(replies[i] == replies[j] for i, j in pairs)} of {len(pairs)} pairs of replies are equal")
check("same seed -> same tokens", replies[0] == replies[1] and replies[2] == replies[3])
check("different seed -> different tokens", replies[0] != replies[2])
_ = verdict("explicit_prng_keys", sum(consistent) / len(pairs),
            because="every draw takes a key made from the seed; nothing else (no global state) decides the tokens")

# %% [markdown]
# ## 5 · An explorer *(3-hour path: skip)*
#
# Type a prompt, set the temperature and top-p, press **Generate**, and watch the reply stream in.
# The sliders' values are passed into the jitted step as arrays, not baked into the program, so
# moving them never recompiles. (Widgets need a live kernel: on GitHub you see nothing below; the
# cell after it runs the same callback with fixed values, so its output is stored.)

# %% tags=["nbval-ignore-output"]
explorer = stages.Explorer(gen, m.tokenizer, prompt="Write a haiku about the sea.", max_new_tokens=40)
explorer.widget()

# %%
with CompileCounter() as cc:
    reply = explorer.generate("Write a haiku about the sea.", temperature=0.7, top_p=0.9, seed=0, max_new_tokens=24)
check("new sampling values (temperature 0.7, top-p 0.9) compiled nothing", cc.count == 0)
print(reply)


# %% [markdown]
# ## Summary
#
# - Left padding with position −1 lets prompts of different lengths share one batch; the mask (figure) hides the
#   padding, and every batched row gave the same tokens and logits as its prompt alone.
# - `jax.vmap` turned a one-sequence step into a batched one: the same matmuls with a batch axis, no loop over
#   rows, the logits of each prompt alone, and the same arithmetic as the natively batched model.
# - A batched step reads the weights once for all rows: XLA's cost model counted far fewer bytes per token at
#   batch 4, and tokens/s grew with the batch, well below the roofline bound on a CPU.
# - Samplers reshape the distribution (temperature, top-k, top-p, min-p); 4000 draws followed it. Every draw
#   takes an explicit key: the same seed gave the same reply, another seed another, and changing the sampling
#   values compiled nothing.
#
# **Quiz**
#
# 1. Why pad on the left rather than on the right for generation?
#    <details><summary>Answer</summary>So every row's last prompt token sits in the last column: the logits that
#    pick each row's next token come from one column, and every row writes its next K and V into the same cache
#    slot, one write for the whole batch.</details>
# 2. Why does `in_axes` give `None` for the parameters, and what would mapping them over axis 0 mean?
#    <details><summary>Answer</summary>`None` means one copy shared by every row: the weights are read once per
#    step. Mapping them would ask for a different set of weights per row (a stacked [B, ...] parameter tree),
#    B times the memory and traffic.</details>
# 3. At batch 1 a decode step does about half a FLOP per byte of weights read. What does that say about how the
#    step's time will change from batch 1 to batch 4?
#    <details><summary>Answer</summary>The step is memory-bound: its time is mostly reading the weights, which
#    batch 4 reads once too. So batch 4 costs far less than 4 times batch 1, and tokens/s rise almost 4x until
#    the arithmetic catches up (the ridge point).</details>
# 4. Top-p 0.9 and top-k 2 on the toy distribution above: which keeps more tokens, and why does it depend on the
#    distribution?
#    <details><summary>Answer</summary>Top-k always keeps k tokens; top-p keeps as many as it takes to reach
#    probability p, so it keeps few tokens when the model is confident and many when it is not. On the toy
#    logits top-p 0.9 kept more than 2.</details>
#
# ## Exercises
#
# Solutions are in `notebooks/solutions/06_batching_and_sampling.py`. Both functions take logits
# `[B, V]` and return logits of the same shape, with the removed tokens set to `-inf` and the kept
# ones unchanged (temperature 1, no other filter). Write them with `jnp` operations, no Python loop
# over the vocabulary.
#
# **1. A top-p filter.** `my_top_p(logits, top_p)`: sort each row's tokens from most to least likely
# and keep a token if the probability of the tokens ranked *above* it is still below `top_p` (so the
# most likely token is always kept).

# %%
def my_top_p(logits, top_p):
    raise NotImplementedError


from jaxlab.lab.exercises import nb06

passed = nb06.check_top_p(my_top_p)


# %% [markdown]
# **2. A min-p filter.** `my_min_p(logits, min_p)`: keep the tokens whose probability is at least
# `min_p` times the probability of the row's most likely token.

# %%
def my_min_p(logits, min_p):
    raise NotImplementedError


passed = nb06.check_min_p(my_min_p)


# %% [markdown]
# **3. A batched sampler.** `my_sample(logits, keys, temperatures)`: `logits` `[B, V]`, one PRNG key per row
# `keys` `[B]`, `temperatures` `[B]`; return one token per row `[B]` (int32): the argmax where the temperature is
# 0, else a draw from `softmax(logits / t)` with the row's own key (`jax.random.categorical(key, logits / t)`;
# `jax.vmap` runs it on every row). The checker compares your tokens with the engine's sampler draw for draw:
# the same key gives the same token, and a row's token never depends on the rows beside it. This is a piece of
# the build-the-engine track (notebook 11): it picks each request's first token.

# %%
def my_sample(logits, keys, temperatures):
    raise NotImplementedError


passed = nb06.check_sample(my_sample)

# %% [markdown]
# **An experiment of your own.** Extend the throughput measurement to batch 32 and 64, or to a 512-token
# context (`stages.throughput_vs_batch(..., context=512, cache_len=576)`): where does the curve stop rising on
# this machine, and does the growing KV cache or the arithmetic stop it? Then sample the same haiku prompt at
# temperatures 0.3, 0.8 and 1.5 with 5 seeds each, and count how many distinct replies each temperature gives.
