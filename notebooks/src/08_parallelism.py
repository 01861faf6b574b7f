# %% [markdown]
# # 08 · Parallelism: one model, many devices
#
# *About 45 minutes.* Until now one device ran everything. This notebook splits generation with the real SmolLM2-135M
# across devices in three ways (**data parallel**, **tensor parallel**, and both at once on a 2-D
# mesh), writes tensor parallelism once more by hand, and finally runs two *processes* as one
# machine. Each time we check that the greedy tokens are exactly the ones a single device produces.
#
# On a laptop or in CI the devices are *simulated*: XLA can present one CPU as 8 devices. That is
# enough to compile and run the real multi-device programs (the same ones a TPU would run, with the
# same collectives), but not to make anything faster, because all 8 "devices" share the same few
# cores. So we measure what can be measured honestly here (correctness, the collectives the
# compiler inserted, the bytes each device holds and sends) and say what changes on real hardware.
#
# The article we test says:
#
# > "when a single GPU isn't enough, JAX's pmap function extends this parallelism across multiple
# > devices, sharding the computation across a cluster of GPUs or TPUs."
#
# > "the communication overhead of pmap can become a bottleneck if not managed properly. [...]
# > Attention computations, for example, are highly parallelizable, while softmax operations involve
# > global reductions that require synchronization."
#
# Links: [Distributed arrays and automatic parallelization](https://docs.jax.dev/en/latest/notebooks/Distributed_arrays_and_automatic_parallelization.html)
# · [Manual parallelism with `shard_map`](https://docs.jax.dev/en/latest/notebooks/shard_map.html)
# · [`jax.pmap`](https://docs.jax.dev/en/latest/_autosummary/jax.pmap.html)
# · [Multi-process environments](https://docs.jax.dev/en/latest/multi_process.html)
# · [Megatron-LM, tensor parallelism (Shoeybi et al., 2019)](https://arxiv.org/abs/1909.08053)
# · [Efficiently Scaling Transformer Inference (Pope et al., 2022)](https://arxiv.org/abs/2211.05102)
# · [Ring Attention, sequence parallelism (Liu et al., 2023)](https://arxiv.org/abs/2310.01889)
#
# **Learning goals**
#
# - build a device **mesh** with named axes (`data`, `model`) and see how arrays are laid out on it;
# - make the popular `pmap` example correct, and know why `pmap` is now JAX's legacy API;
# - split generation three ways by changing only a *mapping* from logical axes to mesh axes, and
#   check that the tokens do not change;
# - write tensor parallelism by hand with `shard_map` and two `psum`s per layer, and read the
#   collectives XLA inserted from the compiled program;
# - find out when the softmax needs communication (a split sequence) and when it needs none (whole heads);
# - work out what each strategy costs in memory and communication, and when each one pays off;
# - run two processes as one mesh: the code path of a TPU pod slice.

# %% tags=["nbval-ignore-output"]
import os

# 8 simulated CPU devices. XLA reads this flag once, when jax starts its CPU backend, so it must be set
# before jax is imported (to change it, restart the kernel). On a GPU or TPU runtime it gives the host
# CPU 8 devices beside the accelerators: with fewer accelerators than the meshes need (a free Colab TPU
# is one chip), the meshes are built from those instead (mesh_devices says which, below).
FLAG = "--xla_force_host_platform_device_count=8"
if FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + FLAG).strip()

import jax
import matplotlib.pyplot as plt
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import jaxlab
from jaxlab import distributed
from jaxlab.engine import placement, sharding
from jaxlab.engine.mesh import (CACHE_AXES, RULES, STRATEGIES, describe_mesh, fit_mesh, format_mesh, logical_to_spec,
                                make_mesh, mesh_devices, mesh_shape, param_logical_axes, rules_for)
from jaxlab.engine.kvcache import left_pad
from jaxlab.engine.model import Block, init_params
from jaxlab.tools.reference import agreement_rtol, compare_logits, load_golden
from jaxlab.lab import parallel
from jaxlab.lab.notebook import check, setup, show_source, table, unmeasured, verdict

setup()
m = jaxlab.load()
tiny = init_params(jaxlab.tiny(), 0)  # 3 layers, random weights: for demonstrations that need only shapes
MESH = mesh_devices(min_devices=4)  # the devices every mesh below is built from
DEVICES, N = list(MESH.devices), MESH.count
print(m)
print(MESH.note)

# %% [markdown]
# ## 1 · A mesh: devices with named axes
#
# A **mesh** arranges the devices in a grid and names its axes. Ours has two: `data` (rows of the
# batch are split along it) and `model` (the model's heads and hidden units are split along it).
# `fit_mesh` (in `jaxlab.engine.mesh`) picks a shape from the devices there are, and never assumes 8. A 1 x 1 mesh
# would run all the code below but split nothing, and every claim about communication would be vacuous.
# So with fewer than 4 accelerators (a free Colab TPU runtime is a single v5e chip),
# `mesh_devices` builds the meshes from 8 simulated CPU devices instead and says so in the
# first cell's output (the counts of collectives below assume at least 2 devices). For real
# multi-chip runs, open this notebook on Kaggle with the **TPU v5e-8** accelerator (8 chips on one host),
# or on a Cloud TPU VM (section 6 and the README's "More than one device").

# %%
print(describe_mesh(devices=DEVICES))
mesh = make_mesh(fit_mesh("data+tensor", N), DEVICES)
print("mesh", format_mesh(mesh_shape(mesh)), "| device ids:")
print(np.vectorize(lambda d: d.id)(mesh.devices))

# %% [markdown]
# A mesh larger than the machine is refused with a message that names the constraint and, on a CPU,
# says how to simulate more devices:

# %% tags=["raises-exception", "nbval-ignore-output"]
make_mesh({"data": N, "model": 2}, DEVICES)

# %% [markdown]
# A `NamedSharding(mesh, PartitionSpec(...))` says, for each dimension of an array, which mesh axis
# splits it (`None`: not split, every device along that axis holds all of it). Two arrays placed on the
# mesh: activations with rows split over `data` and columns over `model`, and a weight split by columns
# over `model` only, so each column block is *replicated* over `data`.
#
# **Predict first:** on the `data=2,model=4` mesh, which devices hold the weight's first column block?
# (Each array's `addressable_shards` says which device holds which index; the figure draws them,
# device ids as in the grid above.)

# %%
x = jax.device_put(np.arange(8 * 12.0).reshape(8, 12), NamedSharding(mesh, P("data", "model")))
w = jax.device_put(np.zeros((576, 768), np.float32), NamedSharding(mesh, P(None, "model")))
for shard in w.addressable_shards[:2]:
    print(f"{shard.device} holds columns {shard.index[1].start} to {shard.index[1].stop} of w")
fig = parallel.plot_sharding({"activations P('data', 'model')": x, "weight P(None, 'model')": w})
plt.show()


# %% [markdown]
# ## 2 · The popular `pmap` example, made correct
#
# The pattern that circulates with claims like the article's: decorate the model call with
# `@jax.pmap` and call it with the parameters and a batch. It fails twice over. `pmap` maps **every**
# argument over its leading axis, the parameters included (here it tries to split the tiny model's
# 263-row embedding over the devices, and gives up), and that leading axis must be the **number of
# devices**, not the batch size.

# %%
def last_logits(params, tokens, positions):  # tokens, positions [B, T] -> logits of the last position [B, V]
    return jaxlab.forward(params, tokens, positions)[0][:, -1]


prompts8 = [[1, 17, 42, 99, 7], [1, 5, 6], [1, 250, 3, 3, 8, 9], [1, 64], [1, 77, 78], [1, 9, 10, 11],
            [1, 200], [1, 31, 41, 59, 26]]
tokens, positions = left_pad(prompts8, tiny.config.pad_id)
print("batch:", tokens.shape, "| devices:", N)

# %% tags=["raises-exception", "nbval-ignore-output"]
jax.pmap(last_logits)(tiny, tokens, positions)

# %% [markdown]
# The fix: `in_axes=(None, 0, 0)` broadcasts the parameters (every device gets a full copy) and maps the
# inputs, which we reshape to `[devices, rows per device, T]`.

# %%
n = len(DEVICES)
per_device = jax.pmap(last_logits, in_axes=(None, 0, 0), devices=DEVICES)
split = lambda a: a.reshape(n, a.shape[0] // n, *a.shape[1:])  # [B, T] -> [n, B/n, T]
out = per_device(tiny, split(tokens), split(positions))  # [n, B/n, V]
one_device = jax.jit(last_logits)(tiny, tokens, positions)
_ = check("pmap over the devices == one device", np.allclose(np.asarray(out).reshape(one_device.shape), one_device,
                                                              atol=1e-5), f"{n} devices x {len(prompts8) // n} rows")

# %% [markdown]
# Did the work really go to different devices? The result is a sharded array: each of its
# `addressable_shards` lives on one device and holds that device's rows. Count the devices whose share
# equals the one-device result for those rows:

# %%
reference = np.asarray(one_device).reshape(out.shape)
correct_shares = {shard.device.id for shard in out.addressable_shards
                  if np.allclose(np.asarray(shard.data), reference[shard.index], atol=1e-5)}
_ = verdict("pmap_shards_the_computation", len(correct_shares),
            "each device ran the same program on its own rows; the parameters were broadcast to every device")

# %% [markdown]
# Correct, but with a trap that only shows on a big model: with `in_axes=None`, `pmap` copies the
# argument to every device **on every call**, unless it already lives, replicated, on exactly those
# devices. Here is the real model's embedding (113 MB) passed both ways.
#
# **Predict first:** the lookup itself reads 4 rows per device. How many times slower is the call that
# copies the embedding first: 2x, 10x, 1000x?

# %% tags=["nbval-ignore-output"]
import time

emb = m.params.flat()["embed"]
lookup = jax.pmap(lambda e, t: jax.numpy.take(e, t, axis=0).sum(), in_axes=(None, 0), devices=DEVICES)
ids_per_device = np.ones((n, 4), np.int32)
jax.block_until_ready(lookup(emb, ids_per_device))  # compile
rows = []
for label, e in [("on one device (copied every call)", emb), ("replicated once (placement.replicate_for_pmap)",
                                                               placement.replicate_for_pmap(emb, DEVICES))]:
    jax.block_until_ready(lookup(e, ids_per_device))
    t0 = time.perf_counter()
    jax.block_until_ready(lookup(e, ids_per_device))
    rows.append({"embedding": label, "ms per call": 1e3 * (time.perf_counter() - t0)})
_ = table(rows)
print(f"copying the weights on every call made it {rows[0]['ms per call'] / rows[1]['ms per call']:.0f}x slower: "
      "the host-to-device copy is the communication pmap does when the parameters are not placed beforehand")

# %% [markdown]
# `sharding.Sharded` does the same for generation with `pmap`: the weights are replicated once, before
# the first token.
#
# Correct now, but `pmap` is JAX's **legacy** API: its own docstring calls it the "old way of doing
# parallel map", points to `jax.shard_map`, and says it is now implemented on top of `jit` and
# `shard_map`. Its limits show why: it maps one axis (no 2-D meshes), only over *this process's*
# devices (on a pod each host maps its own), every input needs that extra leading device axis, and
# `in_axes=None` copies the parameters to the devices on every call unless they already live there.
# The rest of the notebook uses the two modern forms: `jit` with shardings, and `shard_map`.
#
# ## 3 · Three strategies, one mapping
#
# Every array in the model names its dimensions with **logical axes**: the attention's `wq` is
# `[embed, q_heads]`, the cache's K is `[batch, kv_heads, cache_len, head_dim]`, and so on. A
# parallelism strategy is then nothing but a mapping from logical axes to mesh axes:

# %%
for name, rules in RULES.items():
    print(f"{name:12s}", rules)

fmt = lambda spec: "P(" + ", ".join(map(str, spec)) + ")"  # noqa: E731
flat = m.params.flat()
rows = []
for name in ["embed", "layers.0.attn.wq", "layers.0.attn.wk", "layers.0.attn.wo", "layers.0.mlp.w_gate",
             "layers.0.mlp.w_down", "layers.0.attn_norm.weight"]:
    axes = param_logical_axes(name)
    rows.append({"parameter": name, "shape": tuple(flat[name].shape), "logical axes": axes,
                 **{s: fmt(logical_to_spec(axes, rules_for(s))) for s in RULES}})
rows.append({"parameter": "cache K (per layer)", "shape": "[B, KVH, S, Hd]", "logical axes": CACHE_AXES["k"],
             **{s: fmt(logical_to_spec(CACHE_AXES["k"], rules_for(s))) for s in RULES}})
_ = table(rows)

# %% [markdown]
# Read the `tensor` column as Megatron-style tensor parallelism. `wq`, `wk`, `wv`, `w_gate` and `w_up`
# are split by **columns** (each device computes its own heads and hidden units, no communication);
# `wo` and `w_down` are split by **rows**, so each device's product is a *partial sum* of the output,
# and one all-reduce per matmul adds them up. The embedding is replicated (it is also the output
# projection; splitting it over `vocab` is one more rule, and the tests check that it works).
#
# **The KV cache** is the subtle one. The model stores K as `[B * KVH, S, Hd]`: batch and KV heads share
# axis 0, batch-major. A sharding of that axis cuts it into contiguous blocks, which are whole rows
# (good for data parallel) but, as soon as a device holds more than one row, not whole heads (tensor
# parallel would need an all-to-all every step). So the sharded paths keep the cache *split*,
# `[B, KVH, S, Hd]`, and run the model once per row under `vmap` (each row's cache, `[KVH, S, Hd]`, is
# exactly the model's own layout for one row).
#
# **Heads that do not divide.** SmolLM2 has 9 query heads in 3 groups sharing 3 KV heads. To split
# heads over `model=4` or `8`, `placement.pad_heads` appends zero KV heads, each with its group of 3 zero
# query heads (the group size must stay 3), and zero MLP units where needed. A zero query head
# attends uniformly over zero values and its output meets zero rows of `wo`, so the function is
# unchanged; the price is the padded work:

# %%
cfg = m.config
rows = []
for mdl in (1, 2, 3, 4, 8):
    s = placement.padded_sizes(cfg, mdl)
    rows.append({"model": mdl, "KV heads": s["n_kv_heads"], "query heads": s["n_heads"], "MLP units": s["ffn_dim"],
                 "attention work wasted": f"{1 - cfg.n_heads / s['n_heads']:.0%}"})
_ = table(rows)
padded = placement.pad_heads(tiny, 8)
_ = check("zero heads change nothing (tiny model, padded for model=8)",
          np.allclose(jax.jit(last_logits)(padded, tokens, positions), one_device, atol=1e-5),
          f"{tiny.config.n_kv_heads} -> {padded.config.n_kv_heads} KV heads")

# %% [markdown]
# Now the five implementations side by side, on meshes fitted to the devices, each generating 8
# greedy tokens for the 8 prompts: the three `jit` strategies (we give the input and output shardings;
# the XLA SPMD partitioner splits the program and inserts the collectives), tensor parallel written with
# `shard_map`, and data parallel with `pmap`. For each we also read the compiled decode step's HLO and
# count its collectives, and the bytes they produce per device. (To keep the notebook quick, the prompts
# go through the decode step one token at a time, `prefill=False`: one compiled program per strategy
# instead of two. The tests also run the prefill program of every strategy.)
#
# **Predict first:** the tiny model has 3 layers. How many all-reduces does one decode step of each
# strategy need, and which strategies need none?

# %%
with jax.default_device(DEVICES[0]):  # the one-device reference, on the meshes' kind of device
    want = [r.generated_ids for r in jaxlab.Generator(tiny).generate(prompts8, 8, ignore_eos=True)]
runs, rows = {}, []
for strategy in STRATEGIES:
    runs[strategy] = sm = sharding.shard(tiny, None, strategy, devices=DEVICES)  # None: a mesh fitted to the devices
    got = sm.generate(prompts8, 8, ignore_eos=True, prefill=False)
    info = parallel.decode_step_info(sm, len(prompts8))  # the very program that just ran
    rows.append({"strategy": strategy, "mesh": format_mesh(sm.shape), "tokens == one device": got == want,
                 "all-reduces / step": info.collectives["all-reduce"],
                 "other collectives": info.total_collectives - info.collectives["all-reduce"],
                 "bytes all-reduced / step": info.total_bytes})
_ = table(rows, title=f"tiny model ({tiny.config.n_layers} layers), 8 prompts, 8 new tokens")

# %% [markdown]
# Data parallel needs no communication at all: each device runs its rows with all the weights. Every
# head-splitting strategy has exactly **two all-reduces per layer**, the two row-parallel matmuls,
# whether the compiler inserted them (`jit`) or we wrote them (`shard_map`). The figure shows where they
# sit in a layer: the matrices that produce heads and hidden units are split by **columns** (each device
# computes whole heads, whole units), the two that consume them by **rows**, so each device's product is
# a partial sum of the full output, and an all-reduce adds the partial sums. The counts in the title are
# read from the compiled program:

# %%
tp = parallel.decode_step_info(runs["tensor"], len(prompts8))
per_layer = tp.collectives["all-reduce"] / tiny.config.n_layers
print(f"tensor, model={runs['tensor'].shape['model']}: {tp.collectives['all-reduce']} all-reduces for "
      f"{tiny.config.n_layers} layers, {tp.total_collectives - tp.collectives['all-reduce']} other collectives")
fig = parallel.plot_tensor_parallel(runs["tensor"].shape["model"], per_layer, tiny.config.n_layers,
                                    tp.collectives["all-reduce"])
plt.show()

# %% [markdown]
# The hook where the two all-reduces go is in the model's decoder block itself: `reduce` is the identity
# on one device and `psum` over `model` under tensor parallelism.

# %% tags=["nbval-ignore-output"]
_ = show_source(Block.__call__)

# %% [markdown]
# One line of the compiled HLO: an all-reduce over the `model` groups (`replica_groups` lists which
# devices add their partial sums together).

# %% tags=["nbval-ignore-output"]
print(next(line.strip()[:240] for line in tp.hlo.splitlines() if " all-reduce(" in line))

# %% [markdown]
# ### Does the softmax need synchronization?
#
# The article says it does. Under tensor parallelism the decode step above has no collective besides
# the two of `wo` and `w_down`: a device owns whole heads, and a head's softmax runs over its own scores.
# The softmax needs a collective only when one softmax *row* (one query's scores over the cache) is
# spread over devices, as in **sequence parallelism**, where each device holds a block of the cache's
# slots (ring attention splits long contexts this way). Here is one attention step, written plainly:

# %% tags=["nbval-ignore-output"]
_ = show_source(parallel.softmax_attention)

# %% [markdown]
# **Predict first:** compiled with its 8 heads split over 8 devices, and then with its 256 cache slots
# split over 8 devices, how many collectives does each program need, and what does each one compute?

# %%
attention_mesh = make_mesh({"data": 1, "model": N}, DEVICES)
by_heads = parallel.attention_collectives(attention_mesh, "heads")
by_sequence = parallel.attention_collectives(attention_mesh, "sequence")
for name, info in [("heads split", by_heads), ("sequence split", by_sequence)]:
    print(f"{name}: {info.total_collectives} collectives",
          [f"all-reduce of {shape} with {op}" for shape, op in parallel.all_reduce_ops(info.hlo)])
_ = verdict("softmax_needs_synchronization", {
    "whole heads: decode step, besides wo's and w_down's": (tp.total_collectives - 2 * tiny.config.n_layers)
    / tiny.config.n_layers,
    "whole heads per device: one attention step": by_heads.total_collectives,
    "cache slots split: one attention step": by_sequence.total_collectives,
}, "with the sequence split, the softmax's max and sum and the weighted sum of values are each all-reduced")

# %% [markdown]
# ### The real model
#
# Now SmolLM2-135M itself on the 2-D mesh (rows over `data`, heads over `model`; 3 KV heads padded to
# a multiple of `model`), on two golden prompts. The tokens must be the golden ones, which the
# single-device `Generator` reproduces (tests check every strategy on the real model this way).

# %%
golden = load_golden()["prompts"][:2]
real = sharding.shard(m.params, None, "data+tensor", devices=DEVICES)
ids = real.generate([g["prompt_ids"] for g in golden], 8, ignore_eos=True, prefill=False)
_ = check("real model on the 2-D mesh: golden greedy tokens", ids == [g["greedy_ids"][:8] for g in golden],
          f"mesh {format_mesh(real.shape)}, {real.config.n_kv_heads} KV heads after padding")
for g, row in zip(golden, real.prompt_logits()):
    print(compare_logits(row, g["last_logits"], rtol=agreement_rtol(m.params))[1])  # 1e-4 in float32, 3e-2 in bfloat16
for g, row in zip(golden, ids):
    print(repr(g["prompt"]), "->", repr(m.tokenizer.decode(row)))
real_info = parallel.decode_step_info(real, 2)
print("decode step:", real_info.collectives["all-reduce"], "all-reduces for", cfg.n_layers, "layers,",
      f"{real_info.total_bytes:,} bytes per device")

# %% [markdown]
# ## 4 · Tensor parallelism by hand: `shard_map`
#
# With `jit` we only said where the arrays live. `shard_map` is the other way round: we write the
# program **one device** runs, on its local blocks, and say where the collectives go. There is no
# second copy of the model for it: the per-device program of `jaxlab.engine.sharding` is the model's
# own `forward`, built for the local sizes (12/4 = 3 query heads, 1 KV head, 1536/4 MLP units on
# `model=4`) and given the `reduce` hook shown above, here `psum` over `model`. In outline (the full
# version, with the cache's layout and the specs, is `Sharded` in `jaxlab/engine/sharding.py`):
#
# ```python
# psum = functools.partial(jax.lax.psum, axis_name="model")
#
# def step_on_device(local_params, tokens, positions, cache):   # this device's heads and MLP units
#     return greedy_step(local_params, tokens, positions, cache, reduce=psum)
#
# decode = jax.jit(jax.shard_map(step_on_device, mesh=mesh, in_specs=(param_specs, row, row, cache_specs),
#                                out_specs=(row, row, cache_specs)))
# # inside forward, for every layer:
# #     x = x + reduce(attn(attn_norm(x)))   # all-reduce 1: wo's partial sums
# #     x = x + reduce(mlp(mlp_norm(x)))     # all-reduce 2: w_down's
# ```
#
# The specs are the same `PartitionSpec`s the rules give. Same tokens, same two all-reduces per layer
# (the table above): `shard_map` is what you reach for when you want to *control* the communication
# (overlap it with compute, use a different collective) rather than leave it to the partitioner. On one
# device `reduce` is the identity; and since this is the model's one forward pass, quantized weights and
# the int8 KV cache run sharded unchanged (the tests check both against one device).
#
# ## 5 · What communication costs
#
# Per decode step, a device reads its weights and its KV cache from memory, and (when heads are split)
# all-reduces two activations per layer. All three are determined by shapes, so we can work them out
# for the real model and a batch of 8 without running anything.
#
# **Predict first:** tensor parallel on `model=8` splits the weights eight ways. Does each device hold
# an eighth of the 538 MB?

# %%
rows = []
for strategy, shape in [("one device", {"data": 1, "model": 1}), ("data", fit_mesh("data")),
                        ("tensor", fit_mesh("tensor")), ("data+tensor", fit_mesh("data+tensor"))]:
    b = parallel.bytes_per_device(cfg, shape, "data" if strategy == "one device" else strategy, batch=8, cache_len=256)
    rows.append({"strategy": strategy, "mesh": format_mesh(shape), "weights MB": b["weights"] / 1e6,
                 "KV cache MB": b["kv_cache"] / 1e6, "all-reduced kB / step": b["all_reduce_per_step"] / 1e3})
_ = table(rows, title="SmolLM2-135M, float32, batch 8, 256 cache slots, per device")

# %% [markdown]
# Then what it costs here. On this machine the devices are simulated, so these times say little about
# parallel speed (all devices share the same cores): read them as the fixed cost of running a
# collective, and of one decode step under each strategy.

# %% tags=["nbval-ignore-output"]
ar = parallel.time_all_reduce(make_mesh({"data": 1, "model": N}, DEVICES), shape=(1, 1, cfg.dim))
rows = [{"what": f"one all-reduce of [1, 1, {cfg.dim}] float32 over model={N}", "median ms": 1e3 * float(np.median(ar))}]
for strategy, sm in runs.items():
    t = parallel.time_decode_step(sm, len(prompts8))
    rows.append({"what": f"tiny decode step, {strategy} ({format_mesh(sm.shape)})", "median ms": 1e3 * float(np.median(t))})
t = parallel.time_decode_step(real, 2)
rows.append({"what": f"SmolLM2 decode step, data+tensor ({format_mesh(real.shape)})", "median ms": 1e3 * float(np.median(t))})
_ = table(rows, title=f"measured on {MESH.platform} ({N} devices{', simulated' if MESH.simulated and jax.default_backend() != 'cpu' else ''})")

# %% [markdown]
# The article's warning is about the other communication: the collectives inside the step. How much of the real
# model's tensor-parallel step do its all-reduces take? `parallel.all_reduce_share` counts them in the compiled
# step, times one of them alone (the same bytes over `model`) and the step whole. **Predict first:** 60
# all-reduces of a few kB each; a tenth of the step, half, or more?

# %% tags=["nbval-ignore-output"]
share = parallel.all_reduce_share(real, 2)
print(f"{share['all_reduces']} all-reduces x {share['all_reduce_s'] * 1e3:.3f} ms against a "
      f"{share['step_s'] * 1e3:.1f} ms step (mesh {format_mesh(real.shape)}, 2 rows)")
_ = verdict("pmap_overhead_bottleneck", 100 * share["share"],
            f"on {N} {'simulated ' if MESH.simulated else ''}{MESH.platform} devices each all-reduce costs "
            f"{share['all_reduce_s'] * 1e6:.0f} us against a step of {share['step_s'] * 1e3:.1f} ms; on chips the "
            "step shrinks to microseconds while the latency stays (the arithmetic below), which is where the warning "
            "bites: a small model split over many chips")

# %% [markdown]
# On a CPU these numbers are small and noisy; what a TPU prints differs in kind, not just in size.
# On a multi-chip TPU (a Kaggle TPU v5e-8 notebook, or a TPU VM; a free Colab TPU is one chip, so
# there the meshes are simulated as here) the devices are separate chips, each with its own memory
# bandwidth, joined by a dedicated interconnect. Then:
#
# - **data parallel** multiplies throughput (tokens per second over all rows) by the device count and
#   costs no communication, but each chip still reads *all* the weights per step, so the time per
#   token does not improve. It needs a batch that fills every device and a model that fits on one.
# - **tensor parallel** divides the weights each chip reads per step (decode is memory-bound: the
#   weight reads *are* the step time), at the price of 2 all-reduces per layer per token, 60 for
#   SmolLM2. An all-reduce this small costs a fixed latency, whatever its size. So, per token, it
#   saves (weights - weights per device) / memory bandwidth and adds 60 x (all-reduce latency): put in
#   your chip's two numbers. The saving grows with the model; the added latency does not, which is why
#   tensor parallelism is the tool for models of billions of parameters and a questionable one for
#   135 million. The table above also shows two honest taxes: the replicated
#   embedding (a fifth of the model, but most of what each device holds on `model=8`) and the padded
#   KV heads, which make each device's cache on `model=8` larger than an even eighth.
# - **both at once** is how large models are served: tensor parallel inside a group of chips with a
#   fast interconnect, data parallel across groups, a mesh axis for each.
#
# The collectives, unlike the speed, need no chip: notebook 16 compiles this tensor-parallel decode step for a real v5e-8 (eight chips) with libtpu, the TPU compiler, on this CPU, and its program holds the same two all-reduces per layer as the simulated one here.
#
# So the article's claim holds in one sense (section 2: pmap splits the work and stays correct), and the
# other sense, more speed when one device is not enough, needs real devices:

# %% tags=["nbval-ignore-output"]
if MESH.simulated or N < 2:
    _ = unmeasured("pmap_helps_when_one_device_is_not_enough",
                   f"the {N} devices here are simulated on one CPU's cores, so a speed-up would measure how XLA "
                   "shares those cores, not more devices (the table above gives what each device saves and pays)")
else:
    _ = verdict("pmap_helps_when_one_device_is_not_enough", parallel.data_parallel_gain(m.params, DEVICES, batch=N),
                f"SmolLM2's decode step under jax.pmap, one row per device on {N} {MESH.platform} devices, against "
                f"the same {N} rows on one")

# %% [markdown]
# ## 6 · Two processes, one mesh
#
# A TPU pod slice is several hosts, each with a few chips, running **the same Python program**.
# `jax.distributed.initialize()` connects them; after it, `jax.devices()` lists every chip of every host,
# `jax.local_devices()` this host's, and a mesh over `jax.devices()` is global. Each process holds only
# its own devices' blocks (inputs are built with `jax.make_array_from_callback`), every process runs
# the same jitted program, and the collectives cross hosts.
#
# `distributed.run` does exactly that on this machine: it starts 2 Python processes with 2 simulated
# CPU devices each, a coordinator on `127.0.0.1`, CPU collectives over gloo, and a global mesh
# `data=2,model=2` (rows split across the processes, heads inside each). Each process calls the same
# `sharding.shard_generate` as above and reports what it sees:

# %%
reports = distributed.run(num_processes=2, local_devices=2, mesh="data=2,model=2", model="tiny",
                          prompts=prompts8, max_new_tokens=8, prefill=False)
for r in reports:
    print(f"process {r['process_id']} of {r['process_count']}: {r['device_count']} devices "
          f"({r['local_device_count']} local), mesh {r['mesh']}")
_ = check("two processes generate what one process does", all(r["tokens"] == want for r in reports))


# %% [markdown]
# To launch it by hand, start the same command in two terminals (or with `&`), changing only the id:
#
# ```bash
# XLA_FLAGS=--xla_force_host_platform_device_count=2 python -m jaxlab.distributed \
#     --process-id 0 --num-processes 2 --port 12355 --mesh data=2,model=2
# XLA_FLAGS=--xla_force_host_platform_device_count=2 python -m jaxlab.distributed \
#     --process-id 1 --num-processes 2 --port 12355 --mesh data=2,model=2
# ```
#
# On real chips: one host with 8 chips (a Kaggle notebook with the TPU v5e-8 accelerator, or a v5e-8
# TPU VM) runs this whole notebook on them, no simulation. A TPU pod slice has several hosts: install
# `jax[tpu]` (the version jaxlab pins; a CPU-only jax would run each host on its CPU) and jaxlab on every
# worker, then start the same program on all of them at once. There `jax.distributed.initialize()` finds
# the coordinator, the process count and its own id by itself (`--pod` asks for that, checks that jax
# found the TPU, and fits the mesh to every chip of every host):
#
# ```bash
# gcloud compute tpus tpu-vm ssh MY_TPU --zone=ZONE --worker=all \
#     --command="pip install 'jax[tpu]==0.10.2' 'jaxlab @ git+https://github.com/jaxlab/jaxlab@v0.1.0'"
# gcloud compute tpus tpu-vm ssh MY_TPU --zone=ZONE --worker=all \
#     --command="python -m jaxlab.distributed --pod --mesh data=2,model=4"
# ```
#
# Two rules keep a multi-process program correct: every process must run the same jitted programs in
# the same order (a process that skips one leaves the others waiting in a collective), and only
# arrays a process can address may be read on it (`multihost_utils.process_allgather` gathers the rest).
#
# ## 7 · When each strategy pays off
#
# | strategy | splits | communication per token | pays off when |
# |---|---|---|---|
# | data | rows (and their cache) | none | many concurrent requests; the model fits on one device |
# | tensor | heads, MLP units, KV heads | 2 all-reduces per layer | the model is too big for one device, or per-token latency matters and the devices have a fast interconnect |
# | data + tensor | both | 2 all-reduces per layer, inside each `model` group | large models *and* large batches: tensor inside a host, data across hosts |
#
# ## Summary
#
# - A mesh names the device axes; a `PartitionSpec` per array says which axis splits which dimension, and
#   a strategy is only a mapping from the model's logical axes to mesh axes.
# - `pmap` needs `in_axes=None` for the parameters and a leading device axis; it split the batch over every
#   device correctly here, and copied an unplaced 113 MB argument on every call (the overhead the article
#   warns of), which placing it once removes. `jit` with shardings and `shard_map` are its modern forms.
# - Data, tensor and both at once gave the one-device tokens; the compiled tensor-parallel step has exactly
#   two all-reduces per layer, after the row-parallel `wo` and `w_down`.
# - The softmax needs no collective while each device owns whole heads; split a softmax row (the cache's
#   sequence axis) and its max, its sum and the weighted values are all-reduced.
# - Simulated devices show correctness, collectives and bytes, not speed: tensor parallelism trades each
#   device's weight reads for 60 small all-reduces per token on SmolLM2.
# - The article's overhead warning, timed: the 60 all-reduces' share of SmolLM2's tensor-parallel step (the
#   verdict gives it for these devices); on chips the step shrinks and their latency stays, so it grows.
#
# **Quiz**
#
# 1. Why does `jax.pmap(f)(params, tokens, positions)` fail, and what does `in_axes=(None, 0, 0)` change?
#    <details><summary>Answer</summary>pmap maps every argument over its leading axis, which must have one
#    entry per device; the parameters have no such axis. `None` broadcasts them (a full copy per device)
#    and maps only the inputs, reshaped to `[devices, rows per device, T]`.</details>
# 2. Why are `wq`, `wk`, `wv` split by columns but `wo` by rows, and what does that cost per layer?
#    <details><summary>Answer</summary>Column blocks of `wq`/`wk`/`wv` give each device whole heads, which it
#    can attend with alone. `wo` consumes those heads, so it is split by the rows that meet them: each device's
#    product is a partial sum of the full output, and one all-reduce adds them. The MLP does the same, so two
#    all-reduces per layer.</details>
# 3. When does the softmax need a collective?
#    <details><summary>Answer</summary>When one softmax row, a query's scores over the cache, is spread over
#    devices (sequence parallelism): the row's max and sum, and the weighted sum of values, must be combined
#    across devices. With whole heads per device it needs none.</details>
# 4. On `model=8`, why does each device hold more than an eighth of the weights?
#    <details><summary>Answer</summary>The embedding (a fifth of the model) is replicated, and the 3 KV heads
#    are padded to 8 (with their zero query heads), so each device holds its share of a bigger model plus the
#    whole embedding.</details>
#
# ## Exercises
#
# Solutions are in `notebooks/solutions/08_parallelism.py`.
#
# **1. Logical axes to a `PartitionSpec`.** Write `my_partition_spec(logical_axes, rules)`: each logical
# axis becomes the mesh axis `rules` maps it to, or `None` when there is no rule (compare
# `logical_to_spec`).

# %%
def my_partition_spec(logical_axes, rules):
    raise NotImplementedError


from jaxlab.lab.exercises import nb08

passed = nb08.check_partition_spec(my_partition_spec)


# %% [markdown]
# **2. Tensor-parallel MLP, by hand.** Split the SwiGLU MLP's `F` hidden units into `n` contiguous blocks,
# one per device. Write `my_tp_mlp_partials(x, w_gate, w_up, w_down, n)` (numpy; `x` is `[T, D]`) returning
# `[n, T, D]`: what each device holds *before* the all-reduce (its columns of `w_gate` and `w_up`, its
# rows of `w_down`). Their sum is the MLP's output: that sum is the all-reduce.

# %%
def my_tp_mlp_partials(x, w_gate, w_up, w_down, n):
    raise NotImplementedError


passed = nb08.check_tp_mlp_partials(my_tp_mlp_partials)


# %% [markdown]
# **3. Pad the heads.** Write `my_pad_heads(wq, wk, wv, wo, n_heads, n_kv_heads, head_dim, model)` returning
# the four matrices with zero KV heads appended until `model` divides their number, each with its group
# of `n_heads // n_kv_heads` zero query heads (columns of `wq`, `wk`, `wv`; rows of `wo`).

# %%
def my_pad_heads(wq, wk, wv, wo, n_heads, n_kv_heads, head_dim, model):
    raise NotImplementedError


passed = nb08.check_pad_heads(my_pad_heads)

# %% [markdown]
# **An experiment of your own.** Split the embedding over `vocab` as well (the tensor strategy's rules plus
# `"vocab": "model"`, passed as `rules=` to `sharding.shard`), check that the tokens do not change, and count
# the collectives of its decode step again with `parallel.decode_step_info`: which new collective appears, and
# how many bytes does it move per token? Then make the attention step above longer (`seq=4096`) and see whether
# the number of collectives or only their bytes change.
