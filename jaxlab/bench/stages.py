"""Decode at batch 1, five ways, each timed and its tokens checked against the library's loop: eager (no
jit), jit without a cache, jit + KV cache (the :class:`~jaxlab.engine.generate.Generator` host loop), the
whole loop on device (:func:`~jaxlab.engine.generate.decode_on_device`) and bfloat16. Notebook 04 walks the
same road with :mod:`jaxlab.lab.stages`; this is the bench's measured table of it."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.bench.harness import Setup, timed_generator
from jaxlab.bench.options import Options
from jaxlab.bench.stats import first_divergence, summarize
from jaxlab.engine.generate import jit_decode_on_device
from jaxlab.engine.kvcache import init_cache
from jaxlab.engine.model import cast_params, default_policy
from jaxlab.engine.sampling import SamplingParams
from jaxlab.engine.steps import decode_step, jit_prefill, next_logits


def measure_stages(opts: Options, setup: Setup, ref_tokens: list[int]) -> list[dict]:
    """Decode at batch 1, five ways. Each returns tokens/s over its decode steps and its compile time;
    its tokens are checked against the jit + cache host loop (float32 stages must agree)."""
    P, N, reps = opts.prompt_len, opts.new_tokens, opts.reps
    params, gen, row0, cache_len, log = setup.params, setup.generator, setup.rows[0], setup.cache_len, setup.log
    cfg = params.config
    out = []

    def match(tokens):
        n = min(len(tokens), len(ref_tokens))
        d = first_divergence([tokens[:n]], [ref_tokens[:n]])
        return f"yes ({n} tokens)" if d is None else f"differs from token {d[1]}"

    # Stages 1 and 4 start from a cache prefilled by the library's prefill step (compiled once here for
    # this exact prompt), so only their decode is measured.
    samp, key = SamplingParams().state(), jax.random.key(0)  # greedy: the key is not used
    log("stages: compile a prefill program for the eager and on-device stages")
    ptoks, ppos = jnp.asarray([row0], jnp.int32), jnp.arange(P, dtype=jnp.int32)[None]
    t0 = time.perf_counter()
    prefill_c = jit_prefill.lower(params, ptoks, ppos, init_cache(cfg, 1, cache_len), key, samp).compile()
    compile_pre = time.perf_counter() - t0

    def prefill():
        nxt, _, cache = prefill_c(params, ptoks, ppos, init_cache(cfg, 1, cache_len), key, samp)
        return nxt, cache

    # 1. eager: the library's decode step without jit, op by op (few tokens; the prompt is prefilled by
    #    the compiled prefill)
    k = max(1, min(opts.eager_steps, (N - 1) // (reps + 1)))
    log(f"stage eager (no jit): {reps} x {k} decode steps, op by op")
    nxt, cache = prefill()
    toks, pos = [int(nxt[0])], P

    def eager_step(nxt, cache, pos):
        nxt, _, cache = decode_step(params, nxt, jnp.asarray([pos], jnp.int32), cache, key, samp)
        return nxt, cache

    t0 = time.perf_counter()
    nxt, cache = eager_step(nxt, cache, pos)
    toks.append(int(nxt[0]))
    pos += 1
    first_call = time.perf_counter() - t0
    times = []
    for rep in range(reps):
        log(f"stage eager: rep {rep + 1}/{reps}")
        t0 = time.perf_counter()
        for _ in range(k):
            nxt, cache = eager_step(nxt, cache, pos)
            toks.append(int(nxt[0]))  # host transfer = synchronization
            pos += 1
        times.append(time.perf_counter() - t0)
    out.append(
        {
            "stage": "eager (no jit)",
            "tokens_timed": k,
            "tokens_per_s": summarize([k / t for t in times]),
            "compile_s": None,
            "first_call_s": first_call,
            "tokens_match": match(toks),
            "note": "op-by-op decode step (steps.decode_step with the KV cache, no jax.jit around it); the first call, which "
            "compiles each op for its shapes, is reported instead of a compile",
        }
    )
    del cache

    # 2. jit, no cache: recompute the whole fixed-length window every token
    L = P + N
    k = max(1, min(opts.nocache_steps, (N - 1) // (reps + 1)))
    log(f"stage jit without cache: compile (window {L} tokens), then {reps} x {k} steps")

    def nocache_step(params, tokens, positions):
        logits, _ = next_logits(params, tokens, positions, None)
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)

    toks_np = np.full((1, L), cfg.pad_id, np.int32)
    pos_np = np.full((1, L), -1, np.int32)
    toks_np[0, L - P :] = row0
    pos_np[0, L - P :] = np.arange(P)
    jitted = jax.jit(nocache_step)
    t0 = time.perf_counter()
    compiled = jitted.lower(params, jnp.asarray(toks_np), jnp.asarray(pos_np)).compile()
    compile_nc = time.perf_counter() - t0
    toks = []

    def nc_step():
        nonlocal toks_np, pos_np
        nxt = int(compiled(params, jnp.asarray(toks_np), jnp.asarray(pos_np))[0])
        toks.append(nxt)
        nxt_pos = pos_np[0, -1] + 1
        toks_np = np.concatenate([toks_np[:, 1:], [[nxt]]], axis=1).astype(np.int32)
        pos_np = np.concatenate([pos_np[:, 1:], [[nxt_pos]]], axis=1).astype(np.int32)

    nc_step()  # warm-up (first token)
    times = []
    for rep in range(reps):
        log(f"stage jit without cache: rep {rep + 1}/{reps}")
        t0 = time.perf_counter()
        for _ in range(k):
            nc_step()
        times.append(time.perf_counter() - t0)
    out.append(
        {
            "stage": "jit, no cache",
            "tokens_timed": k,
            "tokens_per_s": summarize([k / t for t in times]),
            "compile_s": compile_nc,
            "tokens_match": match(toks),
            "note": f"one compiled forward over a fixed, left-padded window of {L} tokens, recomputed per token",
            "_compile_log": [
                {
                    "function": "nocache_step",
                    "batch": 1,
                    "tokens": L,
                    "cache_len": None,
                    "seconds": compile_nc,
                    "dtype": "float32",
                }
            ],
        }
    )

    # 3. + 4. jit + KV cache (the Generator's host loop) and the whole decode loop on device, measured
    #    back to back in each repetition so that both see the same machine state
    log("stage whole loop on device: compile the loop")
    loop = jit_decode_on_device
    first, cache = prefill()
    first_pos = jnp.asarray([P], jnp.int32)
    t0 = time.perf_counter()
    loop_c = loop.lower(params, first, first_pos, cache, steps=N).compile()
    compile_loop = time.perf_counter() - t0
    _, cache = loop_c(params, first, first_pos, cache)  # warm-up run
    jax.block_until_ready(cache)
    host_times, times, dev_tokens = [], [], None
    for rep in range(reps):
        log(f"stages jit + KV cache and whole loop on device: rep {rep + 1}/{reps}")
        host_times.append(gen.generate([row0], N, ignore_eos=True)[0].decode_seconds)
        first, cache = prefill()
        jax.block_until_ready((first, cache))
        t0 = time.perf_counter()
        toks_dev, cache = loop_c(params, first, first_pos, cache)
        toks_dev = np.asarray(toks_dev)  # host transfer = synchronization
        times.append(time.perf_counter() - t0)
        dev_tokens = toks_dev[0].tolist()
    del cache
    dec_compile = next(
        (c["seconds"] for c in gen.programs.compile_log if c["function"] == "decode" and c["batch"] == 1), None
    )
    out.append(
        {
            "stage": "jit + KV cache (host loop)",
            "tokens_timed": N - 1,
            "tokens_per_s": summarize([(N - 1) / t for t in host_times]),
            "compile_s": dec_compile,
            "tokens_match": "yes (reference)",
            "note": "Generator.generate: one compiled decode step per token, donated cache, token to host each "
            "step; re-measured here, back to back with the on-device loop",
        }
    )
    out.append(
        {
            "stage": "whole loop on device",
            "tokens_timed": N - 1,
            "tokens_per_s": summarize([(N - 1) / t for t in times]),
            "compile_s": compile_loop,
            "tokens_match": match(dev_tokens),
            "note": "decode_on_device: one lax.fori_loop over N - 1 steps, tokens to host once at the end",
            "_compile_log": [
                {
                    "function": "prefill (stages)",
                    "batch": 1,
                    "tokens": P,
                    "cache_len": cache_len,
                    "seconds": compile_pre,
                    "dtype": "float32",
                },
                {
                    "function": "on-device loop",
                    "batch": 1,
                    "tokens": N,
                    "cache_len": cache_len,
                    "seconds": compile_loop,
                    "dtype": "float32",
                },
            ],
        }
    )

    # 5. bfloat16 (Generator on bf16 weights and cache); fewer tokens: XLA's CPU bf16 matrix-vector
    #    products are slow, and decode speed at batch 1 hardly depends on the context length
    k = max(1, min(opts.bf16_steps, N - 1))
    log(f"stage bfloat16: cast weights, compile, warm-up ({k} decode steps per rep)")
    params16 = cast_params(params, default_policy("bfloat16"))
    gen16 = timed_generator(params16, setup.tokenizer)
    gen16.warmup(batch_sizes=[1], prompt_lens=[P], max_new_tokens=k + 1)
    times, toks16 = [], None
    for rep in range(reps):
        log(f"stage bfloat16: rep {rep + 1}/{reps}")
        r = gen16.generate([row0], k + 1, ignore_eos=True)[0]
        times.append(r.decode_seconds)
        toks16 = r.generated_ids
    d16 = first_divergence([toks16], [ref_tokens[: len(toks16)]])
    out.append(
        {
            "stage": "bfloat16 (jit + KV cache)",
            "tokens_timed": k,
            "tokens_per_s": summarize([k / t for t in times]),
            "compile_s": next((c["seconds"] for c in gen16.programs.compile_log if c["function"] == "decode"), None),
            "tokens_match": f"yes ({len(toks16)} tokens)"
            if d16 is None
            else f"differs from token {d16[1]} (expected: bf16 rounding)",
            "note": "cast_params(params, default_policy('bfloat16')): bf16 weights, activations and KV cache",
            "_compile_log": gen16.programs.compile_log,
        }
    )
    del params16, gen16
    return out
