# %% [markdown]
# # 16 · The TPU from this CPU: compile for a chip you do not have
#
# *About 30 minutes.* This lab is written for Colab's free TPU, one v5e chip, yet most of it is built and checked
# on CPUs. There is a bridge: **libtpu**, the TPU compiler, runs on an ordinary Linux CPU host. Given a description
# of a TPU slice, `jax.jit(f).lower(...).compile()` returns a real TPU executable with no chip attached. Nothing
# runs, but the compiler answers every question that does not need a clock: does the program compile, how many
# bytes of HBM it holds, how it lays out each array, which collectives a sharded program sends, how many FLOPs it
# does. A seed text of this lab says "XLA (Accelerated Linear Algebra) compiles JAX functions into efficient GPU/TPU
# kernels"; here we get the compiler's own answer for the TPU half, and say what it cannot tell.
#
# **Learning goals**
#
# - Build a TPU slice's devices from libtpu's topology description and compile a program for them on a CPU.
# - Read a TPU executable: tiled layouts (`T(8,128)(2,1)`), the memory analysis against 16 GB of HBM, cost
#   analysis, and what a roofline prediction from published peaks says and does not say.
# - Answer the scaling questions with formulas, then check them against the compiler: the decode step's time floor,
#   the batch at which decode turns compute-bound, the KV cache's bytes.
# - Ask "does it fit?" for models you have no weights for (a 1.7B and an 8B model, from their `config.json`).
# - Read a Mosaic refusal, and count a sharded program's collectives on a v5e-8 beside notebook 08's simulation.
#
# It needs libtpu (about 690 MB, jax's TPU build at the lab's pin): `make test` installs it, `make lab ACCEL=tpu`
# gives it to the lab, and a Colab TPU runtime has it. Without it the first compile says, in one sentence, what to
# install.
#
# Links: [jax.experimental.topologies](https://docs.jax.dev/en/latest/jax.experimental.html) ·
# [ahead-of-time lowering and compilation](https://docs.jax.dev/en/latest/aot.html) ·
# [How to Scale Your Model (the scaling book)](https://jax-ml.github.io/scaling-book/) ·
# [its roofline chapter](https://jax-ml.github.io/scaling-book/roofline/) ·
# [TPU v5e](https://cloud.google.com/tpu/docs/v5e) ·
# [Pallas on TPU](https://docs.jax.dev/en/latest/pallas/tpu/details.html) ·
# [Roofline model (Williams et al.)](https://doi.org/10.1145/1498765.1498785)

# %% tags=["nbval-ignore-output"]
import dataclasses

import jax

jax.config.update("jax_num_cpu_devices", 8)  # for section 6's CPU simulation; before jax starts its backend

import jax.numpy as jnp
import matplotlib.pyplot as plt

from jaxlab.bench import chip_compile as cc
from jaxlab.io import config as configs
from jaxlab.io.assets import data_file
from jaxlab.lab import chips
from jaxlab.lab.notebook import check, setup, table, verdict
from jaxlab.tools import hardware
from jaxlab.tools.profile import Roofline

setup(compile_cache=False)  # jax's disk cache cannot load an executable for a chip that is not attached
SMOL = configs.preset("smollm2_135m")
V5E = hardware.CHIPS["TPU v5e"]
print(f"TPU v5e, published: {V5E.peak_flops / 1e12:.0f} TFLOP/s bfloat16, {V5E.hbm_bandwidth / 1e9:.0f} GB/s, "
      f"{V5E.hbm_bytes / 1e9:.0f} GB HBM")

# %% [markdown]
# ## 1 · A chip that is not here
#
# `jax.experimental.topologies.get_topology_desc` asks libtpu for the devices of a slice by name; `v5e:1x1` is one
# v5e chip, Colab's. `jaxlab.tools.hardware.topology_devices("v5e-1")` wraps it (and keeps libtpu's warnings about
# the TPU metadata this host lacks off the screen unless something fails). The devices are real `TpuDevice`
# objects: arrays can be *placed* on them as shapes (`jax.ShapeDtypeStruct(..., sharding=...)`), never as data.

# %%
devices = hardware.topology_devices("v5e-1")
print(devices, "|", devices[0].device_kind, "|", devices[0].platform)
_ = check("libtpu describes a v5e chip on this CPU host", devices[0].platform == "tpu" and "v5" in devices[0].device_kind)

# %% [markdown]
# ## 2 · The decode step, compiled for v5e
#
# `jaxlab compile --chip v5e-1` compiles every program the lab runs; here we take one, SmolLM2-135M's decode step
# (the one `jaxlab.Generator` calls per token) at batch 32 and a 2048-token context, in bfloat16, the TPU's dtype.
# The parameters are abstract (`jax.eval_shape`): no weights are read, so the same call works for any model
# size. **Predict first:** the bfloat16 weights are 269 MB and the cache for 32 × 2048 tokens 1.5 GB. How much HBM
# will the compiled program hold while it runs: about that, twice that, or ten times that?

# %% tags=["nbval-ignore-output"]
base = cc.Settings(SMOL, batch=32, context=2048)
smol = chips.decode_reports({"SmolLM2-135M bf16, 32 x 2048": base})["SmolLM2-135M bf16, 32 x 2048"]
step = smol.programs[0]
table([{"": "arguments (weights, cache, tokens)", "MB": step.argument_bytes / 1e6},
       {"": "outputs", "MB": step.output_bytes / 1e6},
       {"": "  of which alias an argument (the donated cache)", "MB": step.alias_bytes / 1e6},
       {"": "temporaries", "MB": step.temp_bytes / 1e6},
       {"": "generated code", "MB": step.code_bytes / 1e6},
       {"": "held while it runs", "MB": step.device_bytes / 1e6}],
      title=f"{step.name} for v5e-1: memory analysis ({step.seconds:.1f} s to compile)");

# %%
check("the decode step compiles for v5e-1", step.ok)
check("it holds the weights and the cache, and fits the 16 GB chip", step.argument_bytes >= smol.weights_bytes
      and smol.fits)
_ = check("the donated cache is written in place (its outputs alias the cache's buffers)",
          step.alias_bytes >= smol.cache_bytes)

# %% [markdown]
# **Layouts.** A TPU stores arrays in tiles: `bf16[576,192]{0,1:T(8,128)(2,1)}` reads "dimension 0 is minor, tiles
# of 8 × 128, and two bfloat16 values packed per 32-bit word". A dimension that is not a multiple of its tile is
# padded: a `[.., 64]` array with 64 in the 128-lane dimension would take twice its bytes. SmolLM2's head_dim is 64.
# The compiler chooses each parameter's layout; `padding` compares the tiled bytes of all arguments with their
# logical bytes (shapes × dtypes).

# %% tags=["nbval-ignore-output"]
for layout in chips.parameter_layouts(step.executable.as_text()):
    print(layout)

# %%
print(f"tiled / logical argument bytes: {step.padding:.3f}")
_ = check("the layouts pad the decode step's arguments by under 5 % (head_dim 64 never sits alone in 128 lanes)",
          step.padding < 1.05)

# %% [markdown]
# The K cache is `[B·KVH, S, 64]`: a minor dimension of 64 would pad to 128 lanes, but the compiler gave it a layout
# with the 1024 slots in the lanes instead. The V cache is already `[B·KVH, 64, S]` (notebook 05 chose it so the
# attention matmuls need no transpose). What padding costs is real, and the compiler avoids it where it may choose;
# it could not for an array whose *both* last dimensions were small, e.g. a `[.., 3, 100]` block (section 5).
#
# ## 3 · The scaling questions, answered twice
#
# The scaling book's roofline chapter asks: how fast *can* a decode step be? Every weight and every cached K/V is
# read once per step, so at best `time = bytes / HBM bandwidth`. `jaxlab compile` predicts each program's time as
# `max(FLOPs / peak, bytes moved / bandwidth)` with the chip's published peaks, where *bytes moved* are the
# arguments and outputs from the memory analysis. **Predict first:** what is the floor for SmolLM2 at batch 32 × 2048
# on a v5e, in milliseconds?

# %%
kv_token = chips.kv_bytes(SMOL, 1, 1)
floor = chips.decode_floor_s(smol.weights_bytes, smol.cache_bytes)
print(f"KV cache per token: {kv_token:,} bytes in bfloat16 (2 x {SMOL.n_layers} layers x {SMOL.n_kv_heads} KV heads "
      f"x {SMOL.head_dim} x 2 bytes)")
print(f"floor: ({smol.weights_bytes / 1e6:.0f} MB weights + {smol.cache_bytes / 1e6:.0f} MB cache) / "
      f"{V5E.hbm_bandwidth / 1e9:.0f} GB/s = {floor * 1e3:.2f} ms")
check("the cache the compiled step aliases is the formula's bytes (plus pos and index: under 1 % more)",
      0 <= step.alias_bytes / (kv_token * 32 * 2048) - 1 < 0.01)
_ = check("the compiled program's prediction is at or above the floor, within 10 %",
          floor <= step.predicted_s <= 1.1 * floor)

# %% [markdown]
# **When does decode turn compute-bound?** A step over B rows does 2 FLOPs per parameter per row and, counting the
# weights only, reads each parameter's 2 bytes once: intensity `2B / 2 = B` FLOP/byte. The v5e's ridge is
# 197 T / 819 G = 240 FLOP/byte, so the classic answer is **batch 240**. But each row also reads its own KV cache,
# which grows with the batch: the intensity can never exceed `2 × parameters / (one row's cache bytes)`.
# **Predict first:** at a 1024-token context, what batch turns SmolLM2's decode compute-bound on a v5e?

# %%
rows = []
for ctx in (1024, 64, 16):
    ceiling = chips.max_intensity(SMOL, ctx)
    rows.append({"context": ctx, "one row's cache MB": chips.kv_bytes(SMOL, 1, ctx) / 1e6,
                 "highest intensity, FLOP/byte": ceiling, "compute-bound at some batch": ceiling > chips.ridge()})
_ = table(rows, title=f"v5e ridge {chips.ridge():.0f} FLOP/byte; weights only: batch {chips.critical_batch():.0f}")

# %% [markdown]
# Only very short contexts ever cross the ridge. The compiler agrees: section 2's step (batch 32 × 2048) beside the
# decode step at a 16-token context and batch 512, with the bound each prediction hit (the formula: 2 × parameters
# × B FLOPs over the weights plus B rows of cache crosses 240 FLOP/byte near batch 360 at context 16).
#
# The bound needs only the program's FLOPs and the bytes it moves, so we ask the compiler for its lowest
# optimization effort (`effort=-1`, XLA's `exec_time_optimization_effort`; `jaxlab compile --effort -1`): on this
# CPU it compiled this step in 6.9 s instead of 16.8, with the same FLOPs and bytes moved (measured once, Intel Xeon,
# 2026-12-06; `tests/bench/test_chip_compile.py` checks the two agree). Its temporaries differ, so a fit (section 4)
# is asked at the default effort.

# %% tags=["nbval-ignore-output"]
wide = dataclasses.replace(base, batch=512, context=16, effort=-1.0)
sweep = {"batch 32, context 2048": smol, **chips.decode_reports({"batch 512, context 16": wide})}
table([{"decode step": k, "FLOP/byte (FLOPs / bytes moved)": r.programs[0].flops / r.programs[0].moved_bytes,
        "predicted us": r.programs[0].predicted_s * 1e6, "bound": r.programs[0].bound} for k, r in sweep.items()]);

# %%
bounds = {k: r.programs[0].bound for k, r in sweep.items()}
_ = check("batch 32 x 2048 is memory-bound and batch 512 x 16 compute-bound, as the formula says",
          bounds == {"batch 32, context 2048": "memory", "batch 512, context 16": "compute"})

# %% [markdown]
# ## 4 · Does it fit?
#
# The question every TPU user meets first. `--config` builds abstract parameters from a Hugging Face `config.json`, so
# the compiler answers for models whose weights we never download: `data/configs/` ships SmolLM2-1.7B's and
# Llama-3-8B's. **Predict first:** Llama-3-8B's bfloat16 weights are 16 GB; a v5e has 16 GB. Fits, or not? And with
# int8 weights and an int8 KV cache?

# %% tags=["nbval-ignore-output"]
big = cc.model_config(None, data_file("configs", "smollm2-1.7b.json"))  # config.json only, no weights
llama = cc.model_config(None, data_file("configs", "llama-3-8b.json"))
fits = {"SmolLM2-1.7B bf16, 8 x 4096": cc.Settings(big, batch=8, context=4096),
        "Llama-3-8B bf16, 8 x 4096": cc.Settings(llama, batch=8, context=4096),
        "Llama-3-8B int8 + int8 KV, 8 x 4096": cc.Settings(llama, batch=8, context=4096, quant="int8", kv_cache="int8")}
fit = {"SmolLM2-135M bf16, 32 x 2048": smol, **chips.decode_reports(fits)}  # section 2's step, and three more
table(chips.fit_rows(fit), title="The decode step compiled for v5e-1");

# %% tags=["nbval-ignore-output"]
fig = chips.plot_fit(fit, "What the v5e-1 compiler says each decode step holds")
plt.show()

# %%
said = {k: (r.programs[0].ok and bool(r.fits)) for k, r in fit.items()}
print(said)
check("SmolLM2-135M at batch 32 x 2048 and SmolLM2-1.7B at 8 x 4096 fit a v5e", said["SmolLM2-135M bf16, 32 x 2048"]
      and said["SmolLM2-1.7B bf16, 8 x 4096"])
_ = check("Llama-3-8B in bfloat16 is refused for lack of HBM, and fits with int8 weights and KV cache",
          "RESOURCE_EXHAUSTED" in fit["Llama-3-8B bf16, 8 x 4096"].programs[0].message
          and said["Llama-3-8B int8 + int8 KV, 8 x 4096"])

# %% [markdown]
# The refusal is the compiler's own sentence (`jaxlab compile` prints its first line). The 8B model's weights
# alone are the chip's HBM, before any cache or temporary: on one v5e it runs quantized or not at all, and the
# compiler said so in seconds, with no TPU and no download. (It also says 15.75 GiB is available, a little less
# than the 16 GB on the datasheet.)
#
# ## 5 · What Mosaic refuses
#
# Pallas kernels compile through Mosaic, which enforces the TPU's tiling on each block: the last two dimensions of
# a block must be divisible by 8 and 128 (or span the whole array). Notebook 13 could only *lower* its kernels from
# this CPU; here they compile for v5e. First a block shape Mosaic refuses:

# %%
bad = chips.refused_block("v5e-1", block=(3, 100))
print(bad.name, "->", "compiled" if bad.ok else "refused")
print(bad.message.split(" Block spec")[0])  # the rest names this file and line
_ = check("a (3, 100) block is refused with Mosaic's reason (divisible by 8 and 128)",
          not bad.ok and "divisible by 8 and 128" in bad.message)

# %% [markdown]
# And the lab's three kernels at SmolLM2's shapes, each a `tpu_custom_call` (Mosaic's kernel) inside the TPU program:

# %% tags=["nbval-ignore-output"]
kern = cc.compile_all(base, "v5e-1", only=lambda n: n.startswith("kernel"))
table([{"kernel": p.name, "compiled": p.ok, "tpu_custom_call": p.custom_calls.get("tpu_custom_call", 0),
        "s": p.seconds} for p in kern.programs]);

# %%
_ = check("the three Pallas kernels compile through Mosaic for v5e, one custom call each",
          all(p.ok and p.custom_calls.get("tpu_custom_call") == 1 for p in kern.programs) and len(kern.programs) == 3)

# %% [markdown]
# ## 6 · A v5e-8's collectives, beside notebook 08's simulation
#
# Notebook 08 split the model's heads over 8 simulated CPU devices and counted the collectives XLA inserted: one
# all-reduce after each layer's attention output and one after its MLP. Is that what a real v5e-8 program does? We
# compile the tensor-parallel decode step for libtpu's v5e-8 (eight chips on one host) and for this process's 8
# simulated CPU devices, on a 2-layer SmolLM2 (the count per layer is what matters, and it compiles in seconds).

# %%
two = cc.Settings(SMOL.replace(n_layers=2), batch=8, context=256)
tp = {chip: cc.compile_all(two, chip, only=lambda n: "tensor-parallel" in n).programs[0] for chip in ("v5e-8", "cpu")}
for chip, p in tp.items():
    print(f"{chip:6s} {p.name}: {p.collectives}")
_ = check("the v5e-8 program has the CPU simulation's collectives: 2 all-reduces per layer",
          tp["v5e-8"].collectives == tp["cpu"].collectives == {"all-reduce": 2 * two.config.n_layers})

# %% [markdown]
# ## 7 · A prediction against a measurement
#
# A roofline prediction is a lower bound, not a forecast. We cannot time the TPU, but we can apply the same
# predictor to this CPU, with its *measured* ceilings (a streaming copy, and a matmul timed beside every call of
# every program, since one measured in a moment when another process held a core would understate the ceiling and
# let a program "beat" its bound), and time the programs it predicts. **Predict first:** will the measured times land within 2× of the predictions?

# %% tags=["nbval-ignore-output"]
cpu = cc.compile_all(cc.Settings(SMOL.replace(n_layers=2), dtype="float32", batch=8, context=256), "cpu",
                     only=lambda n: n.startswith(cc.MEASURED))
roof = Roofline.measure(nbytes=1 << 30, n=1024, repeats=3)
cc.measure(cpu, roof, reps=3)
print(cc.format_measured(cpu))

# %% tags=["nbval-ignore-output"]
fig = chips.plot_predicted_vs_measured(cpu, f"2-layer SmolLM2 on {hardware.cpu_name()}")
plt.show()

# %%
measured = [p for p in cpu.programs if p.measured_s is not None]
_ = check(f"{len(measured)} programs measured, each at or above its prediction (a roofline is a lower bound)",
          len(measured) >= 5 and all(p.measured_s >= p.predicted_s for p in measured))

# %% [markdown]
# On a CPU the programs land between about 1× and 10× their predictions: the small ones pay per-operation costs
# the roofline ignores, and the cost model's FLOPs and bytes are themselves estimates (notebook 07 found cost
# analysis counting several times the bytes a step must move). The v5e predictions above deserve the same
# suspicion until a chip measures them: they are the best the hardware allows, not what XLA will reach.
#
# ## 8 · The claim
#
# Everything the lab runs on one chip compiled for v5e, the kernels through Mosaic, and the sharded step for a v5e-8.

# %%
asked = [step, *kern.programs, tp["v5e-8"]]
_ = verdict("xla_compiles_tpu_kernels", sum(p.ok for p in asked) / len(asked),
            because=f"libtpu compiled all {len(asked)} on this CPU; 'efficient' needs a TPU to time them, and section "
            "7 shows how far a roofline prediction can be from a measured time")


# %% [markdown]
# ## Summary
#
# - libtpu compiles for a TPU slice on a CPU host: `topology_devices("v5e-1")`, abstract arguments placed on those
#   devices, `jit(f).lower(...).compile()`. Memory analysis, cost analysis and the HLO are the chip's.
# - SmolLM2's decode step holds its weights, the donated cache once, and little else; the compiler's layouts pad
#   its arguments by about 1 %, avoiding the 2× a 64-wide minor dimension would cost.
# - Decode's floor is (weights + cache) / bandwidth; counting the weights only, v5e turns compute-bound at batch
#   240, but each row's KV cache keeps decode memory-bound at any batch unless the context is very short.
# - Llama-3-8B does not fit one v5e in bfloat16 (the compiler: 19 GB of temporaries needed); with int8 weights and
#   cache it does. SmolLM2-1.7B fits in bfloat16 at 8 × 4096.
# - Mosaic refuses blocks that break the (8, 128) tiling, in its own words; the lab's kernels compile.
# - A v5e-8's tensor-parallel step has the collectives notebook 08 counted on simulated CPU devices.
# - A roofline prediction is a floor: on this CPU, measured times land above it, by up to about 10×.
#
# **Quiz**
#
# 1. Why can a CPU host compile for a TPU at all, and what can it never tell you?
#    <details><summary>Answer</summary>The compiler is a library (libtpu) that needs a description of the chip,
#    not the chip; it returns the executable, its layouts and its memory and cost analyses. Running it, and so
#    any measured time, needs the chip.</details>
# 2. Why is "batch 240" the wrong answer to "when does SmolLM2's decode turn compute-bound on a v5e" at a
#    1024-token context?
#    <details><summary>Answer</summary>It counts the weights only. Every row also reads its own KV cache (23.6 MB
#    at 1024 tokens in bfloat16), which grows with the batch, so the intensity approaches 2 × parameters / one row's
#    cache bytes (about 11 FLOP/byte), far below the ridge of 240 at any batch.</details>
# 3. The compiler refused Llama-3-8B in bfloat16 on v5e-1. Name two changes that make it fit, and what each costs.
#    <details><summary>Answer</summary>int8 weights (half the bytes; a little quality, notebook 09) and an int8 or
#    smaller KV cache (quality again, less); or two chips with the model split by heads (notebook 08: an
#    all-reduce per layer twice per step); or a shorter context or smaller batch (fewer tokens served).</details>
#
# ## Exercises
#
# Solutions are in `notebooks/solutions/16_tpu_from_cpu.py`.
#
# **1. KV-cache bytes.** `my_kv_bytes(n_layers, n_kv_heads, head_dim, batch, context, itemsize)`: the bytes of a KV
# cache, K and V, for every layer, row and token (the check uses SmolLM2-135M's, SmolLM2-1.7B's, Llama-3-8B's and
# random shapes).

# %%
def my_kv_bytes(n_layers, n_kv_heads, head_dim, batch, context, itemsize):
    raise NotImplementedError


from jaxlab.lab.exercises import nb16

passed = nb16.check_kv_bytes(my_kv_bytes)


# %% [markdown]
# **2. Rows that fit.** `my_max_batch(weights_bytes, kv_bytes_per_row, hbm_bytes, reserve=0.1)`: the most rows whose
# caches fit beside the weights, keeping a fraction `reserve` of the HBM for temporaries and code (0 when the
# weights alone do not fit). Then compare its answer for Llama-3-8B in int8 on a v5e with the compiler's table.

# %%
def my_max_batch(weights_bytes, kv_bytes_per_row, hbm_bytes, reserve=0.1):
    raise NotImplementedError


passed = nb16.check_max_batch(my_max_batch)

# %% [markdown]
# **3 (think).** The v6e (Trillium) publishes 918 TFLOP/s and 1638 GB/s. Where is its ridge, and does SmolLM2's
# decode at a 16-token context turn compute-bound at a smaller or larger batch than on a v5e?
# <details><summary>Answer</summary>918 T / 1638 G ≈ 560 FLOP/byte, more than twice the v5e's 240: the compute
# grew faster than the bandwidth, so decode needs a larger batch (and an even shorter context) before the MXUs
# become the limit. Check it: `jaxlab compile --chip v6e-1 --batch 1024 --context 16 --only decode`.</details>
#
# **An experiment of your own.** Run `jaxlab compile --chip v5e-1 --config ../data/configs/llama-3-8b.json --quant
# int8 --kv-cache int8 --batch 16 --context 8192` (in `data/configs/` of a clone): does it still fit? Find the largest batch that does, and compare it
# with exercise 2's answer. Then compile with `--attention pallas` and count the `tpu_custom_call`s in the JSON.
