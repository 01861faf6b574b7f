# %% [markdown]
# # 10 · Speculative decoding
#
# *About 40 minutes.* Decoding one token at a time leaves most of the machine idle: each step reads every weight of the
# model to produce a single token. *Speculative decoding* guesses several tokens cheaply and lets the
# model check all the guesses in one forward pass, keeping the ones it agrees with. Done right, the
# output is exactly what plain decoding would have produced. This notebook builds it on the real
# SmolLM2-135M, draws what happens round by round, and measures when it pays and when it does not.
#
# Links: [Fast Inference from Transformers via Speculative Decoding (Leviathan et al., 2023)](https://arxiv.org/abs/2211.17192)
# · [Accelerating LLM Decoding with Speculative Sampling (Chen et al., 2023)](https://arxiv.org/abs/2302.01318)
# · [Prompt lookup decoding](https://github.com/apoorvumang/prompt-lookup-decoding)
# · [Pseudorandom numbers in JAX](https://docs.jax.dev/en/latest/random-numbers.html)
# · [`jax.jit` and recompilation](https://docs.jax.dev/en/latest/jit-compilation.html)
#
# **Learning goals**
#
# - Explain the draft → verify → accept → roll back loop, and why checking k+1 tokens can cost about as
#   much as generating one.
# - Check that greedy speculative decoding gives *exactly* plain greedy's tokens, and that changing
#   acceptance never recompiles anything.
# - Measure acceptance and speed-up by task: prompts whose answer copies from the prompt against
#   open-ended writing; n-gram (prompt-lookup) drafts against a draft model made of the first layers.
# - Predict the speed-up from two measured costs, and explain why a bigger batch shrinks the gain.
# - Know the rejection rule that keeps *sampling* exact.

# %% tags=["nbval-ignore-output"]
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

import jaxlab
from jaxlab.engine import kvcache, speculative as spec, steps
from jaxlab.lab import speculation
from jaxlab.tools.profile import CompileCounter
from jaxlab.lab.notebook import check, setup, show_source, stored, table, verdict
from jaxlab.bench.spec_engine import render_engine

setup()
m = jaxlab.load()
print(m)

# %% [markdown]
# ## The claim
#
# The article this lab tests only names the technique, among the tools it expects the JAX ecosystem to grow:
#
# > "The JAX ecosystem is evolving rapidly, with new tools for model quantization, **speculative
# > decoding**, and KV-cache optimization emerging from both Google and the open-source community."
#
# It measures nothing. The claim usually made for it is a **free speed-up**: "2–3× faster generation
# with identical output". We test both halves: *identical* and *faster*, and find out where.
#
# ## 1 · The idea
#
# At batch 1 a decode step is **memory-bound** (notebook 06): it streams all ~540 MB of float32
# weights to do about 2 FLOPs per weight. Feeding it k+1 tokens instead of 1 reads the same weights
# once, so if the step stays memory-bound, checking k guesses costs about one step. Each round:
#
# 1. **Draft** k tokens after the last accepted token x, cheaply. Two drafters:
#    - **n-gram / prompt lookup**: find the last 3 (or else 2) tokens earlier in the context and
#      propose the k tokens that followed them there. Free, and good when the answer copies from the
#      prompt. When nothing recurs, the round is a plain one-token decode step ("no draft" below).
#    - **draft model**: a smaller model. Ours is built from the model itself: its first L layers plus
#      its final norm and output embedding (no training): the model's own forward pass cut early,
#      `jaxlab.forward(..., upto=L)`, on the same weights (nothing copied).
# 2. **Verify**: one forward pass of the model on `[x, d1, ..., dk]` gives its own greedy choice after
#    each prefix. Keep the drafts up to the first disagreement, then the model's own token there (a
#    *correction*, or a *bonus* token when all k were right): 1 to k+1 tokens per call, each one the
#    token plain greedy decoding would have chosen.
# 3. **Roll back** the KV cache: the rejected drafts' keys and values were written during the verify
#    pass; `kvcache.rollback` moves the write index back and marks those slots empty.
#
# The verify call always has shape `[B, k+1]`, so one compiled program serves every round, however many
# drafts get accepted. One round, for one prompt with n-gram drafts, in outline:
#
# ```python
# while len(generated) < max_new_tokens:
#     drafts = ngram_propose(context, k)                      # [] when nothing recurs
#     feed = [x] + drafts if drafts else [x]                 # no draft: a plain decode step
#     tokens, n, cache = verify_step(params, feed, positions, cache, index, ...)
#     generated += tokens[: n + 1]                           # the n kept drafts, then the model's own token
#     x, index = tokens[n], index + n + 1                    # the next round starts after them
# ```
#
# (`SpeculativeDecoder` in `jaxlab/engine/speculative.py` runs this for a batch, with stop strings and the
# draft model.) The verify step, the greedy rule that picks what to keep, and the rollback, as
# `jaxlab.engine` has them:

# %% tags=["nbval-ignore-output"]
_ = show_source(steps.verify_step)
_ = show_source(spec.greedy_accept)
_ = show_source(kvcache.rollback)

# %% [markdown]
# Here is a real run: the model is asked to fix a typo in a few lines of code, so most of the answer is
# a copy of the prompt. Each row is one round with n-gram drafts, k = 4. **Predict first:** of the 24
# tokens, how many verify calls will it take? (Plain decoding takes one call per token.)

# %%
K, N = 4, 24  # draft length, tokens to generate
prompts = {task: speculation.chat_prompt(m.tokenizer, texts[0]) for task, texts in speculation.TASK_PROMPTS.items()}
ngram = spec.SpeculativeDecoder(m.params, m.tokenizer, method="ngram", k=K)
run = ngram.generate([prompts["copy: fix code"]], N)[0]
rounds_table = table(speculation.describe_rounds(run, m.tokenizer, max_rounds=8), title="n-gram speculative decoding, round by round")
print(f"\n{len(run.generated_ids)} tokens in 1 prefill + {run.target_calls} verify calls:")
print(run.text)

# %% tags=["nbval-ignore-output"]
ax = speculation.plot_rounds(run, m.tokenizer, max_rounds=10)
plt.show()

# %% [markdown]
# Read the picture row by row: green drafts were kept, the red one is the first wrong guess (the grey
# ones after it were never used), and the blue cell is the model's own token, which is always kept. A
# round with four greens and a blue produced five tokens for the price of one verify call. Where the
# reply stops copying (the model starts a new sentence), the drafts fail and a round yields one token,
# like plain decoding.
#
# ## 2 · Exact, and measured by task
#
# `speculation.measure` runs each task's prompt with plain greedy decoding (`jaxlab.Generator`, EOS ignored)
# and with speculative decoding, compares the tokens, and times the decode phase of both (every
# program compiled beforehand). Three prompts copy from their input (repeat a paragraph, fix a typo
# in code, extract names) and one is open-ended writing.
#
# **Predict first:** which prompt gets the most tokens per verify call, and what will the open-ended one
# get? Will speculative decoding ever be *slower* than plain decoding?

# %%
gen = jaxlab.Generator(m.params, m.tokenizer)
greedy = {}
rows = speculation.measure(m.params, m.tokenizer, k=K, max_new_tokens=N, methods=("ngram",), generator=gen,
                    outputs=greedy)
identical = check("n-gram speculative decoding == plain greedy, token for token",
                  all(r["identical"] == "yes" for r in rows), f"{len(rows)} prompts x {N} tokens")
acceptance_table = table(
    [{"task": r["task"], "acceptance": round(r["acceptance"], 2), "tokens/call": round(r["tokens/call"], 2)} for r in rows],
    title="Acceptance (fraction of drafts kept) and tokens per verify call")
_ = verdict("speculative_identical_output", sum(r["identical"] != "yes" for r in rows),
            "each prompt's tokens compared with plain greedy decoding's, token for token")

# %% [markdown]
# That is the first half of the usual claim. The second half, "a free speed-up", is a time. We call a gain
# a speed-up when it is at least 1.3x: below that, the noise of a shared machine and the Python work
# around each model call can swing the result either way, and a user would not notice it.

# %% tags=["nbval-ignore-output"]
speed_table = table(rows, title=f"Measured here: decode speed, batch 1, greedy, {N} tokens")
copy_rows = [r for r in rows if r["task"].startswith("copy")]
overall = sum(1 / r["plain tok/s"] for r in copy_rows) / sum(1 / r["spec tok/s"] for r in copy_rows)
print("\ncopy-heavy prompts one by one: " + ", ".join(f"{r['speed-up']:.2f}x" for r in copy_rows))
_ = verdict("speculative_free_speedup", {
    "copy-heavy prompts, together": overall,
    "open-ended writing": next(r["speed-up"] for r in rows if r["task"] == "open-ended"),
}, "n-gram drafts, k = 4; the speed-up follows the tokens per verify call above")

# %% [markdown]
# The acceptance column is deterministic (greedy tokens); the speed column is this machine's, and it
# moves with whatever else the machine is doing. No run changes the shape of anything, so nothing
# recompiles, whether a round keeps 0 drafts or all of them:

# %%
with CompileCounter() as cc:
    again = [ngram.generate([prompts[t]], 16)[0] for t in ("copy: repeat", "open-ended")]
ok = check("acceptance from all to nothing, and no compilation", cc.count == 0 and all(r.compiles == 0 for r in again),
      "tokens per call: " + ", ".join(f"{r.tokens_per_call:.1f}" for r in again))

# %% [markdown]
# ## 3 · A draft model from the model's own first layers
#
# n-gram drafts are free but only know how to copy. A draft *model* can guess new text. The cheapest
# one to build is the model itself, cut after L of its 30 layers ("early exit"). How often would it
# guess right? `speculation.early_exit_agreement` runs the model once over the greedy texts from above and,
# for each L, applies the final norm and output embedding to layer L's output: the fraction of
# positions where that matches the model's greedy token is exactly the chance a draft token is
# accepted once the tokens before it were right. (The full depth must give 1.0: a check of the probe.)
#
# **Predict first:** the model has 30 layers. How many of them must a draft keep before half of its guesses
# are right?

# %%
LAYERS = (2, 8, 16, 20, 24, 28, 29, 30)
ids = [p for task in greedy for p in greedy[task][0]]
outs = [g for task in greedy for g in greedy[task][1]]
agreement = speculation.early_exit_agreement(m.params, ids, outs, layers=LAYERS)
ok = check("the probe at full depth reproduces every greedy token", agreement[30] == 1.0)
exit_table = table([{"layers": L, "per-token acceptance": round(a, 2),
                     "tokens per verify call": round(float(speculation.expected_tokens_per_call(a, K)), 2)}
                    for L, a in agreement.items()], title=f"Early-exit drafts, k = {K} (over {len(outs)} greedy texts)")

# %% [markdown]
# A model cut early guesses badly: the last layers do much of the work of choosing the next token, and
# nothing trained the early layers' output to be read out directly. Up to about two thirds of the
# depth, the cut model almost never guesses right; only the last few layers make it competitive, and by
# then a draft step costs nearly as much as the model. Even a shallow draft is not cheap: every draft
# token pays for the output embedding (49152 × 576 weights, a fifth of the model) plus L layers. A real
# run with L = 8 shows it stays exact, and wastes its drafts:

# %%
draft = spec.SpeculativeDecoder(m.params, m.tokenizer, method="draft", k=K, draft_layers=8)
d_run = draft.generate([prompts["copy: repeat"]], 12)[0]
ok = check("draft-model speculative decoding == plain greedy", d_run.generated_ids == greedy["copy: repeat"][1][0][:12],
      f"{d_run.accepted} of {d_run.proposed} draft tokens kept")

# %% [markdown]
# (Real draft models are separately trained small models of the same family, e.g. a 135M model drafting
# for a 1.7B sibling, and typically get well over half of their tokens accepted on ordinary text. A 135M
# model has no smaller sibling: it is already the draft model of its family.)
#
# ## 4 · Where it pays: two costs decide
#
# A round costs one verify call plus k draft steps. In units of one plain decode step the speed-up is
#
# $$\text{speed-up} = \frac{\text{tokens per verify call}}{\text{cost of a verify call} + k \cdot \text{cost of a draft step}}$$
#
# `speculation.step_costs` times the three steps with the same compiled programs the runs above used.
# **Predict first:** a verify call runs 5 tokens through the model instead of 1. On a CPU, does it cost
# 1, 2 or 5 decode steps?

# %% tags=["nbval-ignore-output"]
costs = speculation.step_costs(m.params, k=K, batch=1, draft_layers=8)
cost_table = table([{"step": "plain decode (1 token)", "ms": costs["decode_s"] * 1e3, "decode steps": 1.0},
       {"step": f"verify ({K + 1} tokens)", "ms": costs["verify_s"] * 1e3, "decode steps": costs["verify_s"] / costs["decode_s"]},
       {"step": f"draft, L = 8 ({K} tokens)", "ms": costs["draft_s"] * 1e3, "decode steps": costs["draft_s"] / costs["decode_s"]}],
      title="Measured here: step costs, batch 1")
ax = speculation.plot_speedup(costs, K, rows)
plt.show()

# %%
ok = check(f"verifying {K + 1} tokens costs less than {K + 1} decode steps", costs["verify_s"] < (K + 1) * costs["decode_s"])

# %% [markdown]
# On a CPU the verify call is *not* free: with 5 tokens the matmuls do 5× the arithmetic, and a CPU
# has little arithmetic to spare over its memory bandwidth, so the verify call costs clearly more than
# one decode step (the table says how much here). That is why a prompt at about one token per call
# gains nothing (each round that drafts pays for a verify call and gets one token), and why the n-gram
# line in the plot sits below the ideal.
# On a GPU or TPU a batch-1 step is much further from the compute limit (hundreds of FLOPs per byte
# before the ridge), so a verify call of 5 or 9 tokens costs close to one decode step, and the same
# acceptance buys more speed-up (the dashed line). We have not measured that here; the lines are the
# model, not a measurement. (The measured points sit above the n-gram line: rounds with no draft cost a
# plain step, not a verify call, and the Python work around each model call, a few milliseconds, is
# paid once per round instead of once per token.)
#
# The draft model has the opposite problem: its verify cost is the same, but its k draft steps add a
# large fixed cost, and its acceptance is too low to pay for them.
#
# ## 5 · Why batch size changes the answer
#
# The KV cache has one write index for the whole batch, so all rows must advance by the same number of
# tokens each round. We take the **minimum** accepted count across the rows: every row's tokens are still
# exactly its greedy tokens (a row that was ahead re-derives its extra tokens next round), but the batch
# moves at the pace of its worst row. Run all four prompts as one batch. **Predict first:** how many tokens
# per verify call will the "copy: repeat" row get now?

# %%
batch = ngram.generate(list(prompts.values()), N)
ok = check("batched speculative decoding == each prompt's plain greedy tokens",
      [r.generated_ids for r in batch] == [greedy[t][1][0] for t in prompts])
batch_table = table([{"task": t, "tokens/call alone": round(r["tokens/call"], 2),
                      "in a batch of 4": round(b.tokens_per_call, 2)} for (t, r, b) in zip(prompts, rows, batch)])

# %% [markdown]
# The open-ended row drags the copy rows down to its pace. There is a second reason: a batch of B rows
# verifies B·(k+1) tokens per call. Plain decoding at batch B already uses the weights it reads for B
# tokens (notebook 06); once B·(k+1) tokens are enough to make the step compute-bound, a verify call
# costs nearly k+1 decode steps, and no acceptance rate can pay for that. `speculation.step_costs(m.params,
# batch=16)` measures it (we skip it here to keep the notebook short): the table above gives batch 1's cost measured now;
# at batch 16 each verify call carries 80 tokens, and it cost 2.3 decode steps (a stored run: 2-core AMD EPYC,
# 2026-12-05; batch 1 was 1.4 in that run).
#
# On a CPU the ridge point is near (a few FLOPs per byte: notebook 07 measured about 4 on this lab's 2-core CPU), so the verify cost climbs within
# small batches; on a GPU or TPU it sits much further right, so it takes a far bigger batch. Either way
# the lesson holds: serving systems that batch many requests use speculative decoding mostly at low
# load, and give each row its own cache position (per-row write indices) so rows need not wait for
# each other. The minimum rule is the simple, exact choice for one shared cache.
#
# jaxlab's continuous-batching engine (notebook 11) has per-row positions: its paged cache gives every row its
# own pages and write position, so with `Engine(speculative=k)` (`jaxlab serve --speculative ngram`) each greedy
# row carries its own prompt-lookup drafts and advances by its **own** accepted count in the same step, still
# plain greedy's tokens. The same mixed batch on the three roads (`python -m jaxlab.bench.speculative`; too slow
# to run here, so a stored run, its host and date below):

# %% tags=["nbval-ignore-output"]
engine_road = stored("speculative-engine-cpu")
for run in ("mixed", "alone"):
    print(render_engine(engine_road[run]) + "\n")
mixed = {r["road"]: r for r in engine_road["mixed"]["rows"]}
print(f"in the mixed batch: {mixed['engine, speculative']['tokens/call']:.2f} tokens per row and call on the engine, "
      f"{mixed['lockstep decoder (batch minimum)']['tokens/call']:.2f} in lockstep; in seconds "
      f"{engine_road['mixed']['speed_up']:.2f}x the engine without drafts, and "
      f"{engine_road['alone']['speed_up']:.2f}x for one copy-heavy request alone ({engine_road['label']})")

# %% [markdown]
# Per-row acceptance lifts the copy rows out of the open-ended row's pace: more tokens per call than the lockstep
# minimum. What that buys in seconds is section 4's cost again: every row of the batch now carries k + 1 tokens
# through each call, so on this CPU the mixed batch is slower than no drafts at all, while one request alone (the
# low load speculative decoding is for) gains the most. The engine keeps the verify shape for every row even when
# no row has a draft, so that a row's tokens never depend on its neighbours' drafts (batch invariance).
#
# ## 6 · Sampling: the rejection rule
#
# With sampling, "the model agrees" is not a yes/no question. The standard rule (Leviathan et al. 2023;
# Chen et al. 2023) keeps the output distributed *exactly* as the model's own, p: draw a draft token d
# from the draft's distribution q, accept it with probability min(1, p(d)/q(d)); on rejection, draw from
# the **residual** max(0, p − q), normalized: the part of p that q under-proposes. An n-gram draft is a
# point mass. `spec.speculative_sample` implements it (and `spec.SpeculativeDecoder.generate` uses it
# when given a `SamplingParams` with a temperature). Check it on five tokens, with a draft that is badly
# wrong, and against a rule that simply accepts every draft:

# %%
p = np.array([0.40, 0.30, 0.15, 0.10, 0.05])
q = np.array([0.10, 0.10, 0.20, 0.30, 0.30])


def accept_always(p, q, drafts, key):  # a wrong rule: emits the draft's distribution, q
    bonus = jax.random.categorical(key, jnp.log(p[..., -1, :]), axis=-1)
    return jnp.concatenate([drafts, bonus[..., None]], -1), jnp.ones(drafts.shape, bool)


right = speculation.first_token_frequencies(p, q, n=50_000)
wrong = speculation.first_token_frequencies(p, q, n=50_000, rule=accept_always)
ok = check("the rejection rule emits p", np.abs(right - p).max() < 0.01, "50000 draws, every frequency within 0.01")
ok = check("accepting every draft emits q instead", np.abs(wrong - q).max() < 0.01 and np.abs(wrong - p).max() > 0.1)


# %% [markdown]
# (`tests/engine/test_speculative.py` checks the rule with a chi-square test at every position, also through
# the whole generator on an 11-token model, and checks that it catches two wrong rules: accepting
# always, and redrawing from p instead of the residual.)
#
# ## Summary
#
# - Greedy speculative decoding is **exact**: identical tokens, for n-gram drafts, a draft model, and a
#   batch, with one compiled verify program whatever the acceptance.
# - It pays when the drafts are right: answers that copy from the prompt (rewrite, fix, extract) get
#   several tokens per model call. Open-ended writing gets about one, and gains nothing.
# - The speed-up is tokens per call divided by the cost of a call. On a CPU a verify call costs well
#   over one decode step; on GPUs and TPUs it comes closer to one, which is where the technique shines.
# - A draft made of the model's own first layers guesses too badly to help; a batch advances at its
#   slowest row's pace, and bigger batches make verification dearer.
# - Measured here: "identical output" holds; "a free speed-up" holds only when the answer copies from the
#   prompt.
#
# **Quiz**
#
# 1. Why can checking k + 1 tokens in one call cost about as much as generating one?
#    <details><summary>Answer</summary>At batch 1 a decode step is memory-bound: it reads every weight to do
#    about 2 FLOPs per weight. Feeding k + 1 tokens reads the same weights once and does k + 1 times the
#    arithmetic, which is nearly free while the step stays memory-bound (closer to free on a GPU or TPU than on
#    a CPU).</details>
# 2. Greedy speculative decoding keeps the model's own token after the first wrong draft. Why is the output
#    then exactly plain greedy's?
#    <details><summary>Answer</summary>The verify pass gives the model's greedy choice after every prefix
#    `[x, d1..dj]`. Drafts are kept only while they equal those choices, so every kept token, and the model's
#    token after them, is what plain greedy would have produced from the same context.</details>
# 3. Why does changing how many drafts are accepted never recompile anything?
#    <details><summary>Answer</summary>The verify call always has shape `[B, k+1]`; acceptance only changes
#    values (how far the cache's write index moves back), never shapes.</details>
# 4. Why does a batch of 4 mixed prompts get about one token per call?
#    <details><summary>Answer</summary>The cache has one write index for the batch, so every row advances by
#    the minimum accepted count, and the open-ended row accepts almost nothing.</details>
#
# ## Exercises
#
# Solutions are in `notebooks/solutions/10_speculative_decoding.py`.
#
# **1. Prompt lookup.** `my_ngram_propose(context, k)`: for n = 3, then 2, then 1, take the context's
# last n tokens and find their most recent *earlier* occurrence that is followed by at least one token;
# return the k tokens that followed it (if fewer than k, repeat the last one). Return `[]` if no n-gram
# recurs.

# %%
def my_ngram_propose(context, k):
    raise NotImplementedError


from jaxlab.lab.exercises import nb10

passed = nb10.check_ngram(my_ngram_propose)


# %% [markdown]
# **2. How many drafts to keep.** `my_accepted_count(drafts, target)`: drafts `[B, k]`, the model's
# greedy tokens `[B, k+1]`; return, per row, how many *leading* drafts equal the model's tokens (the
# first mismatch ends the count). No Python loop over the rows.

# %%
def my_accepted_count(drafts, target):
    raise NotImplementedError


passed = nb10.check_accepted_count(my_accepted_count)


# %% [markdown]
# **3. The residual.** `my_residual(p, q)`: rows of probabilities `[B, V]`; return max(0, p − q)
# normalized to sum to 1 in each row: the distribution a rejected draft is redrawn from.

# %%
def my_residual(p, q):
    raise NotImplementedError


passed = nb10.check_residual(my_residual)

# %% [markdown]
# **An experiment of your own.** Write a prompt of your own that you expect to copy a lot (a table to
# reformat, a list to sort, a JSON object to edit) and one that should not, and run them through
# `speculation.measure(m.params, m.tokenizer, {"mine: copy": [...], "mine: free": [...]}, k=K)`. Then try
# `k = 2` and `k = 8` on the copy prompt: where does a longer draft stop paying, given the verify cost you
# measured in section 4?
