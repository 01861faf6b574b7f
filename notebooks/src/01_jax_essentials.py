# %% [markdown]
# # 01 · JAX essentials: tracing, `jit` and honest timing
#
# *About 45 minutes (35 on the 3-hour workshop path, which skips the sections marked so).* Every later notebook leans on four ideas: JAX **traces** a Python function into a small program,
# **compiles** it with XLA, **caches** the result by the shapes and dtypes it saw, and runs it
# **asynchronously**. This notebook makes each idea visible, then measures what `jit` really buys on
# the lab's model, SmolLM2-135M.
#
# **Learning goals**
#
# - read a *jaxpr*: what tracing records, and why Python side effects run only once;
# - predict which calls recompile (shapes, dtypes, weak types, static arguments) and count them;
# - time JAX code honestly: `block_until_ready`, and compile time kept apart from run time;
# - measure eager vs `jit` on one real transformer block and on the full model, and judge the
#   "2-3x" claim;
# - fix two bugs that popular tutorials ship: NumPy randomness inside `jit`, and catching an
#   exception type that JAX does not have.
#
# Links: [JAX: just-in-time compilation](https://docs.jax.dev/en/latest/jit-compilation.html) ·
# [Key concepts: tracing, jaxprs](https://docs.jax.dev/en/latest/key-concepts.html) ·
# [Asynchronous dispatch](https://docs.jax.dev/en/latest/async_dispatch.html) ·
# [Pseudorandom numbers](https://docs.jax.dev/en/latest/random-numbers.html) ·
# [`jax.errors`](https://docs.jax.dev/en/latest/errors.html) ·
# [Flax NNX](https://flax.readthedocs.io/en/latest/) ·
# [XLA](https://openxla.org/xla)

# %% tags=["nbval-ignore-output"]
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import jaxlab
from jaxlab.lab import essentials
from jaxlab.lab.exercises import nb01
from jaxlab.lab.notebook import check, setup, show_source, table, verdict
from jaxlab.tools.profile import CompileCounter
from jaxlab.tools.reference import agreement_rtol

# This notebook measures compile times, so it keeps JAX's persistent compilation cache off:
# with it on, a second run would load programs from disk and "compile" would look almost free.
setup(compile_cache=False)
m = jaxlab.load()
m


# %% [markdown]
# ## The claims
#
# The article this lab grew from ("The JAX Advantage: Engineering High-Performance LLM Inference
# for 2026") says:
#
# > "When you decorate a function with @jit, JAX traces the entire computation graph and compiles it
# > into a fused, hardware-optimized executable using XLA (Accelerated Linear Algebra). This means
# > your Python code is transformed into efficient C++ binaries that run directly on your GPU or
# > CPU, bypassing the interpreter entirely"
#
# > "A JIT-compiled inference pipeline can often achieve 2-3x speed improvements over eager
# > execution, without any changes to the underlying model weights."
#
# > "This means the first call will be slower (due to compilation overhead), but every subsequent
# > call will be dramatically faster"
#
# Its code also draws `np.random.rand(...)` inside an `@jit` function and catches
# `jax.errors.TracebackError`. We measure the first three and run the last two.
#
# ## 1. Tracing: what `jit` actually sees
#
# `jax.jit(f)` does not read your source code. It *calls* `f` once with **tracers**: stand-ins that
# carry a shape and a dtype but no values. Every `jnp` operation on a tracer is recorded, and the
# record is a **jaxpr**, a tiny functional program. `jax.make_jaxpr` shows it:

# %%
def f(x):
    return jnp.sin(x) * 2.0 + 1.0


print(jax.make_jaxpr(f)(jnp.ones(3)).pretty_print(use_color=False))


# %% [markdown]
# Three primitives on a `f32[3]` input; the Python constants `2.0` and `1.0` became literals. `jit`
# lowers this jaxpr to StableHLO and XLA compiles it for your device (on CPU through LLVM into
# machine code; on GPU and TPU into device programs: not "C++ binaries"), fusing the three
# element-wise operations into one loop.
#
# Because tracing *runs* the Python function, Python side effects happen at trace time only. That is
# why JAX functions should be **pure**: output determined by the inputs, nothing else read or written.
# **Predict first:** `g` below prints a line each time its body runs. Four calls, with shapes
# (3,), (3,), (3,) and (4,): how many lines does it print?

# %%
def g(x):
    print("  tracing g, x is", x)  # a Python side effect: runs only while tracing
    return x * 2


jg = jax.jit(g)
for n in (3, 3, 3, 4):
    print(f"call with shape ({n},)")
    jg(jnp.ones(n))


# %% [markdown]
# Four calls, two traces: the second and third calls reuse the compiled program for `f32[3]`; the
# shape `(4,)` is new, so `g` is traced and compiled again. The printed `x` is a tracer, not numbers.
#
# ## 2. What triggers a recompile
#
# A jitted function keeps a cache keyed by the **abstract signature** of its arguments: their pytree
# structure, shapes, dtypes, "weak types" (Python scalars), and the *values* of static arguments.
# Values of array arguments never matter. `CompileCounter` (from `jaxlab.tools.profile`) listens to JAX's
# compile events, so we can count:

# %%
def scale(x, *, power=2):
    return jnp.tanh(x) ** power


scale_jit = jax.jit(scale, static_argnames="power")
a, b = jnp.ones(4), jnp.arange(4.0)  # built before counting: creating arrays compiles tiny programs too
calls = [
    ("scale(a)", (a,), {}),
    ("scale(b)  # new values", (b,), {}),
    ("scale(jnp.ones(8))", (jnp.ones(8),), {}),
    ("scale(a.astype(bfloat16))", (a.astype(jnp.bfloat16),), {}),
    ("scale(2.0)  # Python float", (2.0,), {}),
    ("scale(a, power=3)", (a,), {"power": 3}),
    ("scale(a, power=3)  # again", (a,), {"power": 3}),
    ("scale(a, power=2)  # the default, passed", (a,), {"power": 2}),
]
log = essentials.compile_log(scale_jit, calls)
_ = table(log)

# %%
compiled = [r["compiled"] == "yes" for r in log]
check("new values reuse the compiled program", not compiled[1] and not compiled[6])
check("a new shape, dtype, weak type or static value compiles", all(compiled[i] for i in (2, 3, 4, 5)))
check("passing a static argument's default explicitly compiles a second program", compiled[7])
print(f"{sum(compiled)} compilations for {len(calls)} calls")

# %% [markdown]
# The last row is a trap worth knowing: jit keys static arguments by *how they were passed*, so
# `scale(a)` and `scale(a, power=2)` are two programs with the same result.
#
# For LLM inference this is the whole game. Every new prompt length is a new shape, hence a new
# compile; that is why `jaxlab.Generator` pads prompts to a few *bucket* lengths and keeps the decode
# step at one fixed shape (notebook 04). Temperature is passed as an array, not as a static
# argument, so changing it never recompiles (exercise 2 below).
#
# ## 3. Honest timing: dispatch is asynchronous
#
# `f(x)` returns as soon as the work is *queued*. The array it returns is a promise; the computation
# finishes later, on another thread (CPU) or on the accelerator. A timer around `f(x)` alone measures
# the dispatch. `jax.block_until_ready(out)` waits for the result; `jaxlab.tools.profile.time_fn` always does.
# **Predict first:** `w @ w @ w` is two chained 1024 × 1024 matmuls, 2 × 2 × 1024³ ≈ 4.3 GFLOP. How long will the timer say
# they took, with and without the sync?

# %% tags=["nbval-ignore-output"]
matmuls = jax.jit(lambda w: w @ w @ w)  # [1024, 1024]: two matmuls, about 4.3 GFLOP
w = jax.random.normal(jax.random.key(0), (1024, 1024))
unsynced, synced = essentials.time_unsynced(matmuls, w, repeats=3)
_ = table([{"timer stops at": "f(x) returned (no sync)", "best ms": min(unsynced) * 1e3, "median ms": float(np.median(unsynced)) * 1e3},
           {"timer stops at": "block_until_ready(f(x))", "best ms": min(synced) * 1e3, "median ms": float(np.median(synced)) * 1e3}])

# %%
if min(synced) > 1e-3:  # the work takes far longer than queuing it (a CPU; a TPU does 4 GFLOP in ~20 µs)
    _ = check("without block_until_ready the timer stops before the work is done (best time < 1/3 of the real one)",
              min(unsynced) < min(synced) / 3)
else:
    print(f"the work took {min(synced) * 1e6:.0f} µs, as short as queuing it: no gap to see on this chip")

# %% [markdown]
# Without the sync you would "measure" a matmul chain running many times faster than the chip can
# do it. Every timing in this lab blocks on its outputs, and keeps the **compile** apart from the
# **run**: `time_fn` compiles ahead of time (`f.lower(x).compile()`), times that, then times
# synchronized runs.
#
# ## 4. Eager vs `jit` on the real model
#
# *Eager* means calling the same function without `jit`: JAX runs each `jnp` operation as soon as
# Python reaches it, one small compiled kernel per operation, with Python in between. `jit` runs
# one program for the whole function, with the element-wise operations fused.
#
# First, one decoder block of SmolLM2 with its real weights (RMSNorm, grouped-query attention with
# RoPE, SwiGLU MLP): `essentials.block_step` turns `m.params.module().layers[0]` into a pure function
# `step(state, x, positions)`. This is the code that is timed below:

# %% tags=["nbval-ignore-output"]
_ = show_source(essentials.block_step, skip_docstring=True)

# %% [markdown]
# `jax.eval_shape` traces it without running or compiling anything, a cheap way to check shapes:

# %%
step, block_state = essentials.block_step(m.params, layer=0)
x, positions = essentials.block_inputs(m.config, seq_len=16)
for path, v in nnx.to_flat_state(block_state):
    print(f"  {'.'.join(map(str, path)):<16} {v.shape}")
print("x", x.shape, x.dtype, "->", jax.eval_shape(step, block_state, x, positions))

# %% [markdown]
# Now the timings. First one large matmul (`w @ w`, 1024 × 1024: one operation, about 2 GFLOP), then
# the block on 1 token (the shape of a decode step) and on the 37 tokens of the chat prompt "What is the
# capital of France?" (the shape of a prefill); then the whole model (`jaxlab.forward`: embedding, all
# 30 blocks, output head; no KV cache) on that prompt. Each row: eager and jit run time, the speed-up,
# the compile time, how many calls it takes before compiling has paid for itself, and the largest
# difference between the eager and the jit outputs. Run times are the best of a few synchronized runs:
# on a busy machine other processes only ever add time, so the best run is the steadiest estimate.
# (`essentials.eager_vs_jit` is timing bookkeeping: the eager call is `fn(*args)`, the jitted one
# `jax.jit(fn)(*args)`, compiled ahead of time so that compiling is timed apart.)
#
# **Predict first:** rank the four by speed-up. Which gains most from `jit`, and does any reach the
# article's 2-3x exactly?

# %% tags=["nbval-ignore-output"]
ids = m.tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                      add_generation_prompt=True, tokenize=True)
results = {"one 1024x1024 matmul": essentials.eager_vs_jit(lambda a: a @ a, w, repeats=3)}
for n in (1, len(ids)):
    xs, ps = essentials.block_inputs(m.config, seq_len=n)
    results[f"1 block, {n} token{'s' * (n > 1)}"] = essentials.eager_vs_jit(step, block_state, xs, ps, repeats=20,
                                                                          rtol=agreement_rtol(m.params))
tokens, pos = essentials.prompt_inputs(ids)
results[f"full model, {len(ids)} tokens"] = essentials.eager_vs_jit(essentials.forward_logits, m.params, tokens, pos,
                                                                    rtol=agreement_rtol(m.params))
_ = table([r.row(label) for label, r in results.items()], title=f"Measured here ({jax.default_backend()})")

# %% tags=["nbval-ignore-output"]
import matplotlib.pyplot as plt

fig = essentials.plot_eager_vs_jit(results)
plt.show()

# %% [markdown]
# Read the table from top to bottom. The **single matmul** gains nothing: eagerly or jitted, it is one
# call of the same XLA kernel, and dispatching one operation costs microseconds next to its
# milliseconds of arithmetic. With **one token**, every operation is tiny, and eager mode
# spends most of its time in Python: deciding what to run, one operation at a time. `jit` removes all
# of that at once, so the speed-up is large. With **more tokens**, more of the time goes into the
# matrix multiplications, which run the same XLA kernels eagerly or not; `jit` can only save the
# dispatch and fuse the element-wise work around them, so the speed-up shrinks. (Add 256 to the
# block's lengths above and rerun the cell: on the 2-core CPU this lab was written on, the gain fell
# below 2x.)
#
# The article's "2-3x" is one point on this curve, not a property of `jit`. A one-token call is
# exactly what a decode step is (notebook 05): 30 such blocks per generated token. So `jit` matters
# most in the loop that generates text, token after token. (The first eager call is slow too: each
# primitive compiles its own small program the first time it meets a shape.)

# %%
one_token = results["1 block, 1 token"].speedup
check("eager and jit compute the same outputs (matmul, block and full model)", all(r.same for r in results.values()),
      f"the model's within {agreement_rtol(m.params):g} of the largest output, its {m.params.policy.dtype} tolerance")
_ = check("jit is faster than eager on a one-token call", one_token > 2)

# %% [markdown]
# The claims, graded by their rules in `jaxlab/lab/claims.py`: "2-3x" is read as "at least 2x", and
# "dramatically faster" as a first call at least 10x longer than a later one. Each is measured in every
# setting above; a claim that holds in some settings and not others gets the condition under which it
# holds. Notebook 04 measures the same two claims on the decode step and on one of the model's matmuls.

# %% tags=["nbval-ignore-output"]
_ = verdict("jit_speedup_2_3x", {k: r.speedup for k, r in results.items()},
            "jit removes the per-operation dispatch and fuses element-wise work; it cannot speed up a kernel")
_ = verdict("first_call_slower", {k: r.first_call_x for k, r in results.items()},
            "compiling a model block or the whole model takes far longer than running it; the persistent "
            "compilation cache (notebook 07) saves the XLA part of it in later sessions")

# %% [markdown]
# The first call of each setting against a later one (compile time included, from the table above):

# %% tags=["nbval-ignore-output"]
fig = essentials.plot_settings("first_call_slower", {k: r.first_call_x for k, r in results.items()},
                               "First jitted call / a later call, per setting", "first call / later call (log)")
plt.show()

# %% [markdown]
# Does a compiled call "bypass the interpreter entirely"? Each call starts in Python, and jax's dispatch
# checks the arguments, looks the program up in its cache and hands it to the runtime. That costs
# microseconds, measured here with a tiny function against a plain Python call:

# %% tags=["nbval-ignore-output"]
tiny = jax.jit(lambda v: v + 1)
one = jnp.float32(1.0)
overhead = {"plain Python function call": essentials.per_call_seconds(lambda v: v, one),
            "jitted v + 1 (compiled)": essentials.per_call_seconds(tiny, one),
            "eager v + 1 (one op)": essentials.per_call_seconds(lambda v: v + 1, one)}
_ = table([{"call": k, "us per call": s * 1e6} for k, s in overhead.items()])

# %%
_ = check("a call of a compiled function costs more than 10 plain Python calls",
          overhead["jitted v + 1 (compiled)"] > 10 * overhead["plain Python function call"])

# %% [markdown]
# Is that dispatch Python code? Count it: `essentials.python_calls_per_call` turns on Python's profiler
# (`sys.setprofile`) and counts every Python function the interpreter enters during the calls. Two
# settings: 100 calls with the same shape (the compiled program is found in the cache), and 10 calls
# with a new shape each (the arrays are built before counting). **Predict first:** how many Python
# functions run per call in each?

# %% tags=["nbval-ignore-output"]
_ = show_source(essentials.python_calls_per_call, skip_docstring=True)
fresh = jax.jit(lambda v: v + 1)
new_shapes = [(jnp.ones(n),) for n in range(1, 11)]
python_calls = {"same shape (cached program)": essentials.python_calls_per_call(tiny, [(one,)] * 100),
                "a new shape each call": essentials.python_calls_per_call(fresh, new_shapes)}
_ = table([{"setting": k, "Python calls per call": v} for k, v in python_calls.items()])

# %% tags=["nbval-ignore-output"]
_ = verdict("jit_cpp_bypasses_interpreter", python_calls,
            "a cached program is dispatched by jax's C++ code, with no Python in between; a new shape runs "
            "jax's Python to trace and compile, and XLA emits machine code through LLVM, not C++ binaries")


# %% [markdown]
# ## 5. Randomness inside `jit`: NumPy vs `jax.random` *(3-hour path: skip)*
#
# The article's inference function draws its (fake) logits with
# `np.random.rand(len(input_ids), 1024)` inside `@jit`. NumPy knows nothing about tracing: it runs
# **once, while tracing**, and its result is baked into the compiled program as a constant. Here is
# the same mistake, smaller:

# %%
@jax.jit
def fake_logits(input_ids):  # [T] -> [T, 8]
    return jnp.asarray(np.random.rand(input_ids.shape[0], 8), jnp.float32)  # the bug


input_ids = jnp.arange(5)
first, second = fake_logits(input_ids), fake_logits(input_ids)
print("two calls, identical 'random' logits:", bool((first == second).all()))


# %% [markdown]
# The fix: randomness comes from an explicit **key**, an input like any other array. A new key
# gives new numbers, the same key the same numbers (reproducible sampling), and since the key is
# traced, changing it never recompiles.

# %%
@jax.jit
def sampled_logits(input_ids, key):  # [T], key -> [T, 8]
    return jax.random.uniform(key, (input_ids.shape[0], 8))


key = jax.random.key(0)
k1, k2 = jax.random.split(key)
with CompileCounter() as cc:
    r1, r2, r1_again = sampled_logits(input_ids, k1), sampled_logits(input_ids, k2), sampled_logits(input_ids, k1)
print("new key -> new numbers:", not bool((r1 == r2).all()))
print("same key -> same numbers:", bool((r1 == r1_again).all()))
print("compilations for three calls:", cc.count)

# %% [markdown]
# Never reuse a key for two different draws: `jax.random.split` it, as `jaxlab.Generator` does once
# per generated token.
#
# ## 6. Errors: the ones JAX has, and one it does not *(3-hour path: skip)*
#
# The article's error handling reads `except jax.errors.TracebackError as e:`. There is no such type:

# %%
print("jax.errors has TracebackError:", hasattr(jax.errors, "TracebackError"))
print("what jax.errors does have:", ", ".join(n for n in sorted(dir(jax.errors)) if n[0].isupper()))


# %% [markdown]
# Python evaluates an `except` clause only when an exception reaches it. So this code runs fine until
# something goes wrong, and then the *error handler itself* crashes with an `AttributeError` that
# buries the real error. Here the real error is a slice with a traced length:

# %% tags=["raises-exception", "nbval-ignore-output"]
def first_n(tokens, n):
    return tokens[:n]  # a slice length must be known at trace time


try:
    jax.jit(first_n)(jnp.arange(10), 3)
except jax.errors.TracebackError as e:  # the article's handler
    print(f"JAX compilation error: {e}")


# %% [markdown]
# Two errors you *will* meet, both raised while tracing, when Python needs a concrete value from a
# tracer. `ConcretizationTypeError`: Python wants a number, e.g. `int(n)`:

# %% tags=["raises-exception", "nbval-ignore-output"]
@jax.jit
def first_n_int(tokens, n):
    return tokens[: int(n)]


first_n_int(jnp.arange(10), 3)

# %% [markdown]
# `TracerBoolConversionError`: Python wants a `bool`, e.g. an `if` on a traced value. Here the
# temperature branch of a sampler (the function of exercise 2):

# %% tags=["raises-exception", "nbval-ignore-output"]
logits = jnp.array([[1.0, 3.0, 2.0]])
jax.jit(nb01.scale_logits_python_if)(logits, 0.7)


# %% [markdown]
# Catch them by their real names. `TracerBoolConversionError` is a subclass of
# `ConcretizationTypeError`, so one `except` clause covers both:

# %%
def error_name(fn, *args):
    try:
        jax.block_until_ready(fn(*args))
        return "no error"
    except jax.errors.ConcretizationTypeError as e:
        return type(e).__name__


print("int(n) on a tracer       ->", error_name(first_n_int, jnp.arange(10), 3))
print("if on a traced value     ->", error_name(jax.jit(nb01.scale_logits_python_if), logits, 0.7))
print("subclass of Concretization:", issubclass(jax.errors.TracerBoolConversionError, jax.errors.ConcretizationTypeError))

# %% [markdown]
# The fixes, each with its price:
#
# - the value decides a **shape** (a slice length): make it static,
#   `jax.jit(first_n, static_argnames="n")`. It is then part of the cache key: one compile per value;
# - the value decides a **branch**: keep it traced and use `jnp.where` (computes both sides, keeps
#   one) or `jax.lax.cond` (runs one side). One compile serves every value.

# %%
first_n_static = jax.jit(first_n, static_argnames="n")
print(first_n_static(jnp.arange(10), n=3))


# %% [markdown]
# ## On GPU and TPU
#
# The ideas carry over unchanged; the numbers move. A GPU or TPU finishes a one-token matmul in
# microseconds, so eager mode's per-operation launch and Python overhead weigh even more and `jit`
# wins by more on small calls. Dispatch is asynchronous there too, so forgetting
# `block_until_ready` is an even bigger lie. Compilation still happens once per shape, on the host
# CPU. Run this notebook on Colab to see your device's table.
#
# ## Summary
#
# - `jit` traces once per abstract signature (shapes, dtypes, weak types, static values) and
#   caches the compiled program; values never trigger a recompile.
# - Time with `block_until_ready`, and keep compile time apart from run time.
# - The gain of `jit` is not a constant "2-3x": it is largest when each call does little work, like
#   a decode step, shrinks when big matmuls dominate, and is nothing for one large matmul. The same holds
#   for "the first call is slower": true of a model, barely of a matmul.
# - A compiled call with known shapes runs no Python at all (jax's C++ dispatch); a new shape runs
#   jax's Python again, to trace and compile.
# - Randomness needs explicit `jax.random` keys; traced values cannot drive Python `if`, `int()` or
#   slice lengths; JAX's errors have real names (`ConcretizationTypeError`, ...), `TracebackError` is
#   not one of them.
#
# **Quiz**
#
# 1. A jitted function is called with `jnp.ones(4)`, then with `jnp.zeros(4)`. Does the second call
#    compile? And with `jnp.ones(4, jnp.int32)`?
#    <details><summary>Answer</summary>New values of the same shape and dtype reuse the program: no
#    compile. An int32 array is a new dtype, hence a new abstract signature: it compiles.</details>
# 2. Why does a timer around `f(x)` without `block_until_ready` report an impossibly fast matmul?
#    <details><summary>Answer</summary>Dispatch is asynchronous: `f(x)` returns once the work is queued,
#    so the timer measures the dispatch, not the computation.</details>
# 3. Why does `jit` speed up a one-token block several times but a single large matmul not at all?
#    <details><summary>Answer</summary>The block is hundreds of small operations, each paying a Python
#    dispatch in eager mode; jit runs them as one program. The matmul is one operation whose kernel is
#    the same either way, and its arithmetic dwarfs one dispatch.</details>
# 4. What goes wrong with `np.random.rand` inside a jitted function?
#    <details><summary>Answer</summary>NumPy runs once, at trace time; its numbers become a constant of
#    the compiled program, so every call returns the same "random" values.</details>
#
# ## Exercises
#
# Solutions are in `notebooks/solutions/01_jax_essentials.py`; try first.
#
# **1. RMSNorm.** Write a jittable `rms_norm(x, w, eps)` (x `[..., D]`, w `[D]`) equal to
# `jaxlab.engine.model.RMSNorm`: divide by the root of the mean square over the last axis (plus `eps`),
# in float32, then multiply by `w`.

# %%
def rms_norm(x, w, eps):
    raise NotImplementedError


_ = nb01.check_rms_norm(rms_norm)


# %% [markdown]
# **2. No Python `if` on a traced value.** Rewrite `nb01.scale_logits_python_if` (shown raising
# above) so that it works under `jax.jit` with the temperature *traced*: `logits / temperature` when
# `temperature > 0`, else greedy (0 at each row's maximum, `-inf` elsewhere). Use `jnp.where` or
# `jax.lax.cond`. The check also verifies that one compilation serves every temperature. (With
# `jnp.where`, mind that both branches are computed: what does `logits / 0.0` give?)

# %%
def scale_logits(logits, temperature):
    raise NotImplementedError


_ = nb01.check_scale_logits(scale_logits)

# %% [markdown]
# **3. Predict the compilations.** A fresh jitted function
#
# ```python
# def f(x, *, scale=2):
#     return jnp.tanh(x) * scale
#
# f = jax.jit(f, static_argnames="scale")
# ```
#
# is called as below, in this order (`np` is NumPy; JAX's default is 32-bit). How many of these calls
# compile? Answer with a number; the check runs the calls and counts.

# %%
for call, _ in nb01.QUIZ:
    print(call)
my_answer = None  # how many compilations?
_ = nb01.check_compile_count(my_answer)

# %% [markdown]
# **An experiment of your own.** Find the crossover: time `essentials.eager_vs_jit` on the block at
# 1, 8, 64 and 256 tokens and on matmuls of growing size, and plot the speed-up against the work per
# call. Where does `jit` stop paying for itself on your machine, and where would the article's 2-3x sit?
