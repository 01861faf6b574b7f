"""Speculative decoding: guess k tokens cheaply, check them all in one forward pass of the model.

A decode step at batch 1 is memory-bound: it reads every weight to produce one token. Feeding k+1
tokens through the same step reads the weights once too, so checking k guessed tokens costs about
as much as producing one token, *if* the step stays memory-bound. Each round:

1. **draft** k tokens ``d_1..d_k`` after the last accepted token ``x``, cheaply:

   * ``"ngram"`` (prompt lookup): find the context's last 3-gram (else 2-gram) earlier in the context
     and propose the k tokens that followed it there (free, and good when the reply copies from the
     prompt); when no row finds one, the round is a plain one-token decode step instead;
   * ``"draft"``: a smaller model: the first L layers of the same model (plus its final norm and
     tied output embedding), run k steps with its own KV cache. It is the model's own forward pass cut
     early (``forward(..., upto=L)``): no copy of the weights; with a draft dtype ("bfloat16") it is a
     cast copy of those L layers (:func:`draft_params`).
     :func:`jaxlab.lab.speculation.early_exit_agreement` measures how well each L would guess.

2. **verify**: one forward pass of the target model on ``[x, d_1..d_k]`` at positions ``p..p+k``
   (fixed shape ``[B, k+1]``, one compiled program whatever the acceptance) gives its own choice at
   every position. Greedy: keep the longest prefix of drafts that equals the model's argmax, plus the
   model's token after it (the correction, or a bonus token when all k were right): 1 to k+1 tokens
   per target call, always exactly the tokens plain greedy decoding would produce.

3. **roll back** the KV cache to the accepted length (:func:`jaxlab.engine.kvcache.rollback`: the write
   index moves back and rejected slots are marked empty, so no later query can see them).

Sampling uses the standard rejection rule (Leviathan et al. 2023; Chen et al. 2023), which keeps the
target distribution exactly: accept a draft token ``d ~ q`` with probability ``min(1, p(d) / q(d))``;
on rejection draw from ``normalize(max(0, p - q))``; if all k are accepted draw a bonus token from
``p``. An n-gram draft is a point mass (``q = one_hot(d)``). See :func:`speculative_sample`; :func:`accept`
is the rule a verify call applies.

**Batches.** The cache has one write index for all rows, so all rows must advance by the same number
of tokens per round. We accept the *minimum* count across the (unfinished) rows: every row's emitted
tokens are still exactly its own greedy tokens (a row that accepted more just re-derives the rest in
the next round), and for sampling the stopping point depends only on other rows' independent draws,
so each row's distribution is unchanged. The price: the batch advances at the pace of its worst row,
and a bigger batch makes the verify step less memory-bound, so the gain shrinks as the batch grows.

The draft model's cache is kept in step with the target's without any variable-length call: every
draft round starts by feeding the two tokens ``[previous, x]`` (positions ``p-1, p``), rewriting
the previous token's slot, which fills it in the one case where it was never fed (all k accepted).

:class:`SpeculativeDecoder` is built from the step toolkit: :func:`~jaxlab.engine.plan.check_request` and
:func:`~jaxlab.engine.plan.plan` for the request, :class:`~jaxlab.engine.programs.Programs` for its compiled
programs (one table shared by every decoder, so acceptance and new decoders never recompile), the jitted
prefill, draft and verify steps of :mod:`jaxlab.engine.steps`, and
:class:`~jaxlab.engine.generate.TextStops` for EOS, stop strings, streaming and the results.
:func:`speculative_generate` is the one-call API. Measuring it (acceptance and speed-up by task, the cost
model, the rounds drawn) is :mod:`jaxlab.lab.speculation`. Tests: ``tests/engine/test_speculative.py``.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.engine.generate import GenerationResult, start_request
from jaxlab.engine.kvcache import KVCache, init_cache, key_layout_for, left_pad
from jaxlab.engine.model import Params, Policy, cast_params, params_from_flat
from jaxlab.engine.plan import CACHE_BUCKETS, PREFILL_BUCKETS, Plan, plan
from jaxlab.engine.programs import Programs
from jaxlab.engine.sampling import Sampling, SamplingParams, filter_logits
from jaxlab.engine.steps import jit_draft, jit_prefill, jit_verify
from jaxlab.errors import InvalidRequestError

METHODS = ("ngram", "draft")
DEFAULT_K = 4
DEFAULT_DRAFT_LAYERS = 8

#: The compiled programs of every decoder (prefill, draft, verify), by signature: a second decoder for the
#: same shapes (a new ``speculative_generate`` call, a benchmark's decoder) compiles nothing.
PROGRAMS = Programs()


# --------------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------------


@dataclass
class SpecResult(GenerationResult):
    """One prompt's output (a :class:`~jaxlab.engine.generate.GenerationResult`) and the acceptance
    statistics of the run it was part of.

    ``proposed``/``accepted`` count this row's draft tokens and how many of them the target agreed with
    (before the batch's lockstep minimum); ``target_calls`` is the number of verify (or plain decode)
    calls of the target model after the prefill."""

    text: str = ""
    finish_reason: str = "length"
    method: str = "ngram"
    k: int = DEFAULT_K
    proposed: int = 0
    accepted: int = 0
    target_calls: int = 0
    draft_calls: int = 0
    compiles: int = 0  # programs compiled during this call (0 once warm: acceptance never changes a shape)
    #: one entry per verify call: (drafts or None, the target's k+1 tokens, this row's accepted count,
    #: the batch's accepted count, which decided how many tokens were emitted)
    rounds: list = field(default_factory=list, repr=False)

    @property
    def acceptance(self) -> float:
        """Fraction of proposed draft tokens the target agreed with (NaN when nothing was proposed)."""
        return self.accepted / self.proposed if self.proposed else float("nan")

    @property
    def rate(self) -> float:  # the brief's name for it
        return self.acceptance

    @property
    def tokens_per_call(self) -> float:
        """Tokens per call of the target model in the decode phase (after the prefill, which makes the
        first token): plain decoding makes 1, speculative decoding 1 to k+1."""
        n = len(self.generated_ids) - 1
        return n / self.target_calls if self.target_calls else float("nan")

    @property
    def tokens_per_second(self) -> float:
        """Decode speed: tokens after the first (the prefill makes that one) per decode second."""
        n = len(self.generated_ids) - 1
        return n / self.decode_seconds if self.decode_seconds > 0 and n > 0 else float("nan")


# --------------------------------------------------------------------------------------------------
# Drafters
# --------------------------------------------------------------------------------------------------


def ngram_propose(context: Sequence[int], k: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int] | None:
    """Prompt lookup: the k tokens that followed the most recent earlier occurrence of the context's
    last n-gram (longest n first, ``max_ngram`` down to ``min_ngram``); None if no n-gram recurs.

    If fewer than k tokens follow the match, the proposal is padded by repeating its last token
    (verification rejects whatever is wrong, so padding only costs acceptance)."""
    ctx = np.asarray(context, np.int64)
    length = len(ctx)
    for n in range(max_ngram, min_ngram - 1, -1):
        if length <= n:
            continue
        # windows starting at 0 .. length-1-n: each is followed by at least one token, and the
        # suffix itself (starting at length-n) is excluded
        windows = np.lib.stride_tricks.sliding_window_view(ctx[:-1], n)
        hits = np.flatnonzero((windows == ctx[-n:]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            proposal = ctx[start : start + k].tolist()
            return proposal + [proposal[-1]] * (k - len(proposal))
    return None


_DRAFT_CACHE: "weakref.WeakKeyDictionary[Params, dict]" = weakref.WeakKeyDictionary()


def check_draft_layers(params: Params, layers: int | None) -> int:
    """The number of draft layers (None: all of them), or an :class:`InvalidRequestError` naming the range."""
    n = params.config.n_layers
    layers = n if layers is None else layers
    if isinstance(layers, bool) or int(layers) != layers or not 1 <= layers <= n:
        raise InvalidRequestError(f"draft layers must be in [1, {n}], got {layers}")
    return int(layers)


def draft_params(params: Params, layers: int | None = None, dtype: str | None = None) -> Params:
    """A draft model made from the target's own weights, no training, as separate parameters: its first
    ``layers`` blocks (with the final norm and the output embedding), optionally cast to ``dtype``
    ("bfloat16": a lower-precision copy of float parameters). ``layers=None`` keeps every layer. Quantized
    parameters (:mod:`jaxlab.quant`) give a draft with the same quantized matrices. Cached per (params,
    layers, dtype). :class:`SpeculativeDecoder` needs it only for a draft dtype: otherwise it runs the
    target's own weights with ``forward(..., upto=layers)``, which copies nothing."""
    cfg = params.config
    layers = check_draft_layers(params, layers)
    policy = params.policy
    if dtype is not None and dtype != policy.dtype and params.quant is not None:
        raise InvalidRequestError(
            f"a {dtype} draft is a cast of float parameters; these are quantized ({params.quant}): drop the draft dtype"
        )
    per = _DRAFT_CACHE.setdefault(params, {})
    key = (layers, dtype)
    if key not in per:
        flat = {n: a for n, a in params.flat().items() if not n.startswith("layers.") or int(n.split(".")[1]) < layers}
        small = params_from_flat(cfg.replace(n_layers=layers, name=f"{cfg.name}-first{layers}"), flat, policy)
        if dtype is not None and dtype != policy.dtype:
            small = cast_params(small, Policy(dtype, "default" if dtype != "float32" else "highest"))
        per[key] = small
    return per[key]


# --------------------------------------------------------------------------------------------------
# The acceptance rules (pure, jittable)
# --------------------------------------------------------------------------------------------------


def leading_accepted(accepted: jax.Array) -> jax.Array:
    """accepted [..., k] bool -> number of leading True values [...] int32."""
    return jnp.sum(jnp.cumprod(accepted.astype(jnp.int32), axis=-1), axis=-1).astype(jnp.int32)


def greedy_accept(drafts: jax.Array, logits: jax.Array) -> tuple[jax.Array, jax.Array]:
    """drafts [B, k], logits [B, k+1, V] -> (the model's tokens [B, k+1], accepted count [B]).

    ``out[:, j]`` is the target's greedy token after ``[x, d_1..d_j]``; the first ``n`` drafts equal
    it, so ``out[:, :n+1]`` are exactly the next n+1 greedy tokens."""
    out = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return out, leading_accepted(out[:, :-1] == drafts)


def speculative_sample(p: jax.Array, q: jax.Array, drafts: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The rejection rule that keeps the target distribution.

    p [..., k+1, V]: target probabilities after ``[x, d_1..d_j]`` for j = 0..k;
    q [..., k, V]: the draft's probabilities, from which ``drafts`` [..., k] were drawn.
    Returns (out [..., k+1], accepted [..., k] bool): ``out[j]`` is ``d_j`` if accepted (probability
    ``min(1, p(d_j)/q(d_j))``), else a draw from ``normalize(max(0, p_j - q_j))``; ``out[k]`` is a
    draw from ``p_k`` (the bonus token). Emit ``out[:n+1]`` with n the number of leading accepts;
    each emitted token is then distributed exactly as ``p`` given the tokens before it."""
    k = drafts.shape[-1]
    k_u, k_res, k_bonus = jax.random.split(key, 3)
    p_k = p[..., :k, :]
    pd = jnp.take_along_axis(p_k, drafts[..., None], axis=-1)[..., 0]
    qd = jnp.take_along_axis(q, drafts[..., None], axis=-1)[..., 0]
    u = jax.random.uniform(k_u, drafts.shape)
    accepted = u * qd < pd  # u < p/q without dividing (q(d) > 0 since d was drawn from q)
    residual = jnp.maximum(p_k - q, 0.0)
    mass = residual.sum(-1, keepdims=True)
    # p == q leaves no residual; then rejection has probability 0 and any fallback will do
    residual = jnp.where(mass > 0, residual / jnp.where(mass > 0, mass, 1.0), p_k)
    resampled = jax.random.categorical(k_res, jnp.log(residual), axis=-1).astype(jnp.int32)
    bonus = jax.random.categorical(k_bonus, jnp.log(p[..., k, :]), axis=-1).astype(jnp.int32)
    out = jnp.concatenate([jnp.where(accepted, drafts, resampled), bonus[..., None]], axis=-1)
    return out, accepted


def accept(logits: jax.Array, drafts: jax.Array, q, key: jax.Array, sampling: Sampling) -> tuple[jax.Array, jax.Array]:
    """The rule a verify call applies (:func:`jaxlab.engine.steps.verify_step`): logits [B, k+1, V] of the
    target after each prefix of ``[x, d_1..d_k]``, drafts [B, k], q [B, k, V] (None: point-mass drafts,
    as n-grams are) -> (tokens [B, k+1], accepted count [B]). Greedy: :func:`greedy_accept`; sampling:
    :func:`speculative_sample` on the filtered distributions the plain sampler draws from."""
    if sampling.greedy:
        return greedy_accept(drafts, logits)
    p = jax.nn.softmax(filter_logits(logits, sampling), axis=-1)
    if q is None:
        q = jax.nn.one_hot(drafts, p.shape[-1], dtype=p.dtype)
    out, acc = speculative_sample(p, q, drafts, key)
    return out, leading_accepted(acc)


# --------------------------------------------------------------------------------------------------
# The decoder
# --------------------------------------------------------------------------------------------------


@dataclass
class SpeculativeDecoder:
    """Speculative generation for one set of parameters; compiled programs are shared by every call
    with the same shapes (batch, prompt bucket, cache length, k), so acceptance never recompiles.

    ``method``: "ngram" (prompt lookup, n-grams from ``max_ngram`` down to ``min_ngram``) or "draft"
    (the first ``draft_layers`` layers of the model: ``forward(..., upto=draft_layers)`` on the target's
    own weights, or a cast copy of them in ``draft_dtype``). When no row finds an n-gram, the round is a
    plain one-token decode step instead of a verify call: on a CPU a verify call of k+1 tokens costs
    clearly more than a decode step, so a weak guess is not worth checking."""

    params: Params
    tokenizer: object = None
    method: str = "ngram"
    k: int = DEFAULT_K
    draft_layers: int = DEFAULT_DRAFT_LAYERS
    draft_dtype: str | None = None
    max_ngram: int = 3
    min_ngram: int = 2  # a single recurring token predicts little: no draft (a plain step) is cheaper
    prefill_buckets: tuple = PREFILL_BUCKETS
    cache_buckets: tuple = CACHE_BUCKETS
    programs: Programs = field(default=PROGRAMS, repr=False)

    def __post_init__(self):
        if self.method not in METHODS:
            raise InvalidRequestError(f"unknown speculative method {self.method!r}; choose one of {METHODS}")
        if isinstance(self.k, bool) or int(self.k) != self.k or self.k < 1:
            raise InvalidRequestError(f"draft k must be a whole number >= 1, got {self.k}")
        self.k = int(self.k)
        self.config = self.params.config
        self.dparams, self.draft_hooks = None, {}
        if self.method == "draft":
            layers = check_draft_layers(self.params, self.draft_layers)
            cast = self.draft_dtype is not None and self.draft_dtype != self.params.policy.dtype
            # the target's own weights cut after `layers` (nothing copied), or a cast copy of those layers
            self.dparams = draft_params(self.params, layers, self.draft_dtype) if cast else self.params
            self.draft_hooks = {"upto": layers}

    # -- the pieces of a generation, each one compiled program (public: lab.speculation times them) --

    def plan(self, prompt_lens: Sequence[int], max_new_tokens: int) -> Plan:
        """The shapes of a request, with k spare cache slots: a verify call writes k+1 tokens from the
        last accepted one on."""
        return plan(self.config, prompt_lens, max_new_tokens + self.k, self.prefill_buckets, self.cache_buckets)

    def init_caches(self, batch: int, cache_len: int) -> tuple[KVCache, KVCache | None]:
        """Empty caches for the target and (method "draft") the draft model, which has its own, of its depth."""
        dtype, attention = self.params.policy.jnp_dtype, self.params.policy.attention
        cache = init_cache(self.config, batch, cache_len, dtype, key_layout=key_layout_for(attention, dtype))
        if self.dparams is None:
            return cache, None
        dcfg = self.dparams.config.replace(n_layers=self.draft_hooks["upto"])
        dtype, attention = self.dparams.policy.jnp_dtype, self.dparams.policy.attention
        return cache, init_cache(dcfg, batch, cache_len, dtype, key_layout=key_layout_for(attention, dtype))

    def _run(self, name: str, jitted, args: tuple, static: dict):
        fn, _ = self.programs.get(name, jitted, args, static)
        return fn(*args)

    def prefill(self, tokens: np.ndarray, positions: np.ndarray, chunk: int, cache: KVCache, key, samp, draft=False):
        """Prefill the left-padded prompts [B, padded] chunk by chunk into the target's cache (or, with
        ``draft``, the draft model's) -> (the first new token [B], cache)."""
        params, hooks = (self.dparams, self.draft_hooks) if draft else (self.params, {})
        for c in range(0, tokens.shape[1], chunk):
            args = (params, jnp.asarray(tokens[:, c : c + chunk]), jnp.asarray(positions[:, c : c + chunk]), cache)
            nxt, _, cache = self._run("prefill", jit_prefill, (*args, key, samp), hooks)
        return nxt, cache

    def draft(self, prev, x, pos, dcache: KVCache, index: int, key, samp):
        """k draft tokens (:func:`jaxlab.engine.steps.draft_step`) -> (drafts [B, k], q or None, draft cache)."""
        args = (self.dparams, jnp.asarray(prev), jnp.asarray(x), jnp.asarray(pos), dcache, jnp.int32(index), key, samp)
        return self._run("draft", jit_draft, args, {"k": self.k, **self.draft_hooks})

    def verify(self, tokens, positions, cache: KVCache, index: int, q, key, samp):
        """One verify call (:func:`jaxlab.engine.steps.verify_step` with :func:`accept`) of ``tokens``
        [B, k+1] (or [B, 1]: a plain step) -> (tokens [B, k+1], accepted count [B], cache)."""
        args = (self.params, jnp.asarray(tokens), jnp.asarray(positions), cache, jnp.int32(index), q, key, samp)
        return self._run("verify", jit_verify, args, {"accept": accept})

    # -- generation --

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int = 32,
        sampling: SamplingParams | None = None,
        *,
        seed: int = 0,
        ignore_eos: bool = True,
        stop: Sequence[str] = (),
        on_text: Callable[[int, str], None] | None = None,
    ) -> list[SpecResult]:
        """Generate for a batch of prompts (lists of token ids). Greedy (the default) gives exactly the
        tokens of ``Generator(params).generate(prompts, max_new_tokens, ignore_eos=...)``; stop strings and
        streaming (``on_text(row, piece)``, needs a tokenizer) work as they do there."""
        before = len(self.programs)
        results = self._generate(prompts, max_new_tokens, sampling or SamplingParams(), seed, ignore_eos, stop, on_text)
        for r in results:
            r.compiles = len(self.programs) - before
        return results

    def _generate(self, prompts, max_new_tokens, sampling, seed, ignore_eos, stop, on_text):
        cfg, k = self.config, self.k
        prompts, rows = start_request(
            cfg, prompts, max_new_tokens, self.tokenizer, ignore_eos=ignore_eos, stop=stop, on_text=on_text
        )
        b = len(prompts)
        lens = [len(p) for p in prompts]
        shape = self.plan(lens, max_new_tokens)
        tokens, positions = left_pad(prompts, cfg.pad_id, shape.padded)
        samp = sampling.state()
        key = jax.random.key(seed)
        compiled_before = self.programs.compile_seconds_total

        t0 = time.perf_counter()
        key, sub = jax.random.split(key)
        cache, dcache = self.init_caches(b, shape.cache_len)
        nxt, cache = self.prefill(tokens, positions, shape.chunk, cache, sub, samp)
        if dcache is not None:
            _, dcache = self.prefill(tokens, positions, shape.chunk, dcache, sub, samp, draft=True)
        x = np.asarray(nxt)
        prefill_compile = self.programs.compile_seconds_total - compiled_before
        t_prefill = time.perf_counter() - t0 - prefill_compile

        proposed, accepted = [0] * b, [0] * b
        rounds = [[] for _ in range(b)]
        target_calls = draft_calls = 0
        for i in range(b):
            rows.push(i, int(x[i]))
        prev = tokens[:, -1].copy()  # the token before x: each row's last prompt token
        pos = np.asarray(lens, np.int32)  # position of x, per row
        index = shape.padded  # cache slot where x will be written (shared by the rows)
        t1 = time.perf_counter()
        while not rows.done:
            live = [i for i in range(b) if not rows.finish[i]]
            key, sub = jax.random.split(key)
            q = None
            if self.method == "ngram":
                drafts = np.repeat(x[:, None], k, axis=1).astype(np.int32)  # filler for rows with no match
                found = [False] * b
                for i in live:
                    prop = ngram_propose(prompts[i] + rows.ids[i], k, self.max_ngram, self.min_ngram)
                    if prop is not None:
                        drafts[i], found[i] = prop, True
                # nothing to propose in any row: a plain decode step (the same program with k = 0)
                feed = np.concatenate([x[:, None], drafts], axis=1) if any(found) else x[:, None]
            else:
                d, q, dcache = self.draft(prev, x, pos, dcache, index - 1, sub, samp)
                draft_calls += 1
                drafts = np.asarray(d)
                found = [True] * b
                feed = np.concatenate([x[:, None], drafts], axis=1)
            t = feed.shape[1]
            feed_pos = pos[:, None] + np.arange(t, dtype=np.int32)[None]
            out, n_rows, cache = self.verify(feed, feed_pos, cache, index, q, sub, samp)
            target_calls += 1
            out, n_rows = np.asarray(out), np.asarray(n_rows)
            n = int(min(n_rows[i] for i in live))  # lockstep: every row advances by the batch's minimum
            for i in live:
                checked = t > 1 and found[i]
                if checked:
                    proposed[i] += k
                    accepted[i] += int(n_rows[i])
                rounds[i].append((drafts[i].tolist() if checked else None, out[i].tolist(), int(n_rows[i]), n))
                rows.extend(i, out[i, : n + 1].tolist())
            prev = out[:, n - 1] if n > 0 else x
            x = out[:, n].copy()
            pos = pos + n + 1
            index += n + 1
        compile_s = self.programs.compile_seconds_total - compiled_before
        t_decode = time.perf_counter() - t1 - (compile_s - prefill_compile)

        return [
            SpecResult(
                **vars(r),
                method=self.method,
                k=k,
                proposed=proposed[i],
                accepted=accepted[i],
                target_calls=target_calls,
                draft_calls=draft_calls,
                rounds=rounds[i],
            )
            for i, r in enumerate(rows.results(prompts, t_prefill, t_decode, compile_s))
        ]

    def warmup(self, batch: int = 1, prompt_len: int = 32, max_new_tokens: int = 32, greedy: bool = True) -> float:
        """Compile every program a generation of this shape can need (prefill, draft, verify, and the
        plain step used when no n-gram recurs); returns the seconds it took."""
        t0 = time.perf_counter()
        sp = SamplingParams() if greedy else SamplingParams(temperature=1.0)
        prompt = [(i % 5) + 3 for i in range(prompt_len)]  # repetitive: the n-gram path drafts
        self.generate([prompt] * batch, max_new_tokens, sp)
        if self.method == "ngram":
            cache, _ = self.init_caches(batch, self.plan([prompt_len] * batch, max_new_tokens).cache_len)
            one = np.zeros((batch, 1), np.int32)
            jax.block_until_ready(self.verify(one, one, cache, 0, None, jax.random.key(0), sp.state()))
        return time.perf_counter() - t0


def speculative_generate(
    params: Params,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int = 32,
    *,
    method: str = "ngram",
    k: int = DEFAULT_K,
    draft_layers: int = DEFAULT_DRAFT_LAYERS,
    draft_dtype: str | None = None,
    ignore_eos: bool = True,
    tokenizer=None,
    sampling: SamplingParams | None = None,
    seed: int = 0,
    stop: Sequence[str] = (),
    on_text: Callable[[int, str], None] | None = None,
) -> list[SpecResult]:
    """Speculative generation in one call (see :class:`SpeculativeDecoder`): greedy by default, with
    exactly plain greedy's tokens; ``sampling`` switches to the rejection rule."""
    dec = SpeculativeDecoder(params, tokenizer, method=method, k=k, draft_layers=draft_layers, draft_dtype=draft_dtype)
    return dec.generate(prompts, max_new_tokens, sampling, seed=seed, ignore_eos=ignore_eos, stop=stop, on_text=on_text)
