# %% [markdown]
# # 18 · Bringing a model up on JAX: PyTorch through torchax, and a new architecture in pure JAX
#
# *About 40 minutes.* A new model reaches JAX by one of two roads. The first keeps the PyTorch code and runs it as
# JAX: [torchax](https://github.com/google/torchax) makes every PyTorch operation a JAX operation, so `jax.jit`
# can trace a `transformers` model into one XLA program (the road the first external vLLM TPU backend took). The
# second writes the model in JAX: the road of this lab's SmolLM2, and the one Qwen3.5's TPU support took for its
# new layers, "pure JAX implementations of causal Conv1D and Gated DeltaNet before later Pallas kernels optimized
# them". This notebook takes both roads for real: SmolLM2 through torchax beside jaxlab's own model, and Qwen3.5's
# hybrid layers written three ways and checked against `transformers`' PyTorch implementation.
#
# **Learning goals**
#
# - Run a `transformers` model as JAX through torchax, check its greedy tokens, and read what it compiles beside
#   what the native model compiles.
# - Derive Gated DeltaNet from the recurrence (a fixed-size matrix state instead of a growing KV cache), then the
#   chunked form prefill runs, and check each form against the others and against PyTorch.
# - Measure what the constant state buys: the decode cost per token against the context, beside full attention.
# - Say what a recurrent state changes in serving: prefix reuse and preemption.
#
# Links: [torchax](https://github.com/google/torchax) ·
# [Gated Delta Networks (Yang, Kautz & Hatamizadeh, 2024)](https://arxiv.org/abs/2412.06464) ·
# [Parallelizing linear transformers with the delta rule (Yang et al., 2024)](https://arxiv.org/abs/2406.06484) ·
# [Pallas](https://docs.jax.dev/en/latest/pallas/index.html) ·
# [`jax.lax.scan`](https://docs.jax.dev/en/latest/_autosummary/jax.lax.scan.html)

# %% tags=["nbval-ignore-output"]
import importlib.util

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

from jaxlab.engine import deltanet, qwen35
from jaxlab.engine.kernels import gated_delta_pallas, lower
from jaxlab.engine.kvcache import left_pad
from jaxlab.io.assets import model_path
from jaxlab.io.config import qwen35_smollm2_width
from jaxlab.lab import bringup
from jaxlab.lab.notebook import check, setup, show_source, stored, table, unmeasured, verdict
from jaxlab.tools.qwen35_reference import load_tiny
from jaxlab.tools.reference import load_golden

setup()
HAVE_TORCH = all(importlib.util.find_spec(m) for m in ("torch", "torchax", "transformers"))
print("torch, torchax and transformers installed:", HAVE_TORCH)

# %% [markdown]
# ## 1 · Road one: PyTorch as JAX, through torchax
#
# torchax defines a `torch.Tensor` subclass that holds a `jax.Array`. PyTorch hands every operation on it
# (`aten.mm`, `aten.softmax`, ...) to torchax's dispatcher, which calls the JAX function registered for it. Give
# the model's weights as JAX arrays and call it functionally, and the whole forward pass is a Python function of
# JAX arrays that `jax.jit` traces into one program, like any other. jaxlab's bridge
# (`jaxlab.tools.torchax_bridge`) loads `transformers`' SmolLM2 from the same GGUF file jaxlab reads, and jits two
# steps: the prompt in, and one token in over `transformers`' own `StaticCache` (fixed shapes, so one decode
# program), passed as JAX arrays and donated so it is updated in place.
#
# One wrinkle, which is what bringing up costs: torchax 0.0.13 still names PyTorch's named-tensor overloads
# (`aten.prod.dim_Dimname`, ...) that torch 2.13 removed, and fails on import. The bridge maps exactly those names
# (each contains "dimname" or "names") to a placeholder while torchax loads, and refuses any other missing name.
#
# **Predict first:** jaxlab's model was written for JAX (a preallocated cache updated by `dynamic_update_slice`,
# one einsum per projection); torchax traces `transformers`' code, written for eager PyTorch. How much slower do
# you expect the traced road to be, at the prompt and per decoded token?

# %% tags=["nbval-ignore-output"]
if HAVE_TORCH:
    from jaxlab.bench.torchax import measure_torchax, render
    from jaxlab.engine.loading import load_params
    from jaxlab.tools import torchax_bridge
    from jaxlab.tools.reference import load_reference

    reference = load_reference(model_path())
    params = load_params(str(model_path()), dtype="float32")[0]
    ids = load_golden()["prompts"][5]["prompt_ids"]
    road = measure_torchax(model_path(), ids, new_tokens=8, reps=2, reference=reference, params=params)
    road["hlo"] = torchax_bridge.hlo_summary(torchax_bridge.bridge(reference[0]), params, road["cache_len"])
    road_source = ""
    print(f"the shim mapped away {len(torchax_bridge.missing_overloads())} named-tensor overloads")
else:
    road = stored("torchax-cpu")
    road_source = road["label"]
    print(f"torch is not installed here (the lab's set-up leaves it out): the {road_source}")
print(render(road))

# %% tags=["nbval-ignore-output"]
same = [a == b for a, b in zip(road["torchax"]["tokens"], road["transformers_tokens"])]
_ = verdict("torchax_runs_pytorch_as_jax", sum(same) / len(road["transformers_tokens"]), source=road_source)

# %% [markdown]
# The translation is exact: the same greedy tokens as eager PyTorch (and as jaxlab). What it costs is in the
# programs. Both decode steps lowered to StableHLO, for one row and the same cache. *Ops run* counts what the
# program executes (a function called 30 times counts 30 times: XLA inlines it); *as written* is the module's text.
# jaxlab traces its decoder block once and calls it per layer, so its module is a tenth of torchax's text and lowers
# in a fraction of the time; what runs is the same loop of 30 blocks.

# %% tags=["nbval-ignore-output"]
hlo = road["hlo"]
table([{"road": name, "StableHLO ops run": p["ops"], "as written": p.get("written_ops", p["ops"]),
         "matmuls": p["top_ops"].get("stablehlo.dot_general", 0),
        "cache donated": p["donated"],
        "cache argument": "; ".join(p["cache"][:2]) + (" ..." if len(p["cache"]) > 2 else "")}
       for name, p in hlo.items()])
ops = sorted(set(hlo["torchax"]["top_ops"]) | set(hlo["jaxlab"]["top_ops"]),
             key=lambda o: -hlo["torchax"]["top_ops"].get(o, 0))[:8]
fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.6))
bars = np.arange(len(ops))
for i, name in enumerate(("torchax", "jaxlab")):
    a.bar(bars + 0.4 * i, [hlo[name]["top_ops"].get(o, 0) for o in ops], 0.4, label=name)
a.set_xticks(bars + 0.2, [o.replace("stablehlo.", "") for o in ops], rotation=35, ha="right")
a.set_ylabel("ops in the decode step")
a.legend()
steps = ("prefill_s", "decode_s_per_token")
for i, name in enumerate(("torchax", "native")):
    b.bar(np.arange(2) + 0.4 * i, [road[name][s] * 1e3 for s in steps], 0.4, label="jaxlab" if i else name)
b.set_xticks(np.arange(2) + 0.2, ["prefill (40 tokens)", "decode, per token"])
b.set_ylabel("ms (best of runs)")
b.legend()
fig.suptitle(f"SmolLM2 two ways: what each compiles, what each costs ({road_source or 'measured now'})")
fig.tight_layout()
plt.show()

# %% tags=["nbval-ignore-output"]
slower = {step: 1 / road["native_over_torchax"][step] for step in ("prefill", "decode")}
_ = verdict("jax_native_engine_pays", slower, source=road_source)

# %% [markdown]
# Both programs do the same matmuls (the table's `dot_general` count); torchax's carries more broadcasts and
# multiplies, the traces of PyTorch idioms (masks built per call, rotary tables expanded per head), which cost
# most where they are largest, the prefill of the whole prompt. Per decoded token the two roads end close on this
# CPU: both read the same 540 MB of float32 weights, and that is what the step's time is. A
# separate JAX-native engine earns its keep on what a trace of eager code does not give: control over the cache's
# layout (paged, quantized), over batching, sharding and kernels, which is the rest of this lab.
#
# When is torchax the right road? When the PyTorch model is the specification and time to first result matters:
# a new architecture runs on a TPU the day its PyTorch code exists, tokens checked against eager PyTorch. When the
# model serves at scale, the native road's control pays, and the first road's tokens are its reference.
#
# ## 2 · Road two: a new architecture, from the recurrence
#
# Qwen3.5 is a hybrid: three of every four layers are **Gated DeltaNet**, linear attention with a matrix state
# per head; the fourth is full attention with a KV cache. Linear attention replaces softmax(QKᵀ)V by a running sum
# `S_t = S_{t-1} + k_t v_tᵀ`, read as `o_t = S_tᵀ q_t`: a `[Dk, Dv]` state whatever the context. The **delta
# rule** writes only the correction, what the state does not already recall for `k_t`; the **gate** decays the
# state first by `exp(g_t)`, g ≤ 0:
#
# `S_t = exp(g_t) S_{t-1} + k_t · β_t (v_t − exp(g_t) S_{t-1}ᵀ k_t)ᵀ`,  `o_t = S_tᵀ q_t`
#
# In NumPy, one head, five tokens, beside `jaxlab.engine.deltanet.gated_delta_recurrent` (a `lax.scan` of the same
# step, what decode runs):

# %%
rng = np.random.default_rng(0)
T, dk, dv = 5, 4, 3
unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731  the layer l2-normalises q and k
q, k = unit(rng.standard_normal((T, dk))) * dk**-0.5, unit(rng.standard_normal((T, dk)))
v, g, beta = rng.standard_normal((T, dv)), -rng.random(T), rng.random(T)
S, outs = np.zeros((dk, dv)), []
for t in range(T):
    S = np.exp(g[t]) * S
    S = S + np.outer(k[t], beta[t] * (v[t] - S.T @ k[t]))
    outs.append(S.T @ q[t])
f32 = lambda x: jnp.asarray(x, jnp.float32)[None, :, None]  # noqa: E731  [1, T, 1 head, ...]
out, state = deltanet.gated_delta_recurrent(f32(q), f32(k), f32(v), f32(g), f32(beta))
_ = check("the NumPy recurrence equals gated_delta_recurrent (outputs and state)",
          np.allclose(np.array(outs), out[0, :, 0], atol=1e-6) and np.allclose(S, state[0, 0], atol=1e-6))

# %% [markdown]
# A prompt of T tokens through the recurrence is T dependent rank-1 updates: no matmul an accelerator's matrix
# unit could fill. The **chunked form** (what prefill runs) cuts the sequence into chunks of C tokens. Inside a
# chunk the corrections depend on each other only through a unit lower-triangular C × C system, solved once for
# the chunk (the "UT transform"); then the chunk's outputs and the next state are a few C × C and C × D matmuls,
# and the scan runs T / C steps instead of T. The derivation is in the module's docstring:

# %%
_ = show_source(deltanet, max_lines=40)

# %% [markdown]
# **Predict first:** on this CPU, which form prefills 1,024 tokens faster, the scan of 1,024 small updates or
# 16 chunks of matmuls with a triangular solve each? The forms give the same numbers; check that, then time them
# at SmolLM2's width (9 value heads of 64 × 64, two DeltaNet layers, a small vocabulary so the head does not
# hide them):

# %% tags=["nbval-ignore-output"]
rng = np.random.default_rng(1)
B, T, H, D = 2, 100, 3, 16
qs = deltanet.l2norm(jnp.asarray(rng.standard_normal((B, T, H, D)), jnp.float32)) * D**-0.5
ks = deltanet.l2norm(jnp.asarray(rng.standard_normal((B, T, H, D)), jnp.float32))
vs = jnp.asarray(rng.standard_normal((B, T, H, D)), jnp.float32)
gs, bs = -jnp.asarray(rng.random((B, T, H)), jnp.float32), jnp.asarray(rng.random((B, T, H)), jnp.float32)
forms = {"recurrent": deltanet.gated_delta_recurrent(qs, ks, vs, gs, bs),
         "chunked": deltanet.gated_delta_chunked(qs, ks, vs, gs, bs, chunk=16),
         "pallas (interpreted)": gated_delta_pallas(qs, ks, vs, gs, bs, chunk=16)}
errs = {name: max(float(jnp.max(jnp.abs(o - forms["recurrent"][0]))), float(jnp.max(jnp.abs(s - forms["recurrent"][1]))))
        for name, (o, s) in forms.items()}
print({name: f"{e:.1e}" for name, e in errs.items()})

# %%
_ = check("the chunked form and the Pallas kernel equal the recurrence within 1e-5 (outputs and final state)",
          max(errs.values()) <= 1e-5)

# %% tags=["nbval-ignore-output"]
width = qwen35_smollm2_width().replace(n_layers=2, layer_types=())
prefill = bringup.prefill_forms(width, (1024,), repeats=3)
_ = table([{"tokens": r["tokens"], "form": r["form"], "ms": r["ms"], "tokens/s": r["tokens_per_s"]} for r in prefill])
form, times = bringup.faster_form(prefill, 1024)
print(f"faster at 1,024 tokens here: the {form} form, {times:.2f}x")

# %% [markdown]
# On XLA:CPU the scan is the faster form (the line above says by how much here; about 1.8x on the 2-core AMD EPYC
# host this was written on, 2026-12-05): each of its steps is a handful of 64 × 64 products a CPU does in
# microseconds, while the chunked form does more arithmetic (the C × C products and the solve) to turn the work
# into matmuls, which a CPU does not run much faster than the small products. The chunked form is for a matrix unit (a TPU's MXU, a
# GPU's tensor cores), where a 64 × 64 matmul costs about what one rank-1 update does; on this host the model's
# prefill could take the recurrent form, and `qwen35.forward(..., form="recurrent")` does.
#
# ## 3 · The whole model against PyTorch
#
# `jaxlab.engine.qwen35` builds Qwen3.5's decoder from these pieces and the house's: `model.py`'s dense layer,
# SwiGLU and RoPE (on the first quarter of each head only, Qwen3.5's partial rotary), the KV cache for the full-
# attention layers, and per DeltaNet layer a `[B, K−1, C]` convolution state and a `[B, H, Dk, Dv]` recurrent state
# in one `HybridCache`. The reference is `transformers`' PyTorch Qwen3.5, built with a tiny random configuration
# (no weights downloaded); its weights and logits are stored in `data/reference/` so this runs without torch, and
# a test rebuilds them from the seed to keep the file honest.

# %% tags=["nbval-ignore-output"]
tiny, golden = load_tiny()
cfg = tiny.config
prompts, ref_logits = golden["prompts"], [np.array(row, np.float32) for row in golden["logits"]]
print(f"{cfg.n_layers} layers {cfg.layer_types}, width {cfg.dim}, vocabulary {cfg.vocab_size}; "
      f"{len(prompts)} prompts of {[len(p) for p in prompts]} tokens")


def relative_error(ours, ref):
    return float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref)))


# the prompts left-padded into one batch, one prefill through the cache (chunked form)
tokens, positions = left_pad(prompts, cfg.pad_id)
logits, _ = jax.jit(qwen35.forward)(tiny, jnp.asarray(tokens), jnp.asarray(positions),
                           qwen35.init_hybrid_cache(cfg, len(prompts), tokens.shape[1]))
prefill_err = max(relative_error(np.asarray(logits[i, -len(p):]), ref_logits[i]) for i, p in enumerate(prompts))
# the longest prompt one token at a time, the DeltaNet states and the KV cache carried between steps (recurrent form)
p = max(prompts, key=len)
cache, rows = qwen35.init_hybrid_cache(cfg, 1, len(p)), []
step = jax.jit(qwen35.forward)
for t, tok in enumerate(p):
    out, cache = step(tiny, jnp.asarray([[tok]]), jnp.asarray([[t]]), cache)
    rows.append(np.asarray(out[0, 0]))
decode_err = relative_error(np.stack(rows), ref_logits[prompts.index(p)])
print(f"largest relative error against transformers: prefill {prefill_err:.1e}, step-by-step decode {decode_err:.1e}")
_ = verdict("pure_jax_first_for_new_layers", max(prefill_err, decode_err))

# %% [markdown]
# Generation runs on the same steps: `qwen35.greedy` prefills a left-padded batch once and decodes one token per
# step, each row with its own states. Padding must leave a row's states as if it were not there (g = 0 and β = 0,
# masked out of the convolution), so each row's tokens equal `transformers`' for that prompt alone:

# %%
ours = qwen35.greedy(tiny, cfg, prompts, len(golden["greedy"][0]))
for o, ref in zip(ours, golden["greedy"]):
    print(o, "==" if o == ref else "!=", ref)
_ = check("greedy tokens of the ragged batch equal transformers' generate on each prompt alone", ours == golden["greedy"])

# %% [markdown]
# ## 4 · What the constant state buys
#
# A full-attention layer's decode step reads every key and value it has cached: its cost and its memory grow with
# the context. A DeltaNet layer's step reads its `[Dk, Dv]` states and its convolution's last three inputs,
# whatever came before. **Predict first:** from 256 to 16,384 tokens of context, how much does each kind's decode
# step grow, at SmolLM2's width (two layers of one kind, batch 1)?

# %% tags=["nbval-ignore-output"]
cost = bringup.decode_cost_vs_context(width, (256, 1024, 4096, 16384), repeats=5)
fig = bringup.plot_decode_cost(cost, "one decode step at SmolLM2's width, two layers of each kind (measured now)")
plt.show()
for kind, label in bringup.KINDS.items():
    top = max((r for r in cost if r["kind"] == kind), key=lambda r: r["context"])
    print(f"{label}: {bringup.growth(cost, kind):.2f}x the time per token from 256 to 16,384 tokens of context; "
          f"{top['cache_bytes'] / 2**20 / width.n_layers:.2f} MiB a layer held at 16,384")

# %% [markdown]
# The attention step's time follows its cache, which grows 64-fold over the range; the DeltaNet step stays flat,
# as does its memory (the printed MiB: a fixed state against a KV cache that grows by every token). That is the hybrid's
# bargain: three of four layers cost the same at any length, and one in four keeps exact recall of every token.
#
# ## 5 · Then a Pallas kernel
#
# `jaxlab.engine.kernels.gated_delta_pallas` is the chunked form as one kernel: a grid over (batch × head, chunk),
# the state kept in on-chip memory (VMEM) across a row's chunks, each chunk's triangular system inverted by
# doubling diagonal blocks (10 matmuls at C = 64, no data-dependent indexing). It equalled the pure JAX forms in
# section 2 (interpreted here); compiled for a v5e by libtpu on this CPU, it becomes a Mosaic custom call in the
# TPU program:

# %%
shapes = [jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in
          [(1, 256, 2, 128)] * 3 + [(1, 256, 2)] * 2]
text = lower(lambda *a: gated_delta_pallas(*a, chunk=64, variant="tpu", interpret=False), "tpu", *shapes)
print("tpu_custom_call in the TPU program:", text.count("tpu_custom_call") > 0)

# %% tags=["nbval-ignore-output"]
_ = unmeasured("pallas_kernels_optimized_them",
               "no TPU here: the kernel compiles for one (above) and equals the pure JAX forms, but interpret mode's "
               "speed on a CPU says nothing of a TPU's; run section 2's timing on a TPU runtime to measure it")

# %% [markdown]
# ## 6 · A recurrent state in a serving engine
#
# The engine of notebook 11 relies on two properties of a KV cache: a prefix's entries can be shared between
# requests (pages with a hash), and a preempted request can be cut back or rebuilt from its pages. A DeltaNet
# state is one matrix summing the whole history, so neither holds: a prefix can be reused only from a snapshot of
# every layer's state taken exactly at the prefix's end, and a preempted request must be recomputed from its
# prompt and the tokens it had generated. jaxlab keeps no snapshots, so it takes the simplest correct rule:

# %%
show_source(qwen35.can_reuse_prefix)
show_source(qwen35.resume_tokens)
first = ours[0]  # section 3's tokens for prompt 0, generated in the batch
resumed = qwen35.greedy(tiny, cfg, [qwen35.resume_tokens(prompts[0], first[:4])], 6)[0]
_ = check("a preempted request, re-prefilled with its 4 generated tokens, continues with the same 6 tokens",
          first[4:] == resumed)


# %% [markdown]
# ## Summary
#
# - torchax runs a `transformers` model as JAX: each PyTorch operation becomes a JAX one, so `jax.jit` traces the
#   model; with the cache passed as arrays it is one decode program. Its tokens equal eager PyTorch's; its programs
#   carry the traces of eager idioms, and it leaves the cache's layout and the batching to PyTorch's code.
# - Gated DeltaNet is linear attention with a decaying, delta-rule write: a fixed `[Dk, Dv]` state per head. The
#   recurrent form (decode) and the chunked form (prefill: a triangular solve and matmuls per chunk) are the same
#   sums; the chunked form is for a matrix unit, and on this CPU the scan is faster.
# - Written in pure JAX beside the Llama model and sharing its pieces, Qwen3.5 matches PyTorch to about 1e-7, in
#   prefill and step by step; a Pallas kernel of the chunked form equals both and compiles for a TPU.
# - Per decoded token, the DeltaNet layer's cost and memory are flat in the context; full attention's grow with it.
# - A recurrent state cannot be rolled back or shared by pages: prefix reuse needs snapshots, preemption recomputes.
#
# **Quiz**
#
# 1. torchax's tokens equal eager PyTorch's. Why might a serving team still write the model again in JAX?
#    <details><summary>Answer</summary>For control the trace does not give: the cache's layout (pages, int8), how
#    requests are batched and scheduled, how weights and caches are sharded, which kernels run. The translated
#    model keeps PyTorch's own choices for all of these; its tokens become the native model's reference.</details>
# 2. Why does the chunked form need a triangular solve, when plain linear attention's chunked form does not?
#    <details><summary>Answer</summary>The delta rule writes `v − Sᵀk`, which depends on the state, which depends
#    on the chunk's earlier writes: the corrections are coupled through a lower-triangular system. Plain linear
#    attention writes `k vᵀ` whatever the state, so its chunk is a masked `Q Kᵀ V` with no coupling.</details>
# 3. A chat service wants to reuse a long system prompt's work for every request on a hybrid model. What must it
#    store, and when?
#    <details><summary>Answer</summary>For the attention layers, the prompt's KV entries (pages, as for Llama);
#    for every DeltaNet layer, its recurrent state and convolution inputs exactly at the prompt's last token: a
#    snapshot taken then, since the state cannot be recovered later from anything else.</details>
#
# **An experiment of your own.** Time `qwen35.forward` on a prefill of 4,096 tokens with `form="chunked"` and
# `form="recurrent"`, then with `chunk=16` and `chunk=128` in `deltanet.gated_delta_chunked`. Where does the
# chunked form's extra arithmetic stop costing more than the scan's sequence of small steps on this machine?
#
# ## Exercises
#
# Solutions are in `notebooks/solutions/18_bringing_up_a_model.py`.
#
# **1. One step of the gated delta rule.** `my_delta_step(S, q, k, v, g, beta)`: one head, one token. S `[Dk, Dv]`,
# q and k `[Dk]` (unit length), v `[Dv]`, g ≤ 0, β in (0, 1) -> (the output `[Dv]`, the new state). NumPy is enough.

# %%
def my_delta_step(S, q, k, v, g, beta):
    raise NotImplementedError


from jaxlab.lab.exercises import nb18

passed = nb18.check_delta_step(my_delta_step)


# %% [markdown]
# **2. The convolution's decode step.** `my_conv_step(state, x, w)`: state `[K−1, C]` the last inputs (oldest
# first), x `[C]` this token's, w `[C, K]` (the last tap multiplies this token) -> (SiLU of the depthwise
# convolution `[C]`, the new state `[K−1, C]`).

# %%
def my_conv_step(state, x, w):
    raise NotImplementedError


passed = nb18.check_conv_step(my_conv_step)


# %% [markdown]
# **3. A chunk's decay matrix.** `my_decay_matrix(g)`: the log decays g `[C]` of one chunk -> D `[C, C]` with
# `D[i, j] = exp(g[j+1] + ... + g[i])` for j ≤ i (1 on the diagonal) and 0 above it: what the chunked form
# multiplies `Q Kᵀ` by, so a write at j is read at i decayed by every gate in between.

# %%
def my_decay_matrix(g):
    raise NotImplementedError


passed = nb18.check_decay_matrix(my_decay_matrix)
