"""Speculative decoding: exact greedy output, a correct rollback, batches, no recompiles, and a rejection
rule that keeps the target distribution (checked statistically, with two wrong rules it must catch)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import load_solution

from jaxlab import tiny
from jaxlab.engine import speculative as spec
from jaxlab.engine import steps
from jaxlab.engine.generate import Generator
from jaxlab.engine.kvcache import init_cache, left_pad, rollback
from jaxlab.engine.model import forward, params_from_flat
from jaxlab.engine.sampling import SamplingParams
from jaxlab.errors import InvalidRequestError
from jaxlab.io.config import param_shapes
from jaxlab.lab import speculation
from jaxlab.lab.exercises import nb10
from jaxlab.tools.profile import CompileCounter


def scaled(cfg, seed, scale):
    """Random weights, normal(0, 0.02 * scale), norms 1: scaled up so that greedy text is not one token
    repeated (at the usual 0.02 it is). Drawn with NumPy: no eager JAX op to compile."""
    rng = np.random.default_rng(seed)
    flat = {
        n: (
            np.ones(shape, np.float32)
            if n.endswith("norm.weight")
            else (rng.standard_normal(shape) * 0.02 * scale).astype(np.float32)
        )
        for n, shape in param_shapes(cfg).items()
    }
    return params_from_flat(cfg, flat)


K = 4  # one k (and prompts within one prefill bucket) for most tests: compiled programs are shared


EOS = 162  # a token this model often emits: made the EOS id to test stopping


@pytest.fixture(scope="module")
def tiny_params():
    return scaled(tiny().replace(eos_id=EOS), 0, 8.0)


@pytest.fixture(scope="module")
def plain(tiny_params):
    return Generator(tiny_params)


@pytest.fixture(scope="module")
def plain_alone(plain):
    """plain_alone(prompt, n): plain greedy's tokens for one prompt alone (``ignore_eos``), each (prompt, n) run once
    per module: the tests below compare several decoders with the same runs."""

    @functools.cache
    def ids(prompt: tuple, n: int) -> list:
        return plain.generate([list(prompt)], n, ignore_eos=True)[0].generated_ids

    return lambda prompt, n: ids(tuple(prompt), n)


def mixed_prompts(n=10, seed=0):
    """Random prompts (the n-gram drafter finds little) and periodic ones (it finds a lot), <= 32 tokens."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        if i % 2:
            period = list(rng.integers(3, 263, size=int(rng.integers(2, 6))))
            out.append((period * 20)[: int(rng.integers(8, 33))])
        else:
            out.append(list(rng.integers(3, 263, size=int(rng.integers(1, 33)))))
    return out


# --------------------------------------------------------------------------------------------------
# Pieces
# --------------------------------------------------------------------------------------------------


def test_ngram_propose():
    # the longest recurring n-gram wins, its most recent earlier occurrence is used
    assert spec.ngram_propose([1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 4, 2, 3], 2) == [7, 8]
    assert spec.ngram_propose([5, 1, 2, 6, 1, 2], 3) == [6, 1, 2]
    assert spec.ngram_propose([5, 6, 7, 5], 3) == [6, 7, 5]  # unigram fallback
    assert spec.ngram_propose([4, 5, 6, 4], 4) == [5, 6, 4, 4]  # short continuation: padded
    assert spec.ngram_propose([1, 2, 3, 4], 3) is None
    assert spec.ngram_propose([7], 2) is None
    assert spec.ngram_propose([5, 6, 7, 5], 3, min_ngram=2) is None


def test_leading_accepted_and_expected_tokens():
    acc = jnp.array([[True, True, False, True], [False, True, True, True], [True, True, True, True]])
    assert spec.leading_accepted(acc).tolist() == [2, 0, 4]
    assert float(speculation.expected_tokens_per_call(0.0, 4)) == 1.0
    assert float(speculation.expected_tokens_per_call(1.0, 4)) == 5.0
    assert np.isclose(float(speculation.expected_tokens_per_call(0.5, 2)), 1.75)
    assert np.isclose(float(speculation.expected_speedup(1.0, 4, verify_cost=2.0, draft_cost=0.25)), 5 / 3)


def test_draft_params_is_the_first_layers(tiny_params):
    small = spec.draft_params(tiny_params, 2)
    assert small.config.n_layers == 2
    assert spec.draft_params(tiny_params, 2) is small  # cached
    flat, big = small.flat(), tiny_params.flat()
    assert set(flat) == {n for n in big if not n.startswith("layers.2.")}
    assert all(np.array_equal(flat[n], big[n]) for n in flat)
    with pytest.raises(Exception):
        spec.draft_params(tiny_params, 4)


def test_the_draft_runs_the_target_weights_cut_early(tiny_params):
    """Method "draft" copies nothing: the target's own weights with forward(upto=L); its drafts are exactly
    those of separate first-L-layer parameters (draft_params)."""
    dec = spec.SpeculativeDecoder(tiny_params, method="draft", k=K, draft_layers=2)
    assert dec.dparams is tiny_params and dec.draft_hooks == {"upto": 2}
    copy = spec.draft_params(tiny_params, 2)
    cfg = tiny_params.config
    tokens, positions = left_pad(mixed_prompts(3, seed=7), cfg.pad_id, 32)
    samp, key = SamplingParams().state(), jax.random.key(0)
    x, dcache = dec.prefill(tokens, positions, 32, dec.init_caches(3, 64)[1], key, samp, draft=True)
    pos = np.asarray([len(p) for p in mixed_prompts(3, seed=7)], np.int32)
    drafts, _, _ = dec.draft(tokens[:, -1], x, pos, dcache, 31, key, samp)
    c = init_cache(copy.config, 3, 64)
    x2, _, c = steps.jit_prefill(copy, jnp.asarray(tokens), jnp.asarray(positions), c, key, samp)
    want, _, _ = steps.jit_draft(
        copy, jnp.asarray(tokens[:, -1]), x2, jnp.asarray(pos), c, jnp.int32(31), key, samp, k=K
    )
    np.testing.assert_array_equal(np.asarray(drafts), np.asarray(want))
    with pytest.raises(InvalidRequestError, match="draft layers"):
        spec.SpeculativeDecoder(tiny_params, method="draft", draft_layers=4)


def test_bfloat16_draft_is_still_exact(tiny_params, plain):
    """A draft dtype makes a cast copy of the first layers; the output is still plain greedy's."""
    dec = spec.SpeculativeDecoder(tiny_params, method="draft", k=K, draft_layers=1, draft_dtype="bfloat16")
    assert dec.dparams.policy.dtype == "bfloat16" and dec.dparams.config.n_layers == 1
    prompts = mixed_prompts(3, seed=8)
    res = dec.generate(prompts, 16)
    assert [r.generated_ids for r in res] == [r.generated_ids for r in plain.generate(prompts, 16, ignore_eos=True)]
    assert sum(r.proposed for r in res) > 0


def test_draft_of_quantized_params(tiny_params):
    """Quantized weights (jaxlab.quant): the draft reuses the same quantized matrices; its tokens are
    still exactly plain greedy's with those weights."""
    from jaxlab.quant import QuantizedMatrix, quantize_params

    q = quantize_params(tiny_params, "int8")
    small = spec.draft_params(q, 1)
    flat, big = small.flat(), q.flat()
    assert small.config.n_layers == 1 and small.quant == "int8"
    assert set(flat) == {n for n in big if not n.startswith(("layers.1.", "layers.2."))}
    wq = flat["layers.0.attn.wq"]
    assert isinstance(wq, QuantizedMatrix) and wq.q is big["layers.0.attn.wq"].q  # shared, not copied
    with pytest.raises(Exception, match="quantized"):
        spec.draft_params(q, 1, dtype="bfloat16")
    plain = Generator(q)
    dec = spec.SpeculativeDecoder(q, method="draft", k=K, draft_layers=1)
    for p in mixed_prompts(4, seed=2):
        assert dec.generate([p], 24)[0].generated_ids == plain.generate([p], 24, ignore_eos=True)[0].generated_ids


# --------------------------------------------------------------------------------------------------
# Greedy: exactly plain greedy's tokens
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method,layers", [("ngram", None), ("draft", 1)])
def test_greedy_equals_plain_greedy_tiny(tiny_params, plain_alone, method, layers):
    prompts = mixed_prompts(10)
    dec = spec.SpeculativeDecoder(tiny_params, method=method, k=K, draft_layers=layers or 1)
    proposed = accepted = 0
    for p in prompts:
        want = plain_alone(p, 48)
        got = dec.generate([p], 48)[0]
        assert got.generated_ids == want, f"{method}: prompt {p[:8]}..."
        proposed, accepted = proposed + got.proposed, accepted + got.accepted
    # long enough to see both: many rejections (rollback exercised) and many acceptances
    assert proposed - accepted > 50 and accepted > 20, (proposed, accepted)


def test_full_depth_draft_accepts_everything(tiny_params, plain):
    p = mixed_prompts(1, seed=3)[0]
    r = spec.speculative_generate(tiny_params, [p], 21, method="draft", k=K, draft_layers=3)[0]
    assert r.acceptance == 1.0
    assert r.target_calls == 4  # 1 token from the prefill, then 5 per call: 1 + 4 x 5 = 21
    assert r.generated_ids == plain.generate([p], 21, ignore_eos=True)[0].generated_ids


def test_batch_lockstep_is_exact(tiny_params, plain, plain_alone):
    prompts = mixed_prompts(6, seed=1)
    batched_plain = [r.generated_ids for r in plain.generate(prompts, 40, ignore_eos=True)]
    alone = [plain_alone(p, 40) for p in prompts]
    assert batched_plain == alone
    for method in ("ngram", "draft"):
        dec = spec.SpeculativeDecoder(tiny_params, method=method, k=K, draft_layers=1)
        res = dec.generate(prompts, 40)
        assert [r.generated_ids for r in res] == alone, method
        singles = [dec.generate([p], 40)[0] for p in prompts]
        # the batch advances at its slowest row's pace: never fewer calls than any row alone
        assert res[0].target_calls >= max(s.target_calls for s in singles)
        # every row's own statistics still count its own agreement
        assert all(r.accepted <= r.proposed for r in res)


def test_eos_stops_each_row(tiny_params, plain):
    # prompts whose greedy continuation first holds the EOS id at index 0, 3, 5 and 13 (found by search)
    prompts = []
    for seed in (16, 7, 5, 1):
        rng = np.random.default_rng(seed)
        prompts.append(list(rng.integers(3, 263, size=int(rng.integers(5, 30)))))
    want = plain.generate(prompts, 40, ignore_eos=False)
    got = spec.SpeculativeDecoder(tiny_params, method="ngram", k=K).generate(prompts, 40, ignore_eos=False)
    assert [r.generated_ids for r in got] == [r.generated_ids for r in want]
    assert [r.finish_reason for r in got] == [r.finish_reason for r in want] == ["eos"] * 4
    assert [len(r.generated_ids) for r in got] == [0, 3, 5, 13]


class Letters:
    """A tokenizer whose every token is one letter, and its stream decoder: enough for stop strings."""

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(97 + i % 26) for i in ids)


class LetterStream:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def push(self, token):
        return self.tokenizer.decode([token])

    def flush(self):
        return ""


def test_stop_strings_and_streaming_as_the_generator(tiny_params, plain, monkeypatch):
    """The host bookkeeping is the Generator's own (TextStops): the same cut, text and stream."""
    import jaxlab.io.tokenizer as tokmod

    monkeypatch.setattr(tokmod, "StreamDecoder", LetterStream)
    gen = Generator(tiny_params, Letters())
    gen.programs = plain.programs  # the same shapes: reuse the compiled programs
    prompt = mixed_prompts(2)[1]
    free = gen.generate([prompt], 24, ignore_eos=True)[0].text
    stop = free[9:11]
    want = gen.generate([prompt], 24, ignore_eos=True, stop=[stop])[0]
    pieces = []
    dec = spec.SpeculativeDecoder(tiny_params, Letters(), k=K)
    got = dec.generate([prompt], 24, stop=[stop], on_text=lambda i, piece: pieces.append(piece))[0]
    assert got.finish_reason == want.finish_reason == "stop"
    assert got.text == want.text == free[: free.index(stop)] and "".join(pieces) == got.text
    assert got.generated_ids == want.generated_ids


# --------------------------------------------------------------------------------------------------
# Rollback and compilation
# --------------------------------------------------------------------------------------------------


def test_rollback_forgets_rejected_tokens(tiny_params):
    """Write a prompt, then 4 wrong tokens, roll back over 3 of them: the following steps must equal
    the uncached forward pass of the true sequence, and the forgotten slots must be empty."""
    cfg = tiny_params.config
    rng = np.random.default_rng(5)
    seq = list(rng.integers(3, 263, size=14))
    prompt, rest = seq[:9], seq[9:]
    tokens, positions = left_pad([prompt], cfg.pad_id, 12)
    fwd = jax.jit(forward)
    cache = init_cache(cfg, 1, 32)
    _, cache = fwd(tiny_params, jnp.asarray(tokens), jnp.asarray(positions), cache)
    wrong = jnp.asarray([[rest[0], 7, 8, 9]])  # the first is right, three are wrong
    _, cache = fwd(tiny_params, wrong, jnp.arange(9, 13)[None], cache)
    cache = jax.jit(rollback)(cache, 13)  # keep the prompt and rest[0]
    assert int(cache.index) == 13 and (np.asarray(cache.pos)[0, 13:] == -1).all()
    logits, cache = fwd(tiny_params, jnp.asarray([rest[1:]]), jnp.arange(10, 14)[None], cache)
    full, _ = fwd(tiny_params, jnp.asarray([seq]), jnp.arange(14)[None])
    np.testing.assert_allclose(np.asarray(logits[0]), np.asarray(full[0, 10:]), atol=1e-4, rtol=1e-4)


def test_no_recompiles_as_acceptance_varies(tiny_params):
    prompts = [p for p in mixed_prompts(8, seed=4) if len(p) >= 8]
    for method in ("ngram", "draft"):
        dec = spec.SpeculativeDecoder(tiny_params, method=method, k=K, draft_layers=1)
        dec.warmup(prompt_len=32, max_new_tokens=40)
        with CompileCounter() as cc:
            res = [dec.generate([p], 40)[0] for p in prompts]
        assert len({round(r.acceptance, 2) for r in res}) > 2  # acceptance really varied
        assert all(r.compiles == 0 for r in res)
        cc.assert_none(f"{method} speculative decoding after warm-up")


# --------------------------------------------------------------------------------------------------
# Sampling: the rejection rule keeps the target distribution
# --------------------------------------------------------------------------------------------------

P = np.array(
    [[0.40, 0.30, 0.15, 0.10, 0.05], [0.05, 0.05, 0.20, 0.30, 0.40], [0.20, 0.20, 0.20, 0.20, 0.20]], np.float32
)  # target, positions 0..k (k = 2)
Q = np.array([[0.10, 0.10, 0.20, 0.30, 0.30], [0.30, 0.30, 0.20, 0.10, 0.10]], np.float32)  # draft, positions 0..k-1


def accept_always(p, q, drafts, key):
    k = drafts.shape[-1]
    bonus = jax.random.categorical(key, jnp.log(p[..., k, :]), axis=-1)
    return jnp.concatenate([drafts, bonus[..., None]], -1), jnp.ones(drafts.shape, bool)


def resample_from_p(p, q, drafts, key):
    """The classic mistake: on rejection, draw from p instead of the residual max(0, p - q)."""
    k = drafts.shape[-1]
    k_u, k_r, k_b = jax.random.split(key, 3)
    pd = jnp.take_along_axis(p[..., :k, :], drafts[..., None], -1)[..., 0]
    qd = jnp.take_along_axis(q, drafts[..., None], -1)[..., 0]
    accepted = jax.random.uniform(k_u, drafts.shape) * qd < pd
    redraw = jax.random.categorical(k_r, jnp.log(p[..., :k, :]), axis=-1)
    bonus = jax.random.categorical(k_b, jnp.log(p[..., k, :]), axis=-1)
    return jnp.concatenate([jnp.where(accepted, drafts, redraw), bonus[..., None]], -1), accepted


def emitted_frequencies(rule, n=200_000, seed=0, onehot_draft=None):
    """Run ``rule`` n times (drafts drawn from Q, or a fixed draft with q = one_hot); return, for each
    position j, the counts of the token emitted there (only runs that got as far as j emit it)."""
    key = jax.random.key(seed)
    k_d, k_r = jax.random.split(key)
    p = jnp.broadcast_to(P, (n,) + P.shape)
    if onehot_draft is None:
        q = jnp.broadcast_to(Q, (n,) + Q.shape)
        drafts = jax.random.categorical(k_d, jnp.log(q), axis=-1).astype(jnp.int32)
    else:
        drafts = jnp.broadcast_to(jnp.asarray(onehot_draft, jnp.int32), (n, len(onehot_draft)))
        q = jax.nn.one_hot(drafts, P.shape[-1])
    out, acc = jax.jit(rule)(p, q, drafts, k_r)
    n_acc = np.asarray(spec.leading_accepted(acc))
    out = np.asarray(out)
    return [np.bincount(out[n_acc >= j, j], minlength=P.shape[-1]) for j in range(P.shape[0])]


def chi2_pvalue(counts, probs):
    expected = counts.sum() * probs
    stat = float(((counts - expected) ** 2 / expected).sum())
    return float(jax.scipy.stats.chi2.sf(stat, len(probs) - 1))


def test_rejection_rule_keeps_the_target_distribution():
    for j, counts in enumerate(emitted_frequencies(spec.speculative_sample)):
        assert counts.sum() > 20_000
        assert chi2_pvalue(counts, P[j]) > 1e-3, (j, counts / counts.sum(), P[j])


def test_rejection_rule_with_a_point_mass_draft():
    """An n-gram draft is a point mass: accept with probability p(d), else draw from p without d."""
    for j, counts in enumerate(emitted_frequencies(spec.speculative_sample, onehot_draft=[0, 4])):
        assert chi2_pvalue(counts, P[j]) > 1e-3, (j, counts / counts.sum(), P[j])


@pytest.mark.parametrize("wrong_rule", [accept_always, resample_from_p])
def test_the_statistical_test_catches_wrong_rules(wrong_rule):
    freqs = emitted_frequencies(wrong_rule)
    assert min(chi2_pvalue(c, P[j]) for j, c in enumerate(freqs)) < 1e-12


SAMPLING_PROMPT = [3, 4, 5, 6, 7, 3, 4]


@pytest.fixture(scope="module")
def eleven_token_model():
    """An 11-token model and the exact marginals of its 2nd and 3rd generated tokens after SAMPLING_PROMPT
    (computed once, by enumerating every 2-token continuation): (params, [m2, m3])."""
    cfg = tiny().replace(vocab_size=11, max_seq_len=256)
    params = scaled(cfg, 3, 10.0)
    prompt, v = SAMPLING_PROMPT, cfg.vocab_size
    # exact marginals: p(t1), p(t2 | t1), p(t3 | t1, t2) for all 121 (t1, t2)
    pairs = np.array([(a, b) for a in range(v) for b in range(v)])
    seqs = np.concatenate([np.tile(prompt, (v * v, 1)), pairs], axis=1)
    logits, _ = jax.jit(forward)(
        params, jnp.asarray(seqs), jnp.asarray(np.broadcast_to(np.arange(seqs.shape[1]), seqs.shape))
    )
    probs = np.asarray(jax.nn.softmax(logits, axis=-1), np.float64)
    t = len(prompt)
    p1 = probs[0, t - 1]
    p2_given = probs[::v, t]  # [t1, t2]
    p3_given = probs[:, t + 1].reshape(v, v, v)  # [t1, t2, t3]
    m2 = p1 @ p2_given
    m3 = np.einsum("a,ab,abc->c", p1, p2_given, p3_given)
    return params, [m2, m3]


@pytest.mark.parametrize("method,layers", [("draft", 1), ("draft", 3), ("ngram", None)])
def test_speculative_sampling_end_to_end(eleven_token_model, method, layers):
    """2000 copies of one prompt through the sampler, on an 11-token model: the 2nd and 3rd generated
    tokens follow the model's exact marginals (computed by enumerating every 2-token continuation).
    A 1-layer draft is often rejected (the residual path), a full-depth one is almost always accepted
    (the bonus path); the n-gram draft is a point mass."""
    params, (m2, m3) = eleven_token_model
    v, n = params.config.vocab_size, 2000
    sp = SamplingParams(temperature=1.0)
    dec = spec.SpeculativeDecoder(params, method=method, k=2, draft_layers=layers or 1, cache_buckets=(64,))
    res = dec.generate([SAMPLING_PROMPT] * n, 3, sp, seed=1)
    toks = np.array([r.generated_ids for r in res])
    assert sum(r.proposed for r in res) > 0
    for col, marginal in ((1, m2), (2, m3)):
        counts = np.bincount(toks[:, col], minlength=v)
        assert chi2_pvalue(counts, marginal) > 1e-3, (method, col, counts / n, marginal)


# --------------------------------------------------------------------------------------------------
# Measuring helpers
# --------------------------------------------------------------------------------------------------


def test_measure_rows_and_early_exit_probe(tiny_params, plain):
    prompts = mixed_prompts(4, seed=6)
    rows = speculation.measure(
        tiny_params,
        None,
        {"periodic": [prompts[1], prompts[3]], "random": [prompts[0]]},
        k=K,
        max_new_tokens=16,
        methods=("ngram", "draft"),
        draft_layers=1,
        generator=plain,
    )
    assert [(r["task"], r["method"]) for r in rows] == [
        ("periodic", "ngram"),
        ("periodic", "draft L=1"),
        ("random", "ngram"),
        ("random", "draft L=1"),
    ]
    assert all(r["identical"] == "yes" and r["speed-up"] > 0 and 1 <= r["tokens/call"] <= K + 1 for r in rows)
    gen = plain.generate(prompts, 12, ignore_eos=True)
    agree = speculation.early_exit_agreement(tiny_params, prompts, [r.generated_ids for r in gen])
    assert sorted(agree) == [1, 2, 3] and agree[3] == 1.0  # the full depth is the model itself
    assert all(0.0 <= a <= 1.0 for a in agree.values())


def test_describe_rounds(tiny_params):
    r = spec.speculative_generate(tiny_params, [mixed_prompts(2)[1]], 20, k=K)[0]
    rows = speculation.describe_rounds(r, None, max_rounds=3)
    assert len(rows) == min(3, len(r.rounds))
    assert all(row["kept"] <= K for row in rows)
    emitted = "".join(row["emitted"] for row in speculation.describe_rounds(r, None, max_rounds=100))
    assert emitted.startswith("".join(str(t) for t in r.generated_ids[1:]))


# --------------------------------------------------------------------------------------------------
# The real model
# --------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_real_model_ngram_copying_is_exact_and_accepted(smollm, generator):
    """The whole model, the fact notebook 10 builds on: asked to repeat a text, its n-gram drafts are accepted
    (long drafts kept) and the tokens are plain greedy's. That speculative == greedy for any weights, n-gram or
    draft-model, is checked above on the tiny model, on the real model's first two layers by
    tests/test_cli.py::test_speculative_gives_plain_greedy_tokens, and on the whole model by notebook 10 (every
    task, n-gram; a draft of 8 layers)."""
    p = speculation.chat_prompt(smollm.tokenizer, speculation.TASK_PROMPTS["copy: repeat"][0])
    want = generator.generate([p], 20, ignore_eos=True)[0].generated_ids
    ngram = spec.speculative_generate(smollm.params, [p], 20, method="ngram", k=4)[0]
    assert ngram.generated_ids == want
    assert ngram.acceptance > 0.8 and ngram.tokens_per_call > 3  # copying: long drafts accepted


# --------------------------------------------------------------------------------------------------
# Exercises
# --------------------------------------------------------------------------------------------------


def test_exercise_checkers():
    sol = load_solution("10_speculative_decoding")
    assert nb10.check_ngram(sol.my_ngram_propose)
    assert nb10.check_accepted_count(sol.my_accepted_count)
    assert nb10.check_residual(sol.my_residual)
    assert not nb10.check_ngram(lambda ctx, k: ctx[-k:])
    assert not nb10.check_ngram(lambda ctx, k: (_ for _ in ()).throw(NotImplementedError()))
    assert not nb10.check_accepted_count(lambda drafts, target: (drafts == target[:, :-1]).sum(-1))
    assert not nb10.check_residual(lambda p, q: np.maximum(p - q, 0))  # forgot to normalize
