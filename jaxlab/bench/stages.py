"""The generation ladder: greedy decoding from the obvious loop to the fast one, each stage a small function that
measures itself the same way (:class:`Meter`), and :func:`measure_stages`, the bench's table of it.

Every stage is greedy and must give the same tokens; what changes is how much is recomputed and how often XLA
compiles:

1. :func:`naive_generate` - recompute the whole sequence every token with ``jit(forward)``. The
   sequence grows, so every token is a new input shape, and a new shape is a new compilation.
2. :func:`padded_generate` - the same recomputation inside a fixed-shape buffer whose length is a
   *bucket* (:func:`jaxlab.engine.plan.bucket`); unused slots hold position -1 (padding), so the mask hides
   them. One compilation serves every step and every prompt that fits the bucket.
3. :func:`cached_generate` - prefill the prompt once into a KV cache, then one decode step per token:
   the engine's own jitted steps (:mod:`jaxlab.engine.steps`, the cache donated so it is updated in
   place), which :class:`jaxlab.Generator` runs too. The host sees every token, as streaming and EOS
   checks need. ``jit=False`` runs the same step eagerly, op by op (:func:`greedy_decode_step`): the
   baseline for jit's speed-up.
4. :func:`on_device_generate` - prefill, then the whole loop in one ``lax.fori_loop``
   (:func:`jaxlab.engine.generate.decode_on_device`): no host round trip per token.

Each returns a :class:`StageRun` (tokens, number of compilations, compile seconds, run seconds, seconds per
decode step). Compilation is timed apart from execution with ahead-of-time compilation,
``jax.jit(f).lower(*args).compile()``, and compiled programs are kept per input signature (shapes and
dtypes, the very key ``jit`` caches on) in one table for the process (:data:`PROGRAMS`, the engine's
:class:`~jaxlab.engine.programs.Programs`), so a second call with a known signature compiles nothing.

Notebook 04 walks the ladder (through :mod:`jaxlab.lab.stages`, which adds its plots); ``jaxlab bench``
measures it at batch 1 with :func:`measure_stages`: eager, jit without a cache (stage 2), jit + KV cache
(stage 3), the whole loop on device (stage 4) and stage 3 in bfloat16, each repeated and its tokens checked
against the library's loop.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.bench.harness import Setup
from jaxlab.bench.options import Options
from jaxlab.bench.stats import first_divergence, summarize
from jaxlab.engine.generate import jit_decode_on_device
from jaxlab.engine.kvcache import KVCache, init_cache, left_pad
from jaxlab.engine.model import Params, cast_params, default_policy, forward
from jaxlab.engine.plan import CACHE_BUCKETS, PREFILL_BUCKETS, bucket
from jaxlab.engine.programs import Programs
from jaxlab.engine.steps import GREEDY, greedy_step, jit_decode, jit_prefill
from jaxlab.tools.profile import CompileCounter

#: Buffer lengths of the padded (recompute) stage: prompt + new tokens, rounded up to one of these.
SEQ_BUCKETS = (64, 128, 256, 512)


# --------------------------------------------------------------------------------------------------
# Compiled programs, kept per signature, and a meter that separates compiling from running
# --------------------------------------------------------------------------------------------------


#: Every stage's compiled programs, by signature, for the whole process.
PROGRAMS = Programs()


@dataclass
class Meter:
    """Counts compilations and accumulates compile and run seconds for one stage run."""

    compiles: int = 0  # programs compiled (XLA compile requests, including loads from the disk cache)
    from_disk: int = 0  # of those, loaded from the persistent compilation cache
    compile_s: float = 0.0  # trace + lower + compile
    run_s: float = 0.0  # synchronized execution

    def program(self, name: str, jitted, *args, **static) -> Callable:
        """The compiled program for these arguments (from :data:`PROGRAMS`); compiles it (timed, counted)
        if it is new."""
        with CompileCounter() as cc:
            fn, seconds = PROGRAMS.get(name, jitted, args, static)
        self.compile_s += seconds
        self.compiles += cc.count
        self.from_disk += cc.cache_hits
        return fn

    def run(self, fn: Callable, *args):
        """``fn(*args)``, waited for (JAX dispatches asynchronously), its seconds added to ``run_s``."""
        t0 = time.perf_counter()
        out = jax.block_until_ready(fn(*args))
        self.run_s += time.perf_counter() - t0
        return out


@dataclass
class StageRun:
    """What one stage produced and what it cost."""

    name: str
    tokens: list[int]
    compiles: int
    compile_s: float
    run_s: float
    from_disk: int = 0
    step_s: list[float] = field(default_factory=list)  # per-token seconds where the stage has a step

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second of execution (compilation excluded)."""
        return len(self.tokens) / self.run_s if self.run_s else float("nan")

    @property
    def tokens_per_s_with_compile(self) -> float:
        """Generated tokens per second when this run's compilation is counted too (the first request)."""
        total = self.run_s + self.compile_s
        return len(self.tokens) / total if total else float("nan")

    def row(self) -> dict:
        return {
            "stage": self.name,
            "tokens": len(self.tokens),
            "compiles": self.compiles,
            "compile s": self.compile_s,
            "run s": self.run_s,
            "tokens/s": self.tokens_per_s,
            "tokens/s incl. compile": self.tokens_per_s_with_compile,
        }


def _run(name: str, meter: Meter, tokens: list[int], step_s: list[float] | None = None) -> StageRun:
    return StageRun(
        name,
        [int(t) for t in tokens],
        meter.compiles,
        meter.compile_s,
        meter.run_s,
        meter.from_disk,
        list(step_s or []),
    )


# --------------------------------------------------------------------------------------------------
# The pure pieces the stages jit
# --------------------------------------------------------------------------------------------------


def next_from_full(params: Params, tokens, positions, last):
    """Recompute everything: tokens, positions [1, L] -> argmax of the logits at index ``last`` [1]."""
    logits, _ = forward(params, tokens, positions)  # [1, L, V]
    row = jax.lax.dynamic_index_in_dim(logits, last, axis=1, keepdims=False)  # [1, V]
    return jnp.argmax(row, axis=-1).astype(jnp.int32)


def greedy_decode_step(params: Params, token, pos, cache: KVCache):
    """One greedy decode step: token, pos [B] int -> (next token [B] int32, updated cache).

    The token is written into the cache at slot ``cache.index``; attention reads every slot whose
    position lies in [0, pos]. This is the function the notebook-04 exercise asks you to write; here it
    is the engine's greedy step (:func:`jaxlab.engine.steps.greedy_step`) without its logits."""
    nxt, _, cache = greedy_step(params, token, pos, cache)
    return nxt, cache


_jit_next_from_full = jax.jit(next_from_full)


# --------------------------------------------------------------------------------------------------
# Padding
# --------------------------------------------------------------------------------------------------


def pad_to_bucket(ids: Sequence[int], buckets: Sequence[int], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """One prompt, left-padded to the smallest bucket that holds it -> (tokens [L], positions [L]) int32.

    Padding tokens are ``pad_id`` at position -1; the prompt's tokens sit at positions 0..n-1 at the
    right end. This is the function the notebook-04 exercise asks you to write."""
    tokens, positions = left_pad([list(ids)], pad_id, bucket(len(ids), buckets))
    return tokens[0], positions[0]


# --------------------------------------------------------------------------------------------------
# The ladder: four stages (notebook 04), each a small function
# --------------------------------------------------------------------------------------------------


def naive_generate(params: Params, prompt_ids: Sequence[int], n: int) -> StageRun:
    """Stage 1: greedy by recomputing the whole, growing sequence each token (no cache, no padding).

    Each token makes the input one longer: a new shape, so ``jit`` traces and compiles again."""
    meter, seq = Meter(), list(prompt_ids)
    for _ in range(n):
        tokens = jnp.asarray([seq], jnp.int32)  # [1, T]: T grows by one every token
        positions = jnp.arange(len(seq), dtype=jnp.int32)[None]
        last = jnp.int32(len(seq) - 1)
        fn = meter.program("naive", _jit_next_from_full, params, tokens, positions, last)
        seq.append(int(meter.run(fn, params, tokens, positions, last)[0]))
    return _run("1 naive: recompute, new shape per token", meter, seq[len(prompt_ids) :])


def padded_generate(
    params: Params, prompt_ids: Sequence[int], n: int, buckets: Sequence[int] = SEQ_BUCKETS
) -> StageRun:
    """Stage 2: the same recomputation in a fixed-shape buffer of ``bucket(len(prompt) + n)`` slots.

    The prompt sits at the left, unused slots hold position -1 (masked). The buffer's shape never
    changes, so one compiled program serves every step, and every prompt in the same bucket."""
    cfg = params.config
    t = len(prompt_ids)
    length = bucket(t + n, buckets)
    tokens = np.full((1, length), cfg.pad_id, np.int32)
    positions = np.full((1, length), -1, np.int32)
    tokens[0, :t], positions[0, :t] = prompt_ids, np.arange(t)
    meter, out, step_s = Meter(), [], []
    for i in range(n):
        args = (params, jnp.asarray(tokens), jnp.asarray(positions), jnp.int32(t + i - 1))
        fn = meter.program("padded", _jit_next_from_full, *args)
        before = meter.run_s
        nxt = int(meter.run(fn, *args)[0])
        step_s.append(meter.run_s - before)
        tokens[0, t + i], positions[0, t + i] = nxt, t + i
        out.append(nxt)
    return _run(f"2 padded to {length}: recompute, fixed shape", meter, out, step_s)


def _prefill(params: Params, prompt_ids: Sequence[int], n: int, meter: Meter, cache_buckets=CACHE_BUCKETS):
    """Left-pad the prompt to its prefill bucket, run it once (the engine's prefill step, greedy)
    -> (first token [1], cache)."""
    cfg = params.config
    tokens, positions = pad_to_bucket(prompt_ids, PREFILL_BUCKETS, cfg.pad_id)
    cache = init_cache(cfg, 1, bucket(len(tokens) + n, cache_buckets), params.policy.jnp_dtype)
    args = (params, jnp.asarray(tokens[None]), jnp.asarray(positions[None]), cache, None, GREEDY)
    fn = meter.program("prefill", jit_prefill, *args)
    tok, _, cache = meter.run(fn, *args)
    return tok, cache


def cached_generate(
    params: Params, prompt_ids: Sequence[int], n: int, *, jit: bool = True, cache_buckets: Sequence[int] = CACHE_BUCKETS
) -> StageRun:
    """Stage 3: prefill once, then one decode step per token (the engine's jitted step, greedy), the loop
    on the host.

    ``jit=False`` runs the decode step eagerly (op by op, each op dispatched from Python); its first
    step, which compiles every op's small program, is counted as compile time."""
    meter = Meter()
    tok, cache = _prefill(params, prompt_ids, n, meter, cache_buckets)
    out, step_s = [int(tok[0])], []
    pos = np.array([len(prompt_ids)], np.int32)
    for i in range(n - 1):
        if jit:
            args = (params, tok, jnp.asarray(pos), cache, None, GREEDY)
            fn = meter.program("decode", jit_decode, *args)
            before = meter.run_s
            tok, _, cache = meter.run(fn, *args)
            step_s.append(meter.run_s - before)
        else:
            t0 = time.perf_counter()
            with CompileCounter() as cc:
                tok, cache = jax.block_until_ready(greedy_decode_step(params, tok, jnp.asarray(pos), cache))
            seconds = time.perf_counter() - t0
            if i == 0:  # the first eager call compiles each op's program: that is its "compile"
                meter.compiles += cc.count
                meter.from_disk += cc.cache_hits
                meter.compile_s += seconds
            else:
                meter.run_s += seconds
                step_s.append(seconds)
        out.append(int(tok[0]))  # the host reads every token (streaming, EOS)
        pos = pos + 1
    name = "3 cached: jitted step, host loop" if jit else "3e cached: eager step (no jit)"
    return _run(name, meter, out, step_s)


def on_device_generate(
    params: Params, prompt_ids: Sequence[int], n: int, cache_buckets: Sequence[int] = CACHE_BUCKETS
) -> StageRun:
    """Stage 4: prefill, then every decode step inside one ``lax.fori_loop`` on the device."""
    meter = Meter()
    tok, cache = _prefill(params, prompt_ids, n, meter, cache_buckets)
    args = (params, tok, jnp.asarray([len(prompt_ids)], jnp.int32), cache)
    fn = meter.program("on_device", jit_decode_on_device, *args, steps=n)
    before = meter.run_s
    out, _ = meter.run(fn, *args)
    return _run("4 on device: whole loop in fori_loop", meter, np.asarray(out)[0].tolist(), [meter.run_s - before])


# --------------------------------------------------------------------------------------------------
# The bench's table: the ladder at batch 1, repeated, against the library's tokens
# --------------------------------------------------------------------------------------------------


def measure_stages(opts: Options, setup: Setup, ref_tokens: list[int]) -> list[dict]:
    """Decode at batch 1, five ways, each run ``opts.reps`` times through the ladder's own functions: tokens/s
    over its timed decode steps (prefill and compilation excluded, :attr:`StageRun.step_s`) and what it compiled;
    its tokens are checked against ``ref_tokens``, the library's loop (float32 stages must agree)."""
    P, N, reps = opts.prompt_len, opts.new_tokens, opts.reps
    params, row0, log = setup.params, setup.rows[0], setup.log

    def measured(label: str, stage: Callable[[], StageRun], timed: int, note: str, dtype: str = "float32") -> dict:
        """The stage run ``reps`` times -> its row; ``timed``: the decode steps in each run's ``step_s``."""
        runs = []
        for rep in range(reps):
            log(f"stage {label}: rep {rep + 1}/{reps}")
            runs.append(stage())
        tokens = runs[-1].tokens
        n = min(len(tokens), len(ref_tokens))
        d = first_divergence([tokens[:n]], [ref_tokens[:n]])
        return {
            "stage": label,
            "tokens_timed": timed,
            "tokens_per_s": summarize([timed / sum(r.step_s) for r in runs]),
            "compile_s": runs[0].compile_s,  # what the first run compiled (0.0: its programs were compiled before)
            "tokens_match": f"yes ({n} tokens)" if d is None else f"differs from token {d[1]}",
            "note": note,
            "_compile_log": [
                {"function": f"{label} (stages)", "batch": 1, "tokens": P, "cache_len": None,
                 "seconds": runs[0].compile_s, "dtype": dtype}
            ],
        }  # fmt: skip

    # stage 3 first: it compiles the prefill program that the eager and on-device stages reuse, so that the
    # eager stage's first call compiles only its own ops
    cached = measured(
        "jit + KV cache (host loop)",
        lambda: cached_generate(params, row0, N),
        N - 1,
        "stage 3: one compiled decode step per token (the engine's, which Generator runs), donated cache, "
        "token to host each step",
    )
    k_eager = max(1, min(opts.eager_steps, (N - 1) // (reps + 1)))
    eager = measured(
        "eager (no jit)",
        lambda: cached_generate(params, row0, k_eager + 2, jit=False),
        k_eager,
        "stage 3's decode step op by op (no jax.jit around it); the first call, which compiles each op for its "
        "shapes, is reported instead of a compile",
    )
    eager["first_call_s"], eager["compile_s"] = eager["compile_s"], None
    del eager["_compile_log"]
    k_padded = max(1, min(opts.nocache_steps, (N - 1) // (reps + 1)))
    padded = measured(
        "jit, no cache",
        lambda: padded_generate(params, row0, k_padded, buckets=(P + N,)),
        k_padded,
        f"stage 2: one compiled forward over a fixed buffer of {P + N} tokens (prompt + new), recomputed per token",
    )
    on_device = measured(
        "whole loop on device",
        lambda: on_device_generate(params, row0, N),
        N - 1,
        "stage 4 (decode_on_device): one lax.fori_loop over N - 1 steps, tokens to host once at the end",
    )
    # bfloat16; fewer tokens: XLA's CPU bf16 matrix-vector products are slow, and decode speed at batch 1 hardly
    # depends on the context length
    k_bf16 = max(1, min(opts.bf16_steps, N - 1))
    params16 = cast_params(params, default_policy("bfloat16"))
    bf16 = measured(
        "bfloat16 (jit + KV cache)",
        lambda: cached_generate(params16, row0, k_bf16 + 1),
        k_bf16,
        "stage 3 on cast_params(params, default_policy('bfloat16')): bf16 weights, activations and KV cache",
        dtype="bfloat16",
    )
    if not bf16["tokens_match"].startswith("yes"):
        bf16["tokens_match"] += " (expected: bf16 rounding)"
    return [eager, padded, cached, on_device, bf16]
