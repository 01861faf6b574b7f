"""Generation: a bucketed, jit-compiled prefill and a fixed-shape decode step with a donated cache.

* **Prefill** runs the whole prompt in one call. Prompts are left-padded to a *bucket* length (32, 64,
  128, 256, 512 tokens), so a new prompt length reuses a compiled program instead of compiling a new one.
  Prompts longer than the largest bucket are prefilled in chunks of that size (chunked prefill).
* **Decode** feeds one token per row per step. Its shapes never change during a generation, and the
  KV cache is *donated* so XLA updates it in place instead of copying it every step.
* The cache length is bucketed too (256, 512, 1024, ... slots), so the number of compiled programs is
  small and known; :meth:`Generator.warmup` compiles them ahead of time and every later call runs
  without compiling (a test counts compilations to keep it so).
* Sampling (greedy, temperature, top-k, top-p, min-p) runs inside the jitted step with an explicit PRNG
  key: the same seed gives the same tokens.
* Stop on EOS (unless ``ignore_eos``) and on stop strings; optional log-probabilities of the chosen
  tokens (under the model's unscaled distribution); a streaming callback that receives text pieces
  which never split a UTF-8 character.

:func:`decode_on_device` is the other style: the whole decode loop inside one ``lax.fori_loop``,
no host round trip per token (no streaming or stop strings, which need the host).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from .errors import InvalidRequestError, PromptTooLongError
from .kvcache import KVCache, init_cache, left_pad
from .model import Params, forward
from .sampling import SamplingParams, sample

PREFILL_BUCKETS = (32, 64, 128, 256, 512)
CACHE_BUCKETS = (256, 512, 1024, 2048, 4096, 8192)


def bucket(n: int, buckets: Sequence[int]) -> int:
    """Smallest bucket >= n; past the largest, the next multiple of it."""
    for b in buckets:
        if n <= b:
            return b
    top = buckets[-1]
    return -(-n // top) * top


@dataclass
class GenerationResult:
    prompt_ids: list[int]
    generated_ids: list[int]
    text: str
    finish_reason: str  # "eos", "stop" (a stop string) or "length"
    logprobs: list[float] | None = None
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    compile_seconds: float = 0.0

    @property
    def tokens_per_second(self) -> float:
        return len(self.generated_ids) / self.decode_seconds if self.decode_seconds else float("nan")


# ------------------------------------------------------------------------------------------------
# The jitted pieces (pure functions of arrays)
# ------------------------------------------------------------------------------------------------


def _choose(logits, key, temperature, top_k, top_p, min_p, *, greedy: bool):
    """logits [B, V] -> (next tokens [B], their log-probabilities under the unscaled model [B])."""
    nxt = sample(logits, key, temperature, top_k, top_p, min_p, greedy=greedy)
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), nxt[:, None], axis=-1)[:, 0]
    return nxt, logp


def _prefill(params: Params, tokens, positions, cache: KVCache, key, *samp, greedy: bool):
    """Prompt chunk [B, T] -> (next tokens [B], their logprobs [B], cache).

    Sampling the first new token inside the prefill program means the first token needs one
    compiled program, not two (time to first token). For all but the last chunk it is ignored."""
    logits, cache = forward(params, tokens, positions, cache, last_only=True)
    return (*_choose(logits[:, 0], key, *samp, greedy=greedy), cache)


def _decode_step(params: Params, tokens, positions, cache: KVCache, key, *samp, greedy: bool):
    """One token per row: tokens, positions [B] -> (next tokens [B], their logprobs [B], cache).

    ``samp`` = (temperature, top_k, top_p, min_p) as traced scalars (``SamplingParams.arrays()``)."""
    logits, cache = forward(params, tokens[:, None], positions[:, None], cache)
    return (*_choose(logits[:, 0], key, *samp, greedy=greedy), cache)


class Generator:
    """Compiles and runs prefill and decode for one set of parameters.

    Compiled programs are kept per input signature (batch, bucket, cache length, greedy), compiled
    ahead of time with ``jit(...).lower(...).compile()``: the time spent compiling is measured exactly
    and reported with each result, and calls with a known signature never compile again."""

    def __init__(
        self,
        params: Params,
        tokenizer=None,
        *,
        prefill_buckets=PREFILL_BUCKETS,
        cache_buckets=CACHE_BUCKETS,
        cache_dtype=None,
    ):
        self.params = params
        self.tokenizer = tokenizer
        self.config = params.config
        self.prefill_buckets = tuple(prefill_buckets)
        self.cache_buckets = tuple(cache_buckets)
        self.cache_dtype = cache_dtype or params.policy.jnp_dtype
        self._jit_prefill = jax.jit(_prefill, donate_argnums=(3,), static_argnames=("greedy",))
        self._jit_decode = jax.jit(_decode_step, donate_argnums=(3,), static_argnames=("greedy",))
        self._compiled: dict[tuple, Callable] = {}
        self.compile_seconds_total = 0.0

    # -- compilation -------------------------------------------------------------------------

    def _get(self, name: str, jitted, args, static: dict | None = None):
        """The compiled program for these argument shapes; compiles (and times it) on first use."""
        leaves, treedef = jax.tree.flatten(args)  # the tree structure tells int8 from w8a8 parameters
        sig = (name, treedef, tuple((a.shape, str(a.dtype)) for a in leaves), tuple(sorted((static or {}).items())))
        fn = self._compiled.get(sig)
        compile_s = 0.0
        if fn is None:
            t0 = time.perf_counter()
            fn = jitted.lower(*args, **(static or {})).compile()
            compile_s = time.perf_counter() - t0
            self._compiled[sig] = fn
            self.compile_seconds_total += compile_s
        return fn, compile_s

    def plan(self, prompt_lens: Sequence[int], max_new_tokens: int) -> tuple[int, int, int]:
        """-> (padded prompt length, prefill chunk length, cache length) for these prompts."""
        longest = max(prompt_lens)
        context = self.config.max_seq_len
        if longest >= context:
            raise PromptTooLongError(
                f"the prompt has {longest} tokens, but the model's context is {context} (prompt plus new "
                f"tokens): shorten the prompt by at least {longest - context + 1} tokens"
            )
        if longest + max_new_tokens > context:
            raise PromptTooLongError(
                f"the prompt has {longest} tokens and {max_new_tokens} new tokens were asked for: "
                f"{longest + max_new_tokens} positions, but the model's context is {self.config.max_seq_len}; "
                f"shorten the prompt or ask for at most {max(self.config.max_seq_len - longest, 0)} new tokens"
            )
        chunk = min(bucket(longest, self.prefill_buckets), self.prefill_buckets[-1])
        padded = -(-longest // chunk) * chunk
        needed = padded + max_new_tokens
        cache_len = bucket(needed, self.cache_buckets)
        if cache_len > context:  # never allocate more slots than a full context needs (plus padding)
            cache_len = max(needed, context)
        return padded, chunk, cache_len

    def warmup(self, batch_sizes=(1,), prompt_lens=None, max_new_tokens=32, greedy=(True,)) -> float:
        """Compile the programs a session will need (one per prompt bucket); returns seconds spent."""
        before = self.compile_seconds_total
        for b in batch_sizes:
            for n in prompt_lens or self.prefill_buckets:
                for g in greedy:
                    sp = SamplingParams() if g else SamplingParams(temperature=1.0)
                    self.generate(
                        [[self.config.bos_id] * n] * b,
                        max_new_tokens=2,
                        sampling=sp,
                        ignore_eos=True,
                        _cache_for=max_new_tokens,
                    )
        return self.compile_seconds_total - before

    # -- generation --------------------------------------------------------------------------

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int = 32,
        sampling: SamplingParams | None = None,
        *,
        seed: int | None = 0,
        key: jax.Array | None = None,
        ignore_eos: bool = False,
        stop: Sequence[str] = (),
        logprobs: bool = False,
        on_text: Callable[[int, str], None] | None = None,
        _cache_for: int | None = None,
    ) -> list[GenerationResult]:
        """Generate for a batch of prompts (lists of token ids, any lengths).

        ``on_text(row, piece)`` is called as text arrives (needs a tokenizer). The PRNG key is
        ``key`` if given, else ``jax.random.key(seed)``."""
        sampling = sampling or SamplingParams()
        cfg = self.config
        prompts = [list(map(int, p)) for p in prompts]
        if not prompts:
            raise InvalidRequestError("no prompts given")
        if isinstance(max_new_tokens, bool) or int(max_new_tokens) != max_new_tokens or max_new_tokens < 1:
            raise InvalidRequestError(f"max_new_tokens must be a whole number >= 1, got {max_new_tokens}")
        for i, p in enumerate(prompts):
            if not p:
                raise InvalidRequestError(f"prompt {i} is empty: give at least one token")
            bad = [t for t in p if not 0 <= t < cfg.vocab_size]
            if bad:
                raise InvalidRequestError(
                    f"prompt {i} has token ids outside the vocabulary [0, {cfg.vocab_size}): {bad[:5]}"
                )
        if (stop or on_text) and self.tokenizer is None:
            raise InvalidRequestError("stop strings and streaming need a tokenizer: Generator(params, tokenizer)")
        if key is None:
            key = jax.random.key(0 if seed is None else seed)

        b = len(prompts)
        lens = [len(p) for p in prompts]
        padded, chunk, cache_len = self.plan(lens, _cache_for or max_new_tokens)
        tokens, positions = left_pad(prompts, cfg.pad_id, padded)

        compile_s = 0.0
        t0 = time.perf_counter()
        cache = init_cache(cfg, b, cache_len, self.cache_dtype)
        samp = sampling.arrays()
        key, sub = jax.random.split(key)
        for c in range(0, padded, chunk):
            args = (
                self.params,
                jnp.asarray(tokens[:, c : c + chunk]),
                jnp.asarray(positions[:, c : c + chunk]),
                cache,
                sub,
                *samp,
            )
            fn, cs = self._get("prefill", self._jit_prefill, args, {"greedy": sampling.greedy})
            compile_s += cs
            nxt, logp, cache = fn(*args)
        nxt_host = np.asarray(nxt)
        t_prefill = time.perf_counter() - t0 - compile_s

        out_ids = [[] for _ in range(b)]
        out_logp = [[] for _ in range(b)]
        finish = [None] * b
        # Text is tracked only when needed (streaming or stop strings). ``safe`` is the text of whole
        # characters so far; the last len(longest stop)-1 characters are held back from the stream so
        # that a stop string can still be cut out before any of it was sent.
        track = on_text is not None or bool(stop)
        if track:
            from .tokenizer import StreamDecoder

            decoders = [StreamDecoder(self.tokenizer) for _ in range(b)]
        safe, sent = [""] * b, [0] * b
        holdback = max((len(s) for s in stop), default=1) - 1

        def emit(i, upto):
            if on_text is not None and upto > sent[i]:
                on_text(i, safe[i][sent[i] : upto])
                sent[i] = upto

        pos = np.asarray(lens, np.int32)
        t1 = time.perf_counter()
        compile_before = compile_s
        for step in range(max_new_tokens):
            logp_host = np.asarray(logp) if logprobs else None
            for i in range(b):
                if finish[i]:
                    continue
                tok = int(nxt_host[i])
                if tok == cfg.eos_id and not ignore_eos:
                    finish[i] = "eos"
                    continue
                out_ids[i].append(tok)
                if logprobs:
                    out_logp[i].append(float(logp_host[i]))
                if track:
                    safe[i] += decoders[i].push(tok)
                    cut = _find_stop(safe[i], stop)
                    if cut is not None:
                        safe[i] = safe[i][:cut]
                        finish[i] = "stop"
                        continue
                    emit(i, len(safe[i]) - holdback)
                if len(out_ids[i]) >= max_new_tokens:
                    finish[i] = "length"
            if all(finish) or step == max_new_tokens - 1:
                break
            key, sub = jax.random.split(key)
            args = (self.params, nxt, jnp.asarray(pos), cache, sub, *samp)
            fn, cs = self._get("decode", self._jit_decode, args, {"greedy": sampling.greedy})
            compile_s += cs
            nxt, logp, cache = fn(*args)
            nxt_host = np.asarray(nxt)  # the host needs each token (EOS, stop strings, streaming)
            pos = pos + 1
        t_decode = time.perf_counter() - t1 - (compile_s - compile_before)

        results = []
        for i in range(b):
            if track and finish[i] != "stop":
                safe[i] += decoders[i].flush()
                cut = _find_stop(safe[i], stop)
                if cut is not None:
                    safe[i], finish[i] = safe[i][:cut], "stop"
            if track:
                emit(i, len(safe[i]))
                text = safe[i]
            else:
                text = self.tokenizer.decode(out_ids[i]) if self.tokenizer is not None else ""
            results.append(
                GenerationResult(
                    prompt_ids=prompts[i],
                    generated_ids=out_ids[i],
                    text=text,
                    finish_reason=finish[i] or "length",
                    logprobs=out_logp[i] if logprobs else None,
                    prefill_seconds=t_prefill,
                    decode_seconds=t_decode,
                    compile_seconds=compile_s,
                )
            )
        return results


def _find_stop(text: str, stop: Sequence[str]) -> int | None:
    hits = [text.find(s) for s in stop if s and s in text]
    return min(hits) if hits else None


def decode_on_device(
    params: Params,
    first_tokens,
    first_positions,
    cache: KVCache,
    steps: int,
    key=None,
    sampling: SamplingParams | None = None,
):
    """The whole decode loop on device: ``steps`` tokens for every row, one ``lax.fori_loop``.

    first_tokens, first_positions [B]; returns tokens [B, steps] and the cache. EOS is not checked
    (the loop has a fixed trip count), which is what a throughput benchmark wants."""
    sampling = sampling or SamplingParams()
    key = jax.random.key(0) if key is None else key
    samp = sampling.arrays()
    b = first_tokens.shape[0]

    def body(i, carry):
        tok, pos, cache, out, key = carry
        key, sub = jax.random.split(key)
        nxt, _, cache = _decode_step(params, tok, pos, cache, sub, *samp, greedy=sampling.greedy)
        out = jax.lax.dynamic_update_slice(out, nxt[:, None], (0, i))
        return nxt, pos + 1, cache, out, key

    out = jnp.zeros((b, steps), jnp.int32)
    out = jax.lax.dynamic_update_slice(out, first_tokens[:, None].astype(jnp.int32), (0, 0))
    carry = (first_tokens.astype(jnp.int32), first_positions.astype(jnp.int32), cache, out, key)
    _, _, cache, out, _ = jax.lax.fori_loop(1, steps, body, carry)
    return out, cache
