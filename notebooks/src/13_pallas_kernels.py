# %% [markdown]
# # 13 · Pallas kernels: flash attention and paged decode, by hand
#
# *About 45 minutes.* Every notebook so far wrote attention as `jnp` operations and let XLA compile them. The
# fourth seed text says where the speed of a JAX engine comes from today: "pure JAX implementations ... before
# later Pallas kernels optimized them", and Google keeps "JAX and Pallas for kernels". Pallas is JAX's kernel
# language: you write what **one block** of the work does, and say how the arrays are cut into blocks. Here we go
# from a ten-line kernel to the two attention kernels the engine can run (`Policy(attention="pallas")`,
# `jaxlab generate --attention pallas`): flash attention over the contiguous cache and ragged paged attention
# over the page pool. On this CPU they run in *interpret mode*, a simulator: right numbers, no speed.
#
# **Learning goals**
#
# - Read a Pallas kernel: the grid, `BlockSpec`s and their index maps, refs, and what runs where on a TPU, a GPU
#   and in interpret mode.
# - Check the online softmax block by block, and see which blocks flash attention skips.
# - Follow a paged decode kernel through its page table, and see what a production kernel demands of its inputs.
# - Lower one kernel for a TPU and for a GPU from a CPU, and know which rules each chip imposes on block shapes.
# - Switch the model to the kernels and check its greedy tokens do not change.
#
# Links: [Pallas quickstart](https://docs.jax.dev/en/latest/pallas/quickstart.html) ·
# [grids and BlockSpecs](https://docs.jax.dev/en/latest/pallas/grid_blockspec.html) ·
# [Pallas on TPU](https://docs.jax.dev/en/latest/pallas/tpu/details.html) ·
# [TPU pipelining](https://docs.jax.dev/en/latest/pallas/tpu/pipelining.html) ·
# [scalar prefetch](https://docs.jax.dev/en/latest/pallas/tpu/sparse.html) ·
# [Triton](https://triton-lang.org/main/index.html) ·
# [FlashAttention (Dao et al.)](https://arxiv.org/abs/2205.14135) ·
# [PagedAttention / vLLM (Kwon et al.)](https://arxiv.org/abs/2309.06180)

# %% tags=["nbval-ignore-output"]
import functools

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from jax.experimental import pallas as pl

from jaxlab.engine import kernels
from jaxlab.engine.kernels import common, flash, rmsnorm
from jaxlab.engine.kernels.paged_attention import paged_kernel_gpu
from jaxlab.lab import pallas as lp
from jaxlab.lab.notebook import check, setup, show_source, table, unmeasured, verdict
from jaxlab.tools.profile import time_fn

setup()
print("backend:", jax.default_backend(), "| kernel variant, interpret mode:", kernels.variant_for())


# %% [markdown]
# ## 1 · A kernel from first principles
#
# `pl.pallas_call(kernel, grid, in_specs, out_specs, out_shape)` runs `kernel` once per point of the **grid**.
# Each `BlockSpec(block_shape, index_map)` says which block of an array a grid point sees: `index_map(i, ...)`
# returns the block's index (in blocks, not elements). The kernel receives **refs**: views of its blocks in fast
# memory, read with `x_ref[...]` and written with `o_ref[...] = ...`. Here is the smallest useful kernel: add two
# arrays, 8 rows a grid point.

# %%
def add_kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] + y_ref[...]  # one block of 8 rows: read, add, write


def add(x, y, rows=8):
    spec = pl.BlockSpec((rows, x.shape[1]), lambda i: (i, 0))  # grid point i sees rows 8i .. 8i+7
    return pl.pallas_call(
        add_kernel, grid=(x.shape[0] // rows,), in_specs=[spec, spec], out_specs=spec,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=True,
    )(x, y)  # fmt: skip


x = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)
_ = check("the add kernel equals x + y", bool((add(x, 2 * x) == 3 * x).all()), "grid of 4 blocks of 8 x 128")

# %% [markdown]
# The engine's first kernel is RMSNorm: one block of rows per grid point, the weight's single block shared by
# every grid point (its index map always returns (0, 0)). It computes in float32 and writes its block:

# %% tags=["nbval-ignore-output"]
_ = show_source(rmsnorm.rms_norm_kernel)
_ = show_source(rmsnorm.rms_norm, skip_docstring=True)

# %%
rng = np.random.default_rng(0)
xs = jnp.asarray(rng.normal(size=(256, 576)), jnp.float32)
w = jnp.asarray(rng.normal(size=576), jnp.float32)


@jax.jit
def rms_xla(x, w, eps=1e-5):  # the same formula as jnp operations: XLA fuses it
    return w * x * jax.lax.rsqrt(jnp.mean(x * x, axis=1, keepdims=True) + eps)


rms_pallas = jax.jit(functools.partial(kernels.rms_norm, block_rows=8))
_ = check("rms_norm (Pallas) equals the jnp formula", float(jnp.abs(rms_pallas(xs, w) - rms_xla(xs, w)).max()) < 1e-5,
          "256 rows x 576, 32 grid points")  # fmt: skip

# %% [markdown]
# ### What runs where
#
# | | TPU (Mosaic) | GPU (Triton) | interpret mode (here) |
# |---|---|---|---|
# | a grid point is | one step of a **sequential** loop on the core (the leading grid axes may be marked parallel, which splits them across the two TensorCores of a v4 or v5p chip; a v5e or v6e chip has one) | one *program*, all running **at once** on the SMs | one step of a `while` loop of ordinary JAX operations on the host device |
# | blocks live in | VMEM (the core's on-chip memory: 128 MiB on a v5e, of which a kernel may use a smaller default limit, raised with `vmem_limit_bytes`), copied from HBM by a pipeline the grid drives (the next block's copy overlaps this block's compute) | registers / shared memory; the kernel loads from HBM itself | ordinary arrays: each block is a dynamic slice, copied |
# | small integer tables | *scalar prefetch*: in SMEM before the grid starts, readable by index maps | ordinary inputs, loaded as scalars | arrays |
# | block shape rules | last two dimensions multiples of (8, 128), or the whole dimension; matmuls on the MXU's 128 x 128 (256 x 256 on v6e) tiles | every block and value a power of two; `tl.dot` needs at least 16 | none: anything JAX can slice |
# | a reduction over blocks | across the sequential grid axis, state in VMEM scratch | a loop **inside** the kernel (no grid axis is sequential) | either |
#
# Interpret mode checks the logic anywhere. **Predict first:** the jitted Pallas RMSNorm above is 32 grid points
# of the same arithmetic XLA fuses into one loop. How many times slower than the jitted `jnp` formula is it here?

# %% tags=["nbval-ignore-output"]
t_pallas, t_xla = time_fn(rms_pallas, xs, w, repeats=3).min, time_fn(rms_xla, xs, w, repeats=3).min
t_eager = time_fn(functools.partial(kernels.rms_norm, block_rows=8), xs, w, repeats=1, warmup=0).min
interpret_ratio = t_pallas / t_xla
_ = table([{"RMSNorm, 256 x 576": "jnp formula, jitted", "ms": t_xla * 1e3},
           {"RMSNorm, 256 x 576": "Pallas, interpret mode, jitted", "ms": t_pallas * 1e3},
           {"RMSNorm, 256 x 576": "Pallas, interpret mode, not jitted", "ms": t_eager * 1e3}],
          title=f"interpret mode: {interpret_ratio:.0f}x the jnp formula's time here")  # fmt: skip

# %% [markdown]
# Why so slow: interpret mode turns the grid into a loop, and each step slices its blocks out of the arrays
# (copies), runs the body as separate small operations, and writes the output block back with a dynamic update.
# XLA cannot fuse across steps, and on a CPU there is no VMEM, no MXU and no DMA engine to imitate fast. Not
# jitted, every one of those small operations is also dispatched from Python, one by one. A simulator: use it
# for correctness, never for timing.
#
# ## 2 · The online softmax, block by block
#
# Attention's softmax over S keys seems to need all S scores at once (its maximum, its sum). Flash attention
# reads keys a block at a time and keeps three running quantities per query: the maximum `m` of the scores so
# far, the sum `l` of `exp(s - m)` and the unnormalised output `acc = Σ exp(s - m) v`. When a block raises the
# maximum from `m` to `m'`, everything so far is rescaled by `exp(m - m')`; masked keys add nothing. This is the
# whole trick, `online_softmax` in `jaxlab/engine/kernels/common.py` (the XLA path over pages folds its
# blocks with it too); `online_update` gives it one block's scores and mask, as the kernels do:

# %% tags=["nbval-ignore-output"]
_ = show_source(common.online_softmax, skip_docstring=True)
_ = show_source(common.online_update, skip_docstring=True)

# %% [markdown]
# **Predict first:** after each block, is `acc / l` already the softmax-weighted average of the values seen so
# far, or only after the last block? Below, one query, 40 keys, blocks of 16 (the last block is partial):

# %% tags=["nbval-ignore-output"]
q1, k1, v1 = rng.normal(size=16), rng.normal(size=(40, 16)) * 2, rng.normal(size=(40, 16))
steps, out1 = lp.online_softmax_steps(q1, k1, v1, block=16)
_ = table(steps, title="the running state after each block (one query)")

# %%
_ = check(
    "the running max is the max of the scores seen so far",
    all(abs(r["running max m"] - r["max score so far"]) < 1e-5 for r in steps),
)
_ = check(
    "the running sum is Σ exp(s - m) over the keys seen so far",
    all(abs(r["running sum"] - r["sum of exp(s - m)"]) < 1e-4 for r in steps),
)
_ = check("acc / sum is the softmax average after every block", all(r["|acc/sum - softmax·v|"] < 1e-5 for r in steps))  # fmt: skip

# %% [markdown]
# ## 3 · Flash attention over the contiguous cache
#
# The kernel of `jaxlab/engine/kernels/flash.py`: grid (problems, query blocks); each grid point holds one block
# of queries and **loops inside the kernel** over key blocks with `online_update`, so the [Q, S] score matrix never
# exists. The loop runs only from the first to the last key block any of its queries can see (`bounds`, computed
# before the kernel by `key_block_bounds`): causal prefill skips the blocks above the diagonal, left padding skips
# the empty slots. The same rule as the model: a query at position p sees keys at positions 0..p, -1 is padding.

# %% tags=["nbval-ignore-output"]
_ = show_source(flash.flash_kernel)

# %% [markdown]
# **Predict first:** a causal prefill of 64 tokens in blocks of 16 queries x 16 keys is a 4 x 4 grid of blocks.
# How many does the kernel visit? And when the first 20 slots are left padding?

# %% tags=["nbval-ignore-output"]
pos = np.arange(64)
padded = np.concatenate([-np.ones(20, int), np.arange(44)])
fig, axes = plt.subplots(1, 2, figsize=(9, 4.2))
lp.plot_flash_blocks(pos, pos, 16, 16, ax=axes[0])
lp.plot_flash_blocks(padded, padded, 16, 16, ax=axes[1])
axes[0].set_title(f"causal prefill: {lp.visited_key_blocks(pos, pos, 16, 16).sum()} of 16 blocks visited", fontsize=10)
axes[1].set_title(f"20 slots of left padding: {lp.visited_key_blocks(padded, padded, 16, 16).sum()} of 16", fontsize=10)
fig.suptitle("Flash attention: grey = visible key, blue = a key block the query block's loop visits")
plt.tight_layout()
plt.show()

# %%
_ = check("causal prefill visits 10 of 16 blocks", int(lp.visited_key_blocks(pos, pos, 16, 16).sum()) == 10)
_ = check("with 20 slots of padding, 6 of 16", int(lp.visited_key_blocks(padded, padded, 16, 16).sum()) == 6)

# %% [markdown]
# Now the kernel itself against the model's formula (scores, mask, softmax, values: what XLA compiles), on a
# batch of 2 sequences x 3 KV heads (6 problems), 48 queries over a cache of 80 slots, left-padded:

# %%
xla_attention = common.reference_attention  # the baseline jaxlab bench --kernels times too
_ = show_source(xla_attention, skip_docstring=True)

n, t, s_len, d = 6, 48, 80, 64
pad = np.repeat([5, 17], 3)[:, None]  # two sequences, left padding 5 and 17, 3 KV heads each
k_pos = jnp.asarray(np.where(np.arange(s_len) >= pad, np.arange(s_len) - pad, -1), jnp.int32)
q_pos = k_pos[:, -t:]  # a prefill: the queries are the last 48 tokens written
qf, kf, vf = (jnp.asarray(rng.normal(size=(n, m, d)), jnp.float32) for m in (t, s_len, s_len))
got = kernels.flash_attention(qf, kf, vf, q_pos, k_pos, block_q=16, block_k=16)
diff_flash = float(jnp.abs(got - xla_attention(qf, kf, vf, q_pos, k_pos)).max())
_ = check("flash attention (Pallas) equals the XLA formula", diff_flash < 1e-5, "6 problems, 48 x 80, blocks 16 x 16")

# %% [markdown]
# ## 4 · Paged decode: each row reads its own pages
#
# The continuous engine of notebook 11 keeps K and V in a pool of pages, and a page table per sequence. The
# ragged paged kernel (`jaxlab/engine/kernels/paged_attention.py`) reads, for each row, only its first
# `max(position) // page_size + 1` pages, whatever the table's width. Two variants of one idea:
#
# - **TPU**: grid (rows, KV heads, pages). The page table and the page counts are *scalar-prefetched* into SMEM,
#   so the K/V `BlockSpec` index maps read `page_table[b, j]` and the pipeline copies exactly that page into VMEM.
#   The running `m`, `l`, `acc` live in VMEM scratch across the page axis, initialised at page 0 and written out at
#   the last page (`pl.when`).
# - **GPU**: grid (rows, KV heads); the pool stays in HBM and the kernel loops over the row's pages, loading each.

# %% tags=["nbval-ignore-output"]
_ = show_source(paged_kernel_gpu)

# %% [markdown]
# Four sequences of different lengths (one idle: position -1) over a pool of 16 pages of 8 tokens, 3 KV heads
# with 3 query heads each (SmolLM2's grouping), decode (one new token a row):

# %%
from jaxlab.engine.model import Policy, matmul
from jaxlab.engine.paged import PagedLayer, read_pages

KVH, G, D, PS, NUM_PAGES = 3, 3, 64, 8, 16
k_pages, v_pages = (jnp.asarray(rng.normal(size=(KVH, NUM_PAGES, PS, D)), jnp.float32) for _ in range(2))
page_table = jnp.asarray([[3, 7, 1, 12], [5, 2, 0, 0], [9, 0, 0, 0], [4, 6, 8, 10]], jnp.int32)
positions = jnp.asarray([[20], [10], [-1], [29]], jnp.int32)  # one new token each; row 2 is idle
q5 = jnp.asarray(rng.normal(size=(4, 1, KVH, G, D)), jnp.float32)  # [B, T, KVH, G, D], as the model holds it
want = read_pages(
    q5, PagedLayer(k_pages, v_pages, page_table), positions, lambda spec, a, b: matmul(spec, a, b, Policy())
)
qn = q5.transpose(0, 2, 3, 1, 4).reshape(4, KVH, G, D)  # the kernel's layout [B, KVH, G*T, D]
diff_paged = {}
for variant in ("gpu", "tpu"):
    out = kernels.paged_attention(
        qn, k_pages, v_pages, page_table, jnp.tile(positions, (1, G)), variant=variant, interpret=True
    )
    diff_paged[variant] = float(jnp.abs(out.reshape(4, 1, -1) - want)[np.asarray(positions)[:, 0] >= 0].max())
    _ = check(f"paged attention ({variant.upper()} variant, interpreted) equals the engine's XLA paged attention", diff_paged[variant] < 1e-5)  # fmt: skip

# %% tags=["nbval-ignore-output"]
fig = lp.plot_paged_reads(page_table, positions, PS, NUM_PAGES)
plt.show()
print("pages read, per row:", lp.paged_reads(page_table, positions, PS))

# %% [markdown]
# ### The production kernel JAX ships
#
# vLLM-TPU and SGLang-JAX run `jax.experimental.pallas.ops.tpu.ragged_paged_attention`. Fed our cache
# (`jaxlab/lab/pallas.py` builds its inputs), it wants all sequences' queries concatenated, K and V interleaved in
# one page array, explicit block sizes, and shapes the TPU tiles. **Predict first:** does it lower for a TPU on
# SmolLM2's shapes (3 KV heads, head dimension 64) as they are?

# %%
lengths = np.maximum(np.asarray(positions)[:, 0] + 1, 1)  # tokens per sequence (the idle row: 1)
for pads in ({"pad_kv_heads": 0, "pad_head_dim": 0}, {"pad_kv_heads": 1, "pad_head_dim": 0}, {}):
    shown = pads or {"pad_kv_heads": lp.PAD_KV_HEADS, "pad_head_dim": lp.PAD_HEAD_DIM}
    print(f"KV heads {KVH}+{shown['pad_kv_heads']}, head dim {D}+{shown['pad_head_dim']}:",
          lp.jax_ragged_lowering(qn, k_pages, v_pages, page_table, lengths, **pads))  # fmt: skip
ref = lp.jax_ragged_reference(qn, k_pages, v_pages, page_table, lengths)
ours = kernels.paged_attention(qn, k_pages, v_pages, page_table, jnp.tile(positions, (1, G)))
busy = np.asarray(positions)[:, 0] >= 0
_ = check("its shipped reference equals our kernel on the padded shapes", float(jnp.abs(ref - ours)[busy].max()) < 1e-5)

# %% [markdown]
# Padded to 4 KV heads (6 combined K/V heads "can not be XLA fully tiled") and to head dimension 128 (64 fails an
# assertion), it lowers: padding costs a third more KV memory and twice the head dimension's bandwidth on this
# model. Running the shipped kernel in TPU interpret mode on this CPU (`lp.jax_ragged_interpret`) failed, measured
# on 2026-12-02 with jax 0.10.2, inside the interpreter: `AttributeError: 'ReshapeTransform' object has no
# attribute 'indices'`. Its pure-JAX reference is what we compare with here.
#
# ## 5 · TPU against GPU, and lowering for a chip that is not here
#
# | | TPU variant | GPU (Triton) variant |
# |---|---|---|
# | flash: key blocks | loop inside the kernel; bounds scalar-prefetched into SMEM | loop inside the kernel; bounds an ordinary input |
# | paged: pages | a grid axis, sequential; the page table in SMEM drives the copies | a loop inside the kernel, loading each page from HBM |
# | running m, l, acc | VMEM scratch across grid steps (paged), loop carry (flash) | loop carry in registers |
# | shapes | (8, 128) tiles or whole dimensions | powers of two: at decode, a KV head's 3 query heads padded to 4 rows |
# | compiler | Mosaic (`tpu_custom_call`) | Triton (`__gpu$xla.gpu.triton`) |
#
# Which GPU compiler: jax 0.10's Pallas has two GPU lowerings. **Mosaic GPU** is the default and targets Hopper (H100, H200) and later; **Triton** is chosen by passing Triton's compiler parameters, as these kernels do, and needs compute capability 8.0 (A100) or later. Colab's T4 (7.5) has neither: there `--attention pallas` keeps XLA's attention and a kernel called directly runs in interpret mode, each with a one-sentence note, instead of failing.
#
# Lowering is not compiling: a lowered TPU kernel can still be refused by Mosaic's compiler. `jaxlab compile --chip v5e-1` compiles with libtpu on this CPU; it is how we found that both attention kernels were refused in bfloat16 (a HIGHEST-precision matmul on bfloat16 operands), and why they now use DEFAULT precision below float32. Notebook 16 compiles the three kernels for v5e (one `tpu_custom_call` each) and shows a block shape Mosaic refuses, in its own words.
#
# `kernels.lower(fn, platform, *shapes)` exports a function for a platform from this machine (the TPU lowering asks
# for a device kind, so an abstract TPU v5e stands in). The kernel's custom call in the exported program is proof it
# lowers there:

# %%
shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (qf, kf, vf, q_pos, k_pos)]
for platform, variant, call in (("tpu", "tpu", "tpu_custom_call"), ("cuda", "gpu", "triton")):
    text = kernels.lower(
        lambda *a, v=variant: kernels.flash_attention(*a, variant=v, interpret=False), platform, *shapes
    )
    _ = check(f"flash attention lowers for {platform} ({variant} variant): {call} in the program", call in text)
paged_shapes = [
    jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (qn, k_pages, v_pages, page_table, jnp.tile(positions, (1, G)))
]
for platform, variant, call in (("tpu", "tpu", "tpu_custom_call"), ("cuda", "gpu", "triton")):
    text = kernels.lower(
        lambda *a, v=variant: kernels.paged_attention(*a, variant=v, interpret=False), platform, *paged_shapes
    )
    _ = check(f"paged attention lowers for {platform} ({variant} variant): {call} in the program", call in text)  # fmt: skip

# %% [markdown]
# ## 6 · Plugged into the engine
#
# `with_attention(params, "pallas")` gives the same weights with `Policy(attention="pallas")`: the contiguous
# cache's attention becomes the flash kernel, the paged cache's the paged kernel (the cache layers' `attend` calls
# `pallas_contiguous` in `jaxlab/engine/kvcache.py` and `pallas_paged` in `jaxlab/engine/paged.py`). **Predict
# first:** the kernels sum in a different order from XLA's softmax. Will greedy decoding of SmolLM2 pick the same
# tokens?

# %% tags=["nbval-ignore-output"]
import jaxlab
from jaxlab.engine.generate import Generator
from jaxlab.engine.model import with_attention

m = jaxlab.load()
prompt = m.tokenizer.encode("The capital of France is")
runs = {a: Generator(with_attention(m.params, a), m.tokenizer).generate([prompt], max_new_tokens=5, ignore_eos=True)[0]
        for a in ("xla", "pallas")}  # fmt: skip
for a, r in runs.items():
    print(f"{a:6} -> {r.generated_ids} {r.text!r} (compile {r.compile_seconds:.1f} s)")

# %%
_ = check(
    "greedy tokens identical with the Pallas kernels",
    runs["pallas"].generated_ids == runs["xla"].generated_ids,
    "SmolLM2-135M, 5 tokens",
)

# %% tags=["nbval-ignore-output"]
_ = verdict(
    "pallas_exact_attention",
    {"flash, prefill 48 x 80": diff_flash, "paged decode, GPU variant": diff_paged["gpu"],
     "paged decode, TPU variant": diff_paged["tpu"]},
    because="the online softmax is the softmax, summed in another order; float32 rounding is all that differs",
)  # fmt: skip

# %% [markdown]
# The speed claim needs the chip. On a TPU or GPU (Colab), the cell below times the compiled flash kernel against
# the XLA formula on a causal prefill; on a CPU the kernel can only be simulated, and a simulator's time says
# nothing about the kernel's.

# %% tags=["nbval-ignore-output"]
variant, interpreted = kernels.variant_for()
if interpreted:
    _ = unmeasured(
        "pallas_kernels_faster",
        because=f"on {jax.default_backend().upper()} the kernels run in interpret mode, a simulator ({interpret_ratio:.0f}x "
        "the jnp formula's time for RMSNorm above); only a TPU or GPU can time a compiled kernel",
    )  # fmt: skip
else:
    big = jnp.arange(2048)[None].repeat(8, 0).astype(jnp.int32)
    qb, kb, vb = (jnp.asarray(rng.normal(size=(8, 2048, 64)), jnp.float32) for _ in range(3))
    t_k = time_fn(jax.jit(kernels.flash_attention), qb, kb, vb, big, big, repeats=3).min
    t_x = time_fn(jax.jit(xla_attention), qb, kb, vb, big, big, repeats=3).min
    _ = verdict("pallas_kernels_faster", {f"causal prefill 8 x 2048 x 64 on {variant.upper()}": t_x / t_k},
                because="the kernel skips the masked blocks and never writes the scores to HBM")  # fmt: skip


# %% [markdown]
# ## Summary
#
# - A Pallas kernel is the body of **one block**; the grid and the `BlockSpec` index maps say which block each
#   grid point gets; refs are its view of fast memory.
# - On a TPU the grid is a sequential loop fed by copies into VMEM, small tables can be scalar-prefetched into
#   SMEM, and blocks tile as (8, 128); on a GPU the grid points run at once (reductions loop inside the kernel)
#   and shapes are powers of two. Interpret mode runs the same body anywhere, as a slow simulator.
# - The online softmax keeps a running max, sum and output, rescaling by `exp(m - m')`: after every block it is
#   the exact softmax of the keys seen so far, so flash attention is exact, not an approximation.
# - Causal prefill visits only the blocks on or below the diagonal, and padding blocks not at all; the paged
#   kernel reads only a row's own pages.
# - The model with `attention="pallas"` gives the same greedy tokens; whether the kernels are faster is a
#   question for a TPU or GPU.
#
# **Quiz**
#
# 1. Why does the GPU variant loop over key blocks inside the kernel instead of making them a grid axis?
#    <details><summary>Answer</summary>A GPU runs all grid points at once, as independent programs; nothing
#    carries a running max and sum from one grid point to the next. A TPU's grid is a sequential loop on one
#    core, so state can live in VMEM scratch across the (innermost) grid axis.</details>
# 2. What does scalar prefetch buy the TPU paged kernel?
#    <details><summary>Answer</summary>The page table sits in SMEM before the grid starts, so the K/V index maps
#    can read `page_table[b, j]` and the pipeline copies exactly that page from HBM to VMEM, overlapped with the
#    previous page's compute.</details>
# 3. A block that raises the running maximum from m to m'. What happens to the sum and the output so far?
#    <details><summary>Answer</summary>Both are multiplied by exp(m - m') (at most 1), so they are expressed
#    relative to the new maximum; then the block's own exp(s - m') terms are added.</details>
# 4. Why is interpret mode's time no estimate of the kernel's time on a TPU?
#    <details><summary>Answer</summary>It runs each grid step as ordinary, separate operations with copies of
#    every block, on a device with no VMEM, MXU or DMA engine; the compiled kernel's cost is set by memory
#    traffic and tiles that the simulator does not model.</details>
#
# ## Exercises
#
# Solutions are in `notebooks/solutions/13_pallas_kernels.py`.
#
# **1. The masked block.** `my_block_update(m, total, acc, q, k, v, visible, scale)`: fold one block of keys into
# the running softmax (numpy is fine). m, total [Q, 1] and acc [Q, D] are the state so far (float32), q [Q, D],
# k, v [K, D], visible [Q, K] bool. Masked scores are -1e30 and add nothing; a row that sees no key of the block
# keeps its state. Return the new (m, total, acc).

# %%
def my_block_update(m, total, acc, q, k, v, visible, scale):
    raise NotImplementedError


from jaxlab.lab.exercises import nb13

passed = nb13.check_block_update(my_block_update)


# %% [markdown]
# **2. Pick a block size.** `my_blocks(q_len, s_len, chip)`: (block_q, block_k) for q_len queries over s_len
# keys. On `"tpu"`: each a multiple of its tile (8 for queries, 128 for keys) or the whole dimension, and dividing
# its length. On `"gpu"`: powers of two, at least 16, no bigger than the length padded to a power of two. Both: at
# most 128 queries and 512 keys (`lp.block_problems` lists what is wrong with an answer).

# %%
def my_blocks(q_len, s_len, chip):
    raise NotImplementedError


passed = nb13.check_blocks(my_blocks)

# %% [markdown]
# **An experiment of your own.** Time the interpret-mode flash kernel at block sizes 8, 16 and 32 on the prefill
# of section 3: which is fastest to *simulate*, and why does that say nothing about the TPU? Then lower the kernel
# for `"tpu"` with `block_q=12` and read the error Mosaic gives. On Colab with a TPU or GPU runtime, run the last
# cell of section 6 at lengths 512 and 4096 and see where the kernel starts to win.
