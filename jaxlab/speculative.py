"""Speculative decoding: guess k tokens cheaply, check them all in one forward pass of the model.

A decode step at batch 1 is memory-bound: it reads every weight to produce one token. Feeding k+1
tokens through the same step reads the weights once too, so checking k guessed tokens costs about
as much as producing one token, *if* the step stays memory-bound. Each round:

1. **draft** k tokens ``d_1..d_k`` after the last accepted token ``x``, cheaply:

   * ``"ngram"`` (prompt lookup): find the context's last 3-gram (else 2-gram) earlier in the context
     and propose the k tokens that followed it there (free, and good when the reply copies from the
     prompt); when no row finds one, the round is a plain one-token decode step instead;
   * ``"draft"``: a smaller model: the first L layers of the same model (plus its final norm and
     tied output embedding; :func:`draft_params`), optionally cast to bfloat16 (a lower-precision
     copy), run k steps with its own KV cache. :func:`early_exit_agreement` measures how well each L
     would guess in one pass.

2. **verify**: one forward pass of the target model on ``[x, d_1..d_k]`` at positions ``p..p+k``
   (fixed shape ``[B, k+1]``, one compiled program whatever the acceptance) gives its own choice at
   every position. Greedy: keep the longest prefix of drafts that equals the model's argmax, plus the
   model's token after it (the correction, or a bonus token when all k were right): 1 to k+1 tokens
   per target call, always exactly the tokens plain greedy decoding would produce.

3. **roll back** the KV cache to the accepted length (:func:`jaxlab.kvcache.rollback`: the write
   index moves back and rejected slots are marked empty, so no later query can see them).

Sampling uses the standard rejection rule (Leviathan et al. 2023; Chen et al. 2023), which keeps the
target distribution exactly: accept a draft token ``d ~ q`` with probability ``min(1, p(d) / q(d))``;
on rejection draw from ``normalize(max(0, p - q))``; if all k are accepted draw a bonus token from
``p``. An n-gram draft is a point mass (``q = one_hot(d)``). See :func:`speculative_sample`.

**Batches.** The cache has one write index for all rows, so all rows must advance by the same number
of tokens per round. We accept the *minimum* count across the (unfinished) rows: every row's emitted
tokens are still exactly its own greedy tokens (a row that accepted more just re-derives the rest in
the next round), and for sampling the stopping point depends only on other rows' independent draws,
so each row's distribution is unchanged. The price: the batch advances at the pace of its worst row,
and a bigger batch makes the verify step less memory-bound, so the gain shrinks as the batch grows.

The draft model's cache is kept in step with the target's without any variable-length call: every
draft round starts by feeding the two tokens ``[previous, x]`` (positions ``p-1, p``), rewriting
the previous token's slot, which fills it in the one case where it was never fed (all k accepted).

:func:`speculative_generate` is the one-call API; :class:`SpeculativeDecoder` keeps its compiled
programs between calls; :func:`measure` produces the acceptance / speed-up rows by task type for
``jaxlab bench`` and notebook 10; :func:`step_costs` and :func:`expected_speedup` give the cost model
(speed-up = tokens per verify call / cost of a round, in plain decode steps).
Tests: ``tests/test_speculative.py``.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from .errors import InvalidRequestError
from .generate import CACHE_BUCKETS, PREFILL_BUCKETS, Generator
from .kvcache import KVCache, init_cache, left_pad, rollback
from .model import Params, Policy, cast_params, forward, params_from_flat, rope_cos_sin
from .profile import CompileCounter
from .sampling import SamplingParams, filter_logits, sample

METHODS = ("ngram", "draft")
DEFAULT_K = 4
DEFAULT_DRAFT_LAYERS = 8


# --------------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------------


@dataclass
class SpecResult:
    """One prompt's output and the acceptance statistics of the run it was part of.

    ``proposed``/``accepted`` count this row's draft tokens and how many of them the target agreed with
    (before the batch's lockstep minimum); ``target_calls`` is the number of verify (or plain decode)
    calls of the target model after the prefill."""

    prompt_ids: list[int]
    generated_ids: list[int]
    text: str = ""
    finish_reason: str = "length"
    method: str = "ngram"
    k: int = DEFAULT_K
    proposed: int = 0
    accepted: int = 0
    target_calls: int = 0
    draft_calls: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    compiles: int = 0  # XLA compilations during this call (0 once warm: acceptance never changes a shape)
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


def draft_params(params: Params, layers: int | None = None, dtype: str | None = None) -> Params:
    """A draft model made from the target's own weights, no training: its first ``layers`` blocks
    (with the final norm and the output embedding), optionally cast to ``dtype`` ("bfloat16": a
    lower-precision copy of float parameters). ``layers=None`` keeps every layer. Quantized parameters
    (:mod:`jaxlab.quant`) give a draft with the same quantized matrices. Cached per (params, layers, dtype)."""
    cfg = params.config
    layers = cfg.n_layers if layers is None else int(layers)
    if not 1 <= layers <= cfg.n_layers:
        raise InvalidRequestError(f"draft layers must be in [1, {cfg.n_layers}], got {layers}")
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


def first_token_frequencies(p, q, n: int = 100_000, seed: int = 0, rule=None) -> np.ndarray:
    """Frequencies of the first token emitted by a rejection ``rule`` (default :func:`speculative_sample`)
    over ``n`` independent rounds with one draft token drawn from ``q`` [V] and target ``p`` [V]. With a
    correct rule they approach ``p``, whatever ``q`` is."""
    rule = rule or speculative_sample
    p = jnp.asarray(p, jnp.float32)
    q = jnp.asarray(q, jnp.float32)
    k_d, k_r = jax.random.split(jax.random.key(seed))
    drafts = jax.random.categorical(k_d, jnp.log(q), shape=(n, 1)).astype(jnp.int32)
    pp = jnp.broadcast_to(jnp.stack([p, p]), (n, 2, p.shape[-1]))  # position 0 and the bonus position
    qq = jnp.broadcast_to(q[None], (n, 1, q.shape[-1]))
    out, _ = jax.jit(rule)(pp, qq, drafts, k_r)
    return np.bincount(np.asarray(out[:, 0]), minlength=p.shape[-1]) / n


def _probs(logits, samp):
    return jax.nn.softmax(filter_logits(logits, *samp), axis=-1)


# --------------------------------------------------------------------------------------------------
# The jitted programs
# --------------------------------------------------------------------------------------------------


def _prefill(params: Params, tokens, positions, cache: KVCache, key, *samp, greedy: bool):
    """Prompt chunk [B, T] -> (next token [B], cache); the same computation as Generator's prefill."""
    logits, cache = forward(params, tokens, positions, cache, last_only=True)
    return sample(logits[:, 0], key, *samp, greedy=greedy), cache


def _verify(params: Params, tokens, positions, cache: KVCache, index, q, key, *samp, greedy: bool, onehot: bool):
    """Roll the cache back to ``index``, run ``tokens`` [B, k+1] = [x, d_1..d_k] at ``positions``,
    return (out [B, k+1], accepted count [B], cache). With k = 0 this is a plain decode step."""
    cache = rollback(cache, index)
    logits, cache = forward(params, tokens, positions, cache)  # [B, k+1, V]
    drafts = tokens[:, 1:]
    if greedy:
        out, n = greedy_accept(drafts, logits)
    else:
        p = _probs(logits, samp)
        if onehot:
            q = jax.nn.one_hot(drafts, p.shape[-1], dtype=p.dtype)
        out, acc = speculative_sample(p, q, drafts, key)
        n = leading_accepted(acc)
    return out, n, cache


def _draft(dparams: Params, prev, x, pos, cache: KVCache, index, key, *samp, greedy: bool, k: int):
    """k draft tokens after x (at position ``pos`` [B]) with the draft model; ``index`` is the slot of
    ``prev`` (the token before x). Returns (drafts [B, k], q [B, k, V] or None, cache)."""
    cache = rollback(cache, index)
    tokens = jnp.stack([prev, x], axis=1)
    positions = jnp.stack([pos - 1, pos], axis=1)
    logits, cache = forward(dparams, tokens, positions, cache)

    def choose(lg, key):
        if greedy:
            return jnp.argmax(lg, axis=-1).astype(jnp.int32), None
        filt = filter_logits(lg, *samp)
        return jax.random.categorical(key, filt, axis=-1).astype(jnp.int32), jax.nn.softmax(filt, axis=-1)

    keys = jax.random.split(key, k)
    d0, q0 = choose(logits[:, -1], keys[0])

    def body(carry, key):
        d, p, cache = carry
        lg, cache = forward(dparams, d[:, None], p[:, None], cache)
        nd, nq = choose(lg[:, 0], key)
        return (nd, p + 1, cache), (nd, nq)

    (_, _, cache), (ds, qs) = jax.lax.scan(body, (d0, pos + 1, cache), keys[1:])
    drafts = jnp.concatenate([d0[:, None], ds.T], axis=1)  # [B, k]
    q = None if greedy else jnp.concatenate([q0[:, None], jnp.moveaxis(qs, 0, 1)], axis=1)
    return drafts, q, cache


_jit_prefill = jax.jit(_prefill, donate_argnums=(3,), static_argnames=("greedy",))
_jit_verify = jax.jit(_verify, donate_argnums=(3,), static_argnames=("greedy", "onehot"))
_jit_draft = jax.jit(_draft, donate_argnums=(4,), static_argnames=("greedy", "k"))


# --------------------------------------------------------------------------------------------------
# The decoder
# --------------------------------------------------------------------------------------------------


@dataclass
class SpeculativeDecoder:
    """Speculative generation for one set of parameters; compiled programs are shared by every call
    with the same shapes (batch, prompt bucket, cache length, k), so acceptance never recompiles.

    ``method``: "ngram" (prompt lookup, n-grams from ``max_ngram`` down to ``min_ngram``) or "draft"
    (the first ``draft_layers`` layers of the model, optionally in ``draft_dtype``). When no row finds
    an n-gram, the round is a plain one-token decode step instead of a verify call: on a CPU a verify
    call of k+1 tokens costs clearly more than a decode step, so a weak guess is not worth checking."""

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
    _plan: Generator = field(init=False, repr=False)

    def __post_init__(self):
        if self.method not in METHODS:
            raise InvalidRequestError(f"unknown speculative method {self.method!r}; choose one of {METHODS}")
        if isinstance(self.k, bool) or int(self.k) != self.k or self.k < 1:
            raise InvalidRequestError(f"draft k must be a whole number >= 1, got {self.k}")
        self.k = int(self.k)
        self.config = self.params.config
        # Generator.plan gives the prompt padding, prefill chunk and cache length; its programs are unused
        self._plan = Generator(
            self.params, self.tokenizer, prefill_buckets=self.prefill_buckets, cache_buckets=self.cache_buckets
        )
        self.dparams = (
            draft_params(self.params, self.draft_layers, self.draft_dtype) if self.method == "draft" else None
        )

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int = 32,
        sampling: SamplingParams | None = None,
        *,
        seed: int = 0,
        ignore_eos: bool = True,
    ) -> list[SpecResult]:
        """Generate for a batch of prompts (lists of token ids). Greedy (the default) gives exactly the
        tokens of ``Generator(params).generate(prompts, max_new_tokens, ignore_eos=...)``."""
        with CompileCounter() as cc:
            results = self._generate(prompts, max_new_tokens, sampling or SamplingParams(), seed, ignore_eos)
        for r in results:
            r.compiles = cc.count
        return results

    def _generate(self, prompts, max_new_tokens, sampling, seed, ignore_eos):
        greedy = sampling.greedy
        onehot = self.method == "ngram" and not greedy  # greedy ignores q: one verify program for both
        cfg, k = self.config, self.k
        prompts = [list(map(int, p)) for p in prompts]
        if not prompts or any(not p for p in prompts):
            raise InvalidRequestError("give at least one non-empty prompt")
        if isinstance(max_new_tokens, bool) or int(max_new_tokens) != max_new_tokens or max_new_tokens < 1:
            raise InvalidRequestError(f"max_new_tokens must be a whole number >= 1, got {max_new_tokens}")
        for i, p in enumerate(prompts):
            if not all(0 <= t < cfg.vocab_size for t in p):
                raise InvalidRequestError(f"prompt {i} has token ids outside the vocabulary [0, {cfg.vocab_size})")
        b = len(prompts)
        lens = [len(p) for p in prompts]
        # k spare slots: a verify call writes k+1 tokens from the last accepted one on
        padded, chunk, cache_len = self._plan.plan(lens, max_new_tokens + k)
        tokens, positions = left_pad(prompts, cfg.pad_id, padded)
        samp = sampling.arrays()
        key = jax.random.key(seed)

        t0 = time.perf_counter()
        key, sub = jax.random.split(key)
        cache = init_cache(cfg, b, cache_len, self.params.policy.jnp_dtype)
        for c in range(0, padded, chunk):
            nxt, cache = _jit_prefill(
                self.params,
                jnp.asarray(tokens[:, c : c + chunk]),
                jnp.asarray(positions[:, c : c + chunk]),
                cache,
                sub,
                *samp,
                greedy=greedy,
            )
        dcache = None
        if self.dparams is not None:
            dcache = init_cache(self.dparams.config, b, cache_len, self.dparams.policy.jnp_dtype)
            for c in range(0, padded, chunk):
                _, dcache = _jit_prefill(
                    self.dparams,
                    jnp.asarray(tokens[:, c : c + chunk]),
                    jnp.asarray(positions[:, c : c + chunk]),
                    dcache,
                    sub,
                    *samp,
                    greedy=greedy,
                )
        x = np.asarray(nxt)
        t_prefill = time.perf_counter() - t0

        out_ids = [[] for _ in range(b)]
        finish: list[str | None] = [None] * b
        proposed, accepted = [0] * b, [0] * b
        rounds = [[] for _ in range(b)]
        target_calls = draft_calls = 0

        def emit(i, toks):
            for t in toks:
                if finish[i]:
                    return
                if t == cfg.eos_id and not ignore_eos:
                    finish[i] = "eos"
                    return
                out_ids[i].append(int(t))
                if len(out_ids[i]) >= max_new_tokens:
                    finish[i] = "length"

        for i in range(b):
            emit(i, [x[i]])
        prev = tokens[:, -1].copy()  # the token before x: each row's last prompt token
        pos = np.asarray(lens, np.int32)  # position of x, per row
        index = padded  # cache slot where x will be written (shared by the rows)
        t1 = time.perf_counter()
        while not all(finish):
            live = [i for i in range(b) if not finish[i]]
            key, sub = jax.random.split(key)
            q = None
            if self.method == "ngram":
                drafts = np.repeat(x[:, None], k, axis=1).astype(np.int32)  # filler for rows with no match
                found = [False] * b
                for i in live:
                    prop = ngram_propose(prompts[i] + out_ids[i], k, self.max_ngram, self.min_ngram)
                    if prop is not None:
                        drafts[i], found[i] = prop, True
                # nothing to propose in any row: a plain decode step (the same program with k = 0)
                feed = np.concatenate([x[:, None], drafts], axis=1) if any(found) else x[:, None]
            else:
                d, q, dcache = _jit_draft(
                    self.dparams,
                    jnp.asarray(prev),
                    jnp.asarray(x),
                    jnp.asarray(pos),
                    dcache,
                    jnp.int32(index - 1),
                    sub,
                    *samp,
                    greedy=greedy,
                    k=k,
                )
                draft_calls += 1
                drafts = np.asarray(d)
                found = [True] * b
                feed = np.concatenate([x[:, None], drafts], axis=1)
            t = feed.shape[1]
            feed_pos = pos[:, None] + np.arange(t, dtype=np.int32)[None]
            out, n_rows, cache = _jit_verify(
                self.params,
                jnp.asarray(feed),
                jnp.asarray(feed_pos),
                cache,
                jnp.int32(index),
                q,
                sub,
                *samp,
                greedy=greedy,
                onehot=onehot,
            )
            target_calls += 1
            out, n_rows = np.asarray(out), np.asarray(n_rows)
            n = int(min(n_rows[i] for i in live))  # lockstep: every row advances by the batch's minimum
            for i in live:
                checked = t > 1 and found[i]
                if checked:
                    proposed[i] += k
                    accepted[i] += int(n_rows[i])
                rounds[i].append((drafts[i].tolist() if checked else None, out[i].tolist(), int(n_rows[i]), n))
                emit(i, out[i, : n + 1])
            prev = out[:, n - 1] if n > 0 else x
            x = out[:, n].copy()
            pos = pos + n + 1
            index += n + 1
        t_decode = time.perf_counter() - t1

        results = []
        for i in range(b):
            text = self.tokenizer.decode(out_ids[i]) if self.tokenizer is not None else ""
            results.append(
                SpecResult(
                    prompt_ids=prompts[i],
                    generated_ids=out_ids[i],
                    text=text,
                    finish_reason=finish[i] or "length",
                    method=self.method,
                    k=k,
                    proposed=proposed[i],
                    accepted=accepted[i],
                    target_calls=target_calls,
                    draft_calls=draft_calls,
                    prefill_seconds=t_prefill,
                    decode_seconds=t_decode,
                    rounds=rounds[i],
                )
            )
        return results

    def warmup(self, batch: int = 1, prompt_len: int = 32, max_new_tokens: int = 32, greedy: bool = True) -> float:
        """Compile every program a generation of this shape can need (prefill, draft, verify, and the
        plain step used when no n-gram recurs); returns the seconds it took."""
        t0 = time.perf_counter()
        sp = SamplingParams() if greedy else SamplingParams(temperature=1.0)
        prompt = [(i % 5) + 3 for i in range(prompt_len)]  # repetitive: the n-gram path drafts
        self.generate([prompt] * batch, max_new_tokens, sp)
        if self.method == "ngram":
            _, _, cache_len = self._plan.plan([prompt_len] * batch, max_new_tokens + self.k)
            cache = init_cache(self.config, batch, cache_len, self.params.policy.jnp_dtype)
            one = jnp.zeros((batch, 1), jnp.int32)
            out = _jit_verify(
                self.params,
                one,
                one,
                cache,
                jnp.int32(0),
                None,
                jax.random.key(0),
                *sp.arrays(),
                greedy=sp.greedy,
                onehot=not sp.greedy,
            )
            jax.block_until_ready(out)
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
) -> list[SpecResult]:
    """Speculative generation in one call (see :class:`SpeculativeDecoder`): greedy by default, with
    exactly plain greedy's tokens; ``sampling`` switches to the rejection rule."""
    dec = SpeculativeDecoder(params, tokenizer, method=method, k=k, draft_layers=draft_layers, draft_dtype=draft_dtype)
    return dec.generate(prompts, max_new_tokens, sampling, seed=seed, ignore_eos=ignore_eos)


# --------------------------------------------------------------------------------------------------
# Measuring: acceptance and speed-up by task type
# --------------------------------------------------------------------------------------------------

PARAGRAPH = (
    "The lighthouse stood on a rock at the end of the harbour. Every evening the keeper climbed "
    "the stairs, lit the lamp and watched the ships come home before the storm."
)
CODE = "def area(width, height):\n    retrun width * height\n\nprint(area(3, 4))"

#: Prompts by task (all 65-128 tokens with the chat template: one prefill bucket): three whose
#: answer copies from the prompt, and one open-ended.
TASK_PROMPTS: dict[str, list[str]] = {
    "copy: repeat": [f"Repeat this text exactly: {PARAGRAPH}"],
    "copy: fix code": [f"Fix the typo in this code and show the corrected code:\n{CODE}"],
    "copy: extract": [
        "Extract the names of the people from this text and list them: Alice met Bob at the "
        "station at noon, then Carol and Dave joined them for lunch with Eve, and Frank came late."
    ],
    "open-ended": [
        "Write a short story about a robot who learns to paint. Give the robot a name, describe "
        "the studio where it works, and tell what the other robots think of its first picture."
    ],
}


#: The same, grouped by task *type* (with a second open-ended prompt): rows for ``jaxlab bench``.
TASK_TYPES: dict[str, list[str]] = {
    "copy-heavy": [p for task, ps in TASK_PROMPTS.items() if task.startswith("copy") for p in ps],
    "open-ended": TASK_PROMPTS["open-ended"]
    + [
        "Write a short poem about the sea at night, in four lines, with the moon, a boat and a lighthouse in it, "
        "and say in one sentence afterwards what the poem is about."
    ],
}


def chat_prompt(tokenizer, text: str) -> list[int]:
    """A user message rendered with the model's chat template, ready for the assistant's reply."""
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)


def measure(
    params: Params,
    tokenizer,
    prompts_by_task: Mapping[str, Sequence] | None = None,
    k: int = DEFAULT_K,
    max_new_tokens: int = 32,
    methods: Sequence[str] = METHODS,
    draft_layers: int = DEFAULT_DRAFT_LAYERS,
    repeats: int = 2,
    batch: int = 1,
    generator: Generator | None = None,
    outputs: dict | None = None,
) -> list[dict]:
    """Acceptance and decode speed-up against plain greedy (:class:`jaxlab.Generator`), by task.

    Prompts are texts (wrapped in the chat template) or id lists. With ``batch`` 1 each prompt runs
    alone; otherwise each task's prompts are cycled to fill one batch. Plain and speculative runs of a
    prompt are interleaved ``repeats`` times and the fastest of each is kept (a shared machine's load
    comes in bursts); a run that compiled anything is run again, so no timing includes compilation.
    Returns one row per (task, method): task, method, k, batch, acceptance (fraction of draft tokens
    kept), tokens/call (decode-phase tokens per target-model call; plain decoding: 1), plain and
    speculative decode tokens/s, speed-up, and identical ("yes" when every row's tokens equal plain
    greedy's). Pass ``generator`` to reuse a :class:`jaxlab.Generator` (and its compiled programs)
    for the baseline, and a dict as ``outputs`` to receive each task's prompts and plain greedy
    tokens (``{task: (prompt id lists, generated id lists)}``)."""
    prompts_by_task = TASK_PROMPTS if prompts_by_task is None else prompts_by_task
    as_ids = {
        task: [chat_prompt(tokenizer, p) if isinstance(p, str) else list(p) for p in ps]
        for task, ps in prompts_by_task.items()
    }
    batches = {
        task: ([[p] for p in ps] if batch == 1 else [[ps[i % len(ps)] for i in range(batch)]])
        for task, ps in as_ids.items()
    }
    plain = generator or Generator(params, tokenizer)
    decoders = {m: SpeculativeDecoder(params, tokenizer, method=m, k=k, draft_layers=draft_layers) for m in methods}
    runners = {
        "plain": (
            lambda ps: plain.generate(ps, max_new_tokens, ignore_eos=True),
            lambda res: res[0].compile_seconds > 0,
        )
    }
    for m, dec in decoders.items():
        runners[m] = (lambda ps, dec=dec: dec.generate(ps, max_new_tokens), lambda res: res[0].compiles > 0)

    rows = []
    for task, group in batches.items():
        totals = {
            name: {"secs": 0.0, "tokens": 0, "proposed": 0, "accepted": 0, "calls": 0, "same": True} for name in runners
        }
        reference = []
        for prompts in group:
            best: dict = {}
            for _ in range(max(1, repeats)):
                for name, (run, compiled) in runners.items():
                    res = run(prompts)
                    while compiled(res):
                        res = run(prompts)
                    secs = max(r.decode_seconds for r in res)
                    if name not in best or secs < best[name][0]:
                        best[name] = (secs, res)
            ref = [r.generated_ids for r in best["plain"][1]]
            reference.append(ref)
            for name, (secs, res) in best.items():
                t = totals[name]
                t["secs"] += secs
                t["tokens"] += sum(len(r.generated_ids) - 1 for r in res)
                if name != "plain":
                    t["proposed"] += sum(r.proposed for r in res)
                    t["accepted"] += sum(r.accepted for r in res)
                    t["calls"] += res[0].target_calls * len(res)
                    t["same"] &= [r.generated_ids for r in res] == ref
        if outputs is not None:
            outputs[task] = ([p for prompts in group for p in prompts], [g for ref in reference for g in ref])
        plain_tps = totals["plain"]["tokens"] / totals["plain"]["secs"]
        for m in decoders:
            t = totals[m]
            spec_tps = t["tokens"] / t["secs"]
            rows.append(
                {
                    "task": task,
                    "method": m if m == "ngram" else f"draft L={draft_layers}",
                    "k": k,
                    "batch": batch,
                    "acceptance": t["accepted"] / t["proposed"] if t["proposed"] else float("nan"),
                    "tokens/call": t["tokens"] / t["calls"],
                    "plain tok/s": plain_tps,
                    "spec tok/s": spec_tps,
                    "speed-up": spec_tps / plain_tps,
                    "identical": "yes" if t["same"] else "no",
                }
            )
    return rows


def _exit_tokens(params: Params, tokens, positions, layers: tuple, n_score: int):
    """Greedy tokens of the model cut after each of ``layers`` (final norm and output embedding applied to
    that layer's output), at the last ``n_score`` positions but one: [len(layers), B, n_score]."""
    mod = params.module()
    cfg = mod.cfg
    x = jnp.take(mod.embed[...], tokens, axis=0).astype(mod.policy.jnp_dtype)
    cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta)
    picks = []
    for i, layer in enumerate(mod.layers):
        x, _ = layer(x, positions, cos, sin, positions)
        if i + 1 in layers:
            h = mod.norm(x[:, -n_score - 1 : -1])
            logits = (
                jnp.einsum("btd,vd->btv", h, mod.embed[...].astype(h.dtype), precision=mod.policy.lax_precision)
                if cfg.tie_embeddings
                else h @ mod.lm_head[...]
            )
            picks.append(jnp.argmax(logits, axis=-1))
    return jnp.stack(picks)


_jit_exit_tokens = jax.jit(_exit_tokens, static_argnames=("layers", "n_score"))


def early_exit_agreement(
    params: Params,
    prompts: Sequence[Sequence[int]],
    generated: Sequence[Sequence[int]],
    layers: Sequence[int] | None = None,
) -> dict[int, float]:
    """How often would a draft made of the first L layers guess the model's next greedy token?

    For each L, the fraction of the ``generated`` tokens (all but the first) that the model cut after
    L layers predicts from the true context: exactly the chance that such a draft's token is accepted
    when the tokens before it were right (the per-token acceptance rate). One forward pass scores every
    L; the full depth must give 1.0, which checks the probe itself. ``generated`` rows must have equal
    lengths (e.g. greedy runs with EOS ignored)."""
    cfg = params.config
    layers = tuple(sorted(set(layers or range(1, cfg.n_layers + 1))))
    g = {len(x) for x in generated}
    if len(g) != 1 or min(g) < 2:
        raise InvalidRequestError("give generated rows of one length >= 2")
    n_score = g.pop() - 1
    seqs = [list(p) + list(x) for p, x in zip(prompts, generated)]
    tokens, positions = left_pad(seqs, cfg.pad_id)
    picks = np.asarray(_jit_exit_tokens(params, jnp.asarray(tokens), jnp.asarray(positions), layers, n_score))
    truth = np.asarray([list(x)[1:] for x in generated])  # [B, n_score]
    return {L: float((picks[j] == truth).mean()) for j, L in enumerate(layers)}


def step_costs(
    params: Params,
    k: int = DEFAULT_K,
    batch: int = 1,
    draft_layers: int | None = DEFAULT_DRAFT_LAYERS,
    prompt_len: int = 128,
    max_new_tokens: int = 32,
    repeats: int = 5,
) -> dict[str, float]:
    """Seconds (best of ``repeats``) of one plain decode step (T=1), one verify step (T=k+1) and, with
    ``draft_layers``, one draft round (k tokens of the draft model), with the same programs and shapes
    a generation of ``batch`` prompts of ``prompt_len`` tokens uses."""
    dec = SpeculativeDecoder(params, k=k)
    _, _, cache_len = dec._plan.plan([prompt_len] * batch, max_new_tokens + k)
    samp = SamplingParams().arrays()
    key = jax.random.key(0)
    index = jnp.int32(prompt_len)
    pos = jnp.full((batch,), prompt_len, jnp.int32)

    def best(call, cache):
        times = []
        for _ in range(repeats + 1):  # the first call may compile
            t0 = time.perf_counter()
            out, cache = call(cache)
            jax.block_until_ready(out)
            times.append(time.perf_counter() - t0)
        return min(times[1:])

    def verify(t):
        toks = jnp.ones((batch, t), jnp.int32)
        positions = pos[:, None] + jnp.arange(t, dtype=jnp.int32)[None]
        return lambda c: (lambda o: (o[0], o[2]))(
            _jit_verify(params, toks, positions, c, index, None, key, *samp, greedy=True, onehot=False)
        )

    costs = {
        "decode_s": best(verify(1), init_cache(params.config, batch, cache_len, params.policy.jnp_dtype)),
        "verify_s": best(verify(k + 1), init_cache(params.config, batch, cache_len, params.policy.jnp_dtype)),
    }
    if draft_layers:
        dp = draft_params(params, draft_layers)
        ones = jnp.ones((batch,), jnp.int32)
        costs["draft_s"] = best(
            lambda c: (lambda o: (o[0], o[2]))(
                _jit_draft(dp, ones, ones, pos, c, index - 1, key, *samp, greedy=True, k=k)
            ),
            init_cache(dp.config, batch, cache_len, dp.policy.jnp_dtype),
        )
    return costs


def expected_tokens_per_call(alpha, k: int):
    """Expected tokens per verify call when each draft token is accepted with probability ``alpha``
    (independently): 1 + alpha + ... + alpha^k = (1 - alpha^(k+1)) / (1 - alpha)."""
    alpha = np.asarray(alpha, np.float64)
    return np.where(alpha < 1, (1 - alpha ** (k + 1)) / np.where(alpha < 1, 1 - alpha, 1), k + 1.0)


def expected_speedup(alpha, k: int, verify_cost: float, draft_cost: float = 0.0):
    """Predicted speed-up over plain decoding: tokens per round / cost of a round, where a round costs
    one verify step (``verify_cost`` plain decode steps) plus k draft steps (``draft_cost`` each)."""
    return expected_tokens_per_call(alpha, k) / (verify_cost + k * draft_cost)


# --------------------------------------------------------------------------------------------------
# Showing the rounds
# --------------------------------------------------------------------------------------------------


def _piece(tokenizer, t: int) -> str:
    """A token's text for a table cell: newlines escaped, a token of spaces shown as ␣."""
    if tokenizer is None:
        return str(t)
    text = tokenizer.decode([t])
    return "␣" * len(text) if text and not text.strip(" ") else text.replace("\n", "\\n")


def describe_rounds(result: SpecResult, tokenizer=None, max_rounds: int = 6) -> list[dict]:
    """The first rounds of a run as table rows: what was drafted, how much of it the model kept, the
    model's own token (correction or bonus), and the text emitted."""
    rows = []
    for r, (drafts, out, _own, n) in enumerate(result.rounds[:max_rounds], 1):
        rows.append(
            {
                "round": r,
                "drafted": "|".join(_piece(tokenizer, t) for t in drafts) if drafts else "(no draft)",
                "kept": n if drafts else 0,
                "model's token": _piece(tokenizer, out[n]),
                "emitted": "".join(_piece(tokenizer, t) for t in out[: n + 1]),
            }
        )
    return rows


def plot_rounds(result: SpecResult, tokenizer=None, max_rounds: int = 8, ax=None):
    """Draw the rounds: drafted tokens in green (kept) or red (the first wrong one; later ones grey,
    never looked at), then the model's own token in blue. Returns the matplotlib axes."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    rounds = result.rounds[:max_rounds]
    k = result.k
    if ax is None:
        _, ax = plt.subplots(figsize=(1.5 * (k + 1) + 1, 0.55 * len(rounds) + 0.8))
    for r, (drafts, out, _own, n) in enumerate(rounds):
        y = len(rounds) - 1 - r
        if drafts is None:  # no n-gram recurred: a plain decode step
            ax.add_patch(Rectangle((0, y + 0.1), k - 0.05, 0.8, facecolor="white", edgecolor="gray"))
            ax.text(k / 2, y + 0.5, "no draft: a plain decode step", ha="center", va="center", fontsize=8, color="gray")
            cells = [None] * k
        else:
            cells = [
                (_piece(tokenizer, d), "#8fd694" if j < n else ("#f08080" if j == n else "#dddddd"))
                for j, d in enumerate(drafts)
            ]
        cells.append((_piece(tokenizer, out[n]), "#8ab6f9"))
        for j, cell in enumerate(cells):
            if cell is None:
                continue
            x = j + (0.3 if j == k else 0)
            ax.add_patch(Rectangle((x, y + 0.1), 0.95, 0.8, facecolor=cell[1], edgecolor="gray"))
            ax.text(x + 0.475, y + 0.5, cell[0][:10], ha="center", va="center", fontsize=8)
    ax.set_xlim(0, k + 1.3)
    ax.set_ylim(0, len(rounds))
    ax.set_yticks([len(rounds) - 1 - r + 0.5 for r in range(len(rounds))])
    ax.set_yticklabels([f"round {r + 1}" for r in range(len(rounds))])
    ax.set_xticks([j + 0.475 for j in range(k)] + [k + 0.775])
    ax.set_xticklabels([f"draft {j + 1}" for j in range(k)] + ["model"])
    ax.grid(False)
    ax.set_title("green: kept, red: first wrong guess, grey: not used, blue: the model's own token", fontsize=9)
    return ax


def plot_speedup(costs: dict, k: int, measured: Sequence[dict] = (), ax=None):
    """Speed-up against tokens per verify call: the cost model ``speed-up = tokens per call / cost of a
    round`` (in plain decode steps) with this machine's measured step costs (:func:`step_costs`), for
    n-gram drafts (free) and the draft model (k draft steps per round), next to the ideal of a verify
    step that costs one decode step (a memory-bound step on a GPU or TPU comes close); ``measured``
    rows (from :func:`measure`) are drawn as points. Returns the matplotlib axes."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots()
    x = np.linspace(1, k + 1, 50)
    verify = costs["verify_s"] / costs["decode_s"]
    ax.plot(x, x, "k--", label="ideal: verify costs 1 decode step")
    ax.plot(x, x / verify, label=f"n-gram drafts (verify = {verify:.1f} decode steps)")
    if "draft_s" in costs:
        draft = costs["draft_s"] / costs["decode_s"]
        ax.plot(x, x / (verify + draft), label=f"draft model ({k} draft tokens = {draft:.1f} decode steps)")
    for i, r in enumerate(measured):
        ax.plot(r["tokens/call"], r["speed-up"], "o", color="C0" if r["method"] == "ngram" else "C1")
        ax.annotate(
            r["task"],
            (r["tokens/call"], r["speed-up"]),
            fontsize=7,
            xytext=(5, 4 if i % 2 else -10),
            textcoords="offset points",
        )
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xlabel("tokens per verify call")
    ax.set_ylabel("speed-up over plain decoding")
    ax.legend(fontsize=7)
    return ax
