"""Generation: a bucketed, jit-compiled prefill and a fixed-shape decode step with a donated cache.

The loop is built from the step toolkit: :func:`~jaxlab.engine.plan.check_request` and
:func:`~jaxlab.engine.plan.plan` (validation, bucketed shapes, chunked prefill),
:class:`~jaxlab.engine.programs.Programs` (one compiled program per signature, compile time measured)
and :mod:`~jaxlab.engine.steps` (the jitted prefill and decode steps, the cache donated).

* **Prefill** runs the whole prompt in one call, left-padded to a bucket length (chunks of the largest
  bucket for longer prompts).
* **Decode** feeds one token per row per step; its shapes never change during a generation, and the KV
  cache is donated so XLA updates it in place.
* :meth:`Generator.warmup` compiles the programs a session needs ahead of time; every later call runs
  without compiling (a test counts compilations to keep it so).
* Sampling (greedy, temperature, top-k, top-p, min-p) runs inside the jitted step with an explicit PRNG
  key: the same seed gives the same tokens.
* One host loop (:func:`host_loop`) for every batch generation: a :class:`Placement` says where the arrays live
  and which programs step them (:class:`OneDevice` here; :class:`~jaxlab.engine.sharding.Sharded` on a mesh).
* Stop on EOS (unless ``ignore_eos``) and on stop strings; optional log-probabilities of the chosen
  tokens (under the model's unscaled distribution); a streaming callback that receives text pieces
  which never split a UTF-8 character (:class:`TextStops`).

:func:`decode_on_device` is the other style: the whole decode loop inside one ``lax.fori_loop``,
no host round trip per token (no streaming or stop strings, which need the host);
``jit_decode_on_device`` is its jitted form (the cache donated).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.engine.kvcache import KVCache, init_cache, key_layout_for, left_pad
from jaxlab.engine.model import Params
from jaxlab.engine.plan import CACHE_BUCKETS, PREFILL_BUCKETS, Plan, check_request, plan
from jaxlab.engine.programs import Programs
from jaxlab.engine.sampling import SamplingParams
from jaxlab.engine.steps import decode_step, jit_decode, jit_prefill
from jaxlab.errors import InvalidRequestError


@dataclass
class GenerationResult:
    prompt_ids: list[int]
    generated_ids: list[int]
    text: str
    finish_reason: str  # "eos", "stop" (a stop string) or "length"
    logprobs: list[float] | None = None
    #: the prompt's time to the first token and the rest of the generation, neither counting compiles (Generator and
    #: the engine alike), and the compiles this call ran
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    compile_seconds: float = 0.0

    @property
    def tokens_per_second(self) -> float:
        return len(self.generated_ids) / self.decode_seconds if self.decode_seconds else float("nan")


class TextStops:
    """The host side of a generation: which rows have finished, their tokens, and the text streamed so far.

    Every loop (single device, mesh, speculative) feeds it the tokens each step produced with
    :meth:`push` (or a run of them with :meth:`extend`), and reads :meth:`results` at the end. Text is
    tracked only when needed (streaming or stop strings): ``safe`` is the text of whole characters so far,
    and the last ``len(longest stop) - 1`` characters are held back from the stream so that a stop string
    can still be cut out before any of it was sent."""

    def __init__(
        self,
        n_rows: int,
        tokenizer,
        eos_id: int,
        max_new_tokens: int,
        *,
        ignore_eos: bool = False,
        stop: Sequence[str] = (),
        on_text: Callable[[int, str], None] | None = None,
        logprobs: bool = False,
    ):
        if (stop or on_text) and tokenizer is None:
            raise InvalidRequestError("stop strings and streaming need a tokenizer: Generator(params, tokenizer)")
        self.tokenizer, self.eos_id, self.max_new_tokens = tokenizer, eos_id, max_new_tokens
        self.ignore_eos, self.stop, self.on_text, self.logprobs = ignore_eos, tuple(stop), on_text, logprobs
        self.ids = [[] for _ in range(n_rows)]
        self.logp = [[] for _ in range(n_rows)]
        self.finish: list[str | None] = [None] * n_rows
        self.track = on_text is not None or bool(stop)
        if self.track:
            from jaxlab.io.tokenizer import StreamDecoder

            self.decoders = [StreamDecoder(tokenizer) for _ in range(n_rows)]
        self.safe, self.sent = [""] * n_rows, [0] * n_rows
        self.holdback = max((len(s) for s in self.stop), default=1) - 1

    @property
    def done(self) -> bool:
        return all(self.finish)

    def _emit(self, i: int, upto: int) -> None:
        if self.on_text is not None and upto > self.sent[i]:
            self.on_text(i, self.safe[i][self.sent[i] : upto])
            self.sent[i] = upto

    def push(self, i: int, token: int, logp: float | None = None) -> bool:
        """Add one token to row ``i``; False once the row has finished (the token is then dropped)."""
        if self.finish[i]:
            return False
        if token == self.eos_id and not self.ignore_eos:
            self.finish[i] = "eos"
            return False
        self.ids[i].append(token)
        if self.logprobs:
            self.logp[i].append(float(logp))
        if self.track:
            self.safe[i] += self.decoders[i].push(token)
            cut = find_stop(self.safe[i], self.stop)
            if cut is not None:
                self.safe[i] = self.safe[i][:cut]
                self.finish[i] = "stop"
                return False
            self._emit(i, len(self.safe[i]) - self.holdback)
        if len(self.ids[i]) >= self.max_new_tokens:
            self.finish[i] = "length"
            return False
        return True

    def extend(self, i: int, tokens: Sequence[int], logps: Sequence[float] | None = None) -> bool:
        """Add several tokens to row ``i`` (a speculative round's accepted run), stopping where the row
        finishes; False once it has."""
        for j, token in enumerate(tokens):
            if not self.push(i, int(token), None if logps is None else logps[j]):
                return False
        return True

    def results(self, prompts, prefill_s: float = 0.0, decode_s: float = 0.0, compile_s: float = 0.0):
        """One :class:`GenerationResult` per row (flushing held-back text and finding a last stop string)."""
        out = []
        for i, prompt in enumerate(prompts):
            if self.track and self.finish[i] != "stop":
                self.safe[i] += self.decoders[i].flush()
                cut = find_stop(self.safe[i], self.stop)
                if cut is not None:
                    self.safe[i], self.finish[i] = self.safe[i][:cut], "stop"
            if self.track:
                self._emit(i, len(self.safe[i]))
                text = self.safe[i]
            else:
                text = self.tokenizer.decode(self.ids[i]) if self.tokenizer is not None else ""
            out.append(
                GenerationResult(
                    prompt_ids=list(prompt),
                    generated_ids=self.ids[i],
                    text=text,
                    finish_reason=self.finish[i] or "length",
                    logprobs=self.logp[i] if self.logprobs else None,
                    prefill_seconds=prefill_s,
                    decode_seconds=decode_s,
                    compile_seconds=compile_s,
                )
            )
        return out


def start_request(
    cfg, prompts: Sequence[Sequence[int]], max_new_tokens: int, tokenizer=None, **options
) -> tuple[list[list[int]], TextStops]:
    """The start every loop shares: the request checked (:func:`~jaxlab.engine.plan.check_request`) and its
    bookkeeping opened. ``options``: ``ignore_eos``, ``stop``, ``on_text``, ``logprobs`` of :class:`TextStops`."""
    prompts = check_request(cfg, prompts, max_new_tokens)
    return prompts, TextStops(len(prompts), tokenizer, cfg.eos_id, max_new_tokens, **options)


class Placement:
    """Where a generation's arrays live and which compiled programs step them: all that :func:`host_loop` needs.
    :class:`OneDevice` is the single-device :class:`Generator`'s; :class:`~jaxlab.engine.sharding.Sharded` is one
    for a mesh and a strategy. ``prefill`` and ``decode`` take host (NumPy) tokens and positions, or the previous
    call's device tokens, and return (next tokens, what logprobs are read from, the cache, seconds compiling)."""

    rows_multiple = 1  # the batch is padded (with copies of its first prompt) to a multiple of this

    def init_cache(self, batch: int, length: int) -> KVCache:
        raise NotImplementedError

    def prefill(self, tokens, positions, cache: KVCache) -> tuple:
        raise NotImplementedError

    def decode(self, tokens, positions, cache: KVCache) -> tuple:
        raise NotImplementedError

    def host_tokens(self, nxt) -> np.ndarray:
        """A step's next tokens -> [B] on the host."""
        return np.asarray(nxt)

    def host_logprobs(self, out, ids: np.ndarray) -> np.ndarray:
        """The logprobs [B] of ``ids`` from what a step returned beside them."""
        return np.asarray(out)

    def prompt_done(self, out, rows: int) -> None:
        """Called with the last prompt call's output and the number of real rows (a hook: Sharded keeps the
        prompt logits for parity checks)."""


def host_loop(
    placement: Placement,
    cfg,
    prompts: list[list[int]],
    max_new_tokens: int,
    rows: TextStops,
    shape: Plan,
    *,
    prefill: bool = True,
) -> list[GenerationResult]:
    """The one host loop of a batch generation (single device or a mesh): a cache, the prompt in bucketed chunks
    (``prefill=False``: one decode call per prompt column), then one decode call per token until every row has
    finished (``rows``: EOS, stop strings, streaming); timings separate compiling from running."""
    batch = prompts + [prompts[0]] * (-len(prompts) % placement.rows_multiple)  # copies, dropped by ``rows``
    lens = np.asarray([len(p) for p in batch], np.int32)
    compile_s, t0 = 0.0, time.perf_counter()
    cache = placement.init_cache(len(batch), shape.cache_len)
    if prefill:
        tokens, positions = left_pad(batch, cfg.pad_id, shape.padded)
        calls = [(placement.prefill, slice(c, c + shape.chunk)) for c in range(0, shape.padded, shape.chunk)]
    else:
        tokens, positions = left_pad(batch, cfg.pad_id)  # no bucket: every column is a call
        calls = [(placement.decode, c) for c in range(tokens.shape[1])]
    for call, cols in calls:
        nxt, out, cache, seconds = call(tokens[:, cols], positions[:, cols], cache)
        compile_s += seconds
    placement.prompt_done(out, len(prompts))
    ids = placement.host_tokens(nxt)  # the host needs each token (EOS, stop strings, streaming)
    t_prefill = time.perf_counter() - t0 - compile_s

    t1, compile_before, pos = time.perf_counter(), compile_s, lens  # pos: where each row's next token goes
    ahead = None
    for step in range(max_new_tokens):
        # the next decode call is launched before this step's tokens are read (it takes them on the device), so
        # the host's work on them (stops, streaming, the next call's dispatch) overlaps the device's next step
        ahead = placement.decode(nxt, pos, cache) if step < max_new_tokens - 1 else None
        if step:
            ids = placement.host_tokens(nxt)
        logp = placement.host_logprobs(out, ids) if rows.logprobs else [None] * len(ids)
        for i in range(len(prompts)):
            rows.push(i, int(ids[i]), logp[i])
        if rows.done or ahead is None:
            break
        nxt, out, cache, seconds = ahead
        compile_s += seconds
        pos = pos + 1
    t_decode = time.perf_counter() - t1 - (compile_s - compile_before)
    if ahead is not None:  # every row stopped early: the call launched for the next step is not needed
        compile_s += ahead[3]
        jax.block_until_ready(ahead[0])  # (not timed) so that it does not run into the caller's next work
    return rows.results(prompts, t_prefill, t_decode, compile_s)


class OneDevice(Placement):
    """The single-device placement: :class:`Generator`'s programs (sampling inside the step, an explicit key split
    once for the prompt and once per decode step)."""

    def __init__(self, gen: Generator, sampling: SamplingParams, key: jax.Array):
        self.gen, self.samp = gen, sampling.state()
        self.key, self.prompt_key = jax.random.split(key)

    def init_cache(self, batch: int, length: int) -> KVCache:
        gen = self.gen  # keys transposed for XLA:CPU's float32 matmuls (kvcache.key_layout_for)
        layout = key_layout_for(gen.params.policy.attention, gen.cache_dtype)
        return init_cache(gen.config, batch, length, gen.cache_dtype, key_layout=layout)

    def prefill(self, tokens, positions, cache):
        args = (self.gen.params, jnp.asarray(tokens), jnp.asarray(positions), cache, self.prompt_key, self.samp)
        fn, seconds = self.gen.programs.get("prefill", jit_prefill, args)
        return (*fn(*args), seconds)

    def decode(self, tokens, positions, cache):
        self.key, sub = jax.random.split(self.key)
        args = (self.gen.params, tokens, jnp.asarray(positions), cache, sub, self.samp)
        fn, seconds = self.gen.programs.get("decode", jit_decode, args)
        return (*fn(*args), seconds)


class Generator:
    """Compiles and runs prefill and decode for one set of parameters.

    Compiled programs are kept per input signature (batch, bucket, cache length, greedy) in a
    :class:`~jaxlab.engine.programs.Programs` cache: the time spent compiling is measured exactly and
    reported with each result, and calls with a known signature never compile again."""

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
        self.programs = Programs()

    @property
    def compile_seconds_total(self) -> float:
        return self.programs.compile_seconds_total

    def plan(self, prompt_lens: Sequence[int], max_new_tokens: int) -> Plan:
        """The padded prompt length, prefill chunk and cache length for these prompts."""
        return plan(self.config, prompt_lens, max_new_tokens, self.prefill_buckets, self.cache_buckets)

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
                        cache_for=max_new_tokens,
                    )
        return self.compile_seconds_total - before

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
        cache_for: int | None = None,
    ) -> list[GenerationResult]:
        """Generate for a batch of prompts (lists of token ids, any lengths).

        ``on_text(row, piece)`` is called as text arrives (needs a tokenizer). The PRNG key is
        ``key`` if given, else ``jax.random.key(seed)``. ``cache_for`` sizes the cache for that many
        new tokens instead of ``max_new_tokens`` (warm-up compiles the programs of a longer run)."""
        sampling = sampling or SamplingParams()
        cfg = self.config
        prompts, rows = start_request(
            cfg,
            prompts,
            max_new_tokens,
            self.tokenizer,
            ignore_eos=ignore_eos,
            stop=stop,
            on_text=on_text,
            logprobs=logprobs,
        )
        if key is None:
            key = jax.random.key(0 if seed is None else seed)
        shape = self.plan([len(p) for p in prompts], cache_for or max_new_tokens)
        return host_loop(OneDevice(self, sampling, key), cfg, prompts, max_new_tokens, rows, shape)


def find_stop(text: str, stop: Sequence[str]) -> int | None:
    """Where the first of the stop strings starts in ``text``, or None."""
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
    samp = sampling.state()
    b = first_tokens.shape[0]

    def body(i, carry):
        tok, pos, cache, out, key = carry
        key, sub = jax.random.split(key)
        nxt, _, cache = decode_step(params, tok, pos, cache, sub, samp)
        out = jax.lax.dynamic_update_slice(out, nxt[:, None], (0, i))
        return nxt, pos + 1, cache, out, key

    out = jnp.zeros((b, steps), jnp.int32)
    out = jax.lax.dynamic_update_slice(out, first_tokens[:, None].astype(jnp.int32), (0, 0))
    carry = (first_tokens.astype(jnp.int32), first_positions.astype(jnp.int32), cache, out, key)
    _, _, cache, out, _ = jax.lax.fori_loop(1, steps, body, carry)
    return out, cache


#: :func:`decode_on_device` jitted: ``steps`` and ``sampling`` static, the cache donated.
jit_decode_on_device = jax.jit(decode_on_device, static_argnames=("steps", "sampling"), donate_argnums=(3,))
