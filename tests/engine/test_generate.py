"""Generation on the tiny config (fast) and the real model: buckets, chunking, no recompiles, sampling."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab import InvalidRequestError, PromptTooLongError, tiny
from jaxlab.engine.generate import Generator, OneDevice, TextStops, jit_decode_on_device
from jaxlab.engine.kvcache import init_cache
from jaxlab.engine.model import forward, init_params
from jaxlab.engine.plan import bucket
from jaxlab.engine.sampling import Sampling, SamplingParams, filter_logits
from jaxlab.engine.steps import GREEDY, jit_prefill
from jaxlab.tools.profile import CompileCounter


@pytest.fixture(scope="module")
def tiny_params():
    return init_params(tiny().replace(max_seq_len=4096), 0)


def reference_greedy(params, ids, n):
    """Greedy by recomputing the whole sequence with the uncached forward each step (the obvious way).

    The sequence is right-padded to one fixed length so a single compiled program serves every step:
    with causal attention, tokens after position t cannot change the logits at t."""
    total = len(ids) + n
    fwd = jax.jit(forward)
    seq = np.zeros((1, total), np.int32)
    seq[0, : len(ids)] = ids
    positions = jnp.arange(total)[None]
    out = []
    for t in range(len(ids), total):
        logits, _ = fwd(params, jnp.asarray(seq), positions)
        seq[0, t] = int(jnp.argmax(logits[0, t - 1]))
        out.append(int(seq[0, t]))
    return out


def test_bucket():
    assert [bucket(n, (32, 64)) for n in (1, 32, 33, 64, 65, 129)] == [32, 32, 64, 64, 128, 192]


def test_greedy_equals_uncached_recompute(tiny_params):
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(3, 263, size=n)) for n in (1, 7, 33)]
    gen = Generator(tiny_params)
    results = gen.generate(prompts, 10, ignore_eos=True)
    for p, r in zip(prompts, results):
        assert r.generated_ids == reference_greedy(tiny_params, p, 10)
        assert r.finish_reason == "length"


def test_the_generators_cache_takes_the_key_layout_of_its_backend_and_dtype(tiny_params):
    """On a CPU its float32 cache holds the keys transposed (``kvcache.key_layout_for``: the test above decodes through
    it); its int8 cache does not."""
    key = jax.random.key(0)
    f32 = OneDevice(Generator(tiny_params), SamplingParams(), key).init_cache(2, 8)
    i8 = OneDevice(Generator(tiny_params, cache_dtype=jnp.int8), SamplingParams(), key).init_cache(2, 8)
    assert (f32.key_layout, i8.key_layout) == ("ds", "sd") and f32.k[0].shape[1:] == (tiny_params.config.head_dim, 8)


def test_chunked_prefill_equals_single_chunk(tiny_params):
    rng = np.random.default_rng(1)
    prompts = [list(rng.integers(3, 263, size=n)) for n in (40, 23)]
    chunked = Generator(tiny_params, prefill_buckets=(8, 16)).generate(prompts, 8, ignore_eos=True, logprobs=True)
    single = Generator(tiny_params, prefill_buckets=(64,)).generate(prompts, 8, ignore_eos=True, logprobs=True)
    for a, b in zip(chunked, single):
        assert a.generated_ids == b.generated_ids
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


def test_no_recompilation_after_warmup(tiny_params):
    gen = Generator(tiny_params)
    gen.warmup(batch_sizes=(1,), max_new_tokens=8)
    rng = np.random.default_rng(2)
    with CompileCounter() as cc:
        for n in (1, 2, 17, 31, 32, 33, 64, 65, 100, 128, 200, 256, 300, 511, 512):
            r = gen.generate([list(rng.integers(3, 263, size=n))], 8, ignore_eos=True)[0]
            assert len(r.generated_ids) == 8 and r.compile_seconds == 0.0
    cc.assert_none("generation recompiled after warm-up")


def test_temperature_change_does_not_recompile(tiny_params):
    gen = Generator(tiny_params)
    gen.generate([[5, 6, 7]], 4, SamplingParams(temperature=0.7))
    with CompileCounter() as cc:
        for sp in (SamplingParams(temperature=1.3, top_k=5), SamplingParams(temperature=0.2, top_p=0.5, min_p=0.1)):
            gen.generate([[5, 6, 7]], 4, sp, seed=3)
    cc.assert_none("changing sampling values recompiled")


def test_logprobs_are_log_softmax_of_the_model(tiny_params):
    ids = [5, 9, 11, 200]
    r = Generator(tiny_params).generate([ids], 5, ignore_eos=True, logprobs=True)[0]
    seq = ids + r.generated_ids
    logits, _ = jax.jit(forward)(tiny_params, jnp.asarray([seq]), jnp.arange(len(seq))[None])
    logp = jax.nn.log_softmax(logits[0], axis=-1)
    want = [float(logp[len(ids) - 1 + i, t]) for i, t in enumerate(r.generated_ids)]
    np.testing.assert_allclose(r.logprobs, want, atol=1e-5)


def test_eos_stops_a_row(tiny_params):
    gen = Generator(tiny_params)
    free = gen.generate([[5, 6]], 12, ignore_eos=True)[0].generated_ids
    eos = free[3]  # pretend the 4th generated token is EOS
    from jaxlab.engine.model import replace_config

    p2 = replace_config(tiny_params, eos_id=eos)
    r = Generator(p2).generate([[5, 6]], 12)[0]
    assert r.finish_reason == "eos"
    assert r.generated_ids == free[: free.index(eos)]


def test_decode_on_device_equals_host_loop(tiny_params):
    ids = [5, 9, 11, 200, 17]
    host = Generator(tiny_params).generate([ids], 9, ignore_eos=True)[0].generated_ids
    cfg = tiny_params.config
    cache = init_cache(cfg, 1, 32)
    first, _, cache = jit_prefill(tiny_params, jnp.asarray([ids]), jnp.arange(5)[None], cache, None, GREEDY)
    out, _ = jit_decode_on_device(tiny_params, first, jnp.asarray([5]), cache, steps=9)
    assert out[0].tolist() == host


def test_text_stops_takes_runs_of_tokens():
    """extend (a speculative round's run of tokens) stops a row where push would: EOS, then the length."""
    rows = TextStops(3, None, eos_id=9, max_new_tokens=4)
    assert rows.extend(0, [1, 2]) and not rows.extend(0, [3, 4, 5])
    assert not rows.extend(1, [7, 9, 8]) and not rows.extend(1, [6])
    assert rows.extend(2, []) and not rows.done
    rows.push(2, 9)
    assert rows.done and rows.ids == [[1, 2, 3, 4], [7], []] and rows.finish == ["length", "eos", "eos"]
    assert [r.finish_reason for r in rows.results([[0]] * 3)] == ["length", "eos", "eos"]


def test_sampling_reproducible_and_seed_dependent(tiny_params):
    gen = Generator(tiny_params)
    sp = SamplingParams(temperature=1.0)
    a = gen.generate([[5, 6, 7]], 16, sp, seed=1, ignore_eos=True)[0].generated_ids
    b = gen.generate([[5, 6, 7]], 16, sp, seed=1, ignore_eos=True)[0].generated_ids
    c = gen.generate([[5, 6, 7]], 16, sp, seed=2, ignore_eos=True)[0].generated_ids
    assert a == b
    assert a != c


def test_filters():
    logits = jnp.log(jnp.asarray([[0.5, 0.2, 0.15, 0.1, 0.05]]))
    one = jnp.float32(1.0)

    def kept(f):
        return (np.asarray(f[0]) > -np.inf).tolist()

    assert kept(filter_logits(logits, Sampling(one, 2, 1.0, 0.0, greedy=False))) == [True, True, False, False, False]
    assert kept(filter_logits(logits, Sampling(one, 0, 0.7, 0.0, greedy=False))) == [True, True, False, False, False]
    assert kept(filter_logits(logits, Sampling(one, 0, 0.71, 0.0, greedy=False))) == [True, True, True, False, False]
    assert kept(filter_logits(logits, Sampling(one, 0, 1.0, 0.25, greedy=False))) == [True, True, True, False, False]
    assert kept(filter_logits(logits, Sampling(one, 0, 1.0, 0.0, greedy=False))) == [True] * 5
    # temperature scales before filtering
    np.testing.assert_allclose(filter_logits(logits, Sampling(jnp.float32(2.0), 0, 1.0, 0.0, greedy=False)), logits / 2)


def test_sampling_frequencies_follow_filtered_distribution():
    from jaxlab.engine.sampling import sample

    logits = jnp.log(jnp.asarray([0.5, 0.2, 0.15, 0.1, 0.05]))[None].repeat(20000, axis=0)
    toks = sample(logits, jax.random.key(0), SamplingParams(temperature=1.0, top_k=3).state())
    freq = np.bincount(np.asarray(toks), minlength=5) / 20000
    np.testing.assert_allclose(freq, [0.5 / 0.85, 0.2 / 0.85, 0.15 / 0.85, 0, 0], atol=0.015)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(max_new_tokens=-3), "max_new_tokens"),
        (dict(prompts=[[]]), "empty"),
        (dict(prompts=[[5, 100000]]), "vocabulary"),
        (dict(prompts=[]), "no prompts"),
        (dict(stop=["x"]), "tokenizer"),
    ],
)
def test_invalid_requests(tiny_params, kwargs, match):
    gen = Generator(tiny_params)
    args = dict(prompts=[[5, 6]], max_new_tokens=4) | kwargs
    with pytest.raises(InvalidRequestError, match=match):
        gen.generate(args.pop("prompts"), **args)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(temperature=-0.5), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=-1), "top_k"),
        (dict(min_p=1.0), "min_p"),
        (dict(temperature=float("nan")), "temperature"),
    ],
)
def test_invalid_sampling(kwargs, match):
    with pytest.raises(InvalidRequestError, match=match):
        SamplingParams(**kwargs)


def test_prompt_too_long(tiny_params):
    gen = Generator(tiny_params)
    with pytest.raises(PromptTooLongError, match="context is 4096"):
        gen.generate([[5] * 4000], 200)


# ---------------------------------------------------------------- real model (tokenizer-level behaviour)


def test_capital_of_france(smollm, generator):
    ids = smollm.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True, tokenize=True
    )
    r = generator.generate([ids], 32)[0]
    assert "Paris" in r.text
    assert r.finish_reason == "eos"


def test_streaming_concatenates_to_text(smollm, generator):
    tok = smollm.tokenizer
    prompts = ["Write three words in Japanese with emoji.", "Say hello in French."]
    ids = [
        tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True)
        for p in prompts
    ]
    pieces = {0: [], 1: []}
    results = generator.generate(ids, 40, on_text=lambda i, s: pieces[i].append(s))
    for i, r in enumerate(results):
        assert "".join(pieces[i]) == r.text == tok.decode(r.generated_ids)
        assert all("\ufffd" not in s for s in pieces[i])


def test_stop_strings(smollm, generator):
    tok = smollm.tokenizer
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "Count from 1 to 10, separated by commas."}],
        add_generation_prompt=True,
        tokenize=True,
    )
    free = generator.generate([ids], 40)[0].text
    assert "5" in free
    streamed = []
    r = generator.generate([ids], 40, stop=["5"], on_text=lambda i, s: streamed.append(s))[0]
    assert r.finish_reason == "stop"
    assert r.text == free[: free.index("5")]
    assert "".join(streamed) == r.text
