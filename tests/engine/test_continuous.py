"""The continuous-batching engine: equal to the contiguous Generator, batch invariant, no compile after warm-up."""

from __future__ import annotations

import random

import numpy as np
import pytest

from jaxlab.engine.continuous import Engine
from jaxlab.engine.generate import Generator
from jaxlab.engine.model import init_params
from jaxlab.engine.programs import Programs, Verdicts
from jaxlab.engine.sampling import SamplingParams
from jaxlab.errors import InvalidRequestError
from jaxlab.io.config import tiny
from jaxlab.tools.profile import CompileCounter


@pytest.fixture(scope="module")
def tiny_params():
    return init_params(tiny(), 7)


def tiny_engine(params, programs=None, **kw):
    """A fresh engine over the tiny model; ``programs``: a compiled-program table to share (each engine compiles
    its own by default), for tests whose check is the tokens, not what an engine compiles."""
    opts = dict(slots=3, page_size=4, chunk=8, context=64)
    opts.update(kw)
    eng = Engine(params, **opts)
    if programs is not None:
        eng.programs = programs  # same config and shapes: the signatures match, nothing else is shared
    return eng


#: The compiled programs of the tiny engines that serve as references ("alone"): fresh engines, one table, so the
#: dozens of single-request engines below compile each program once instead of once per engine.
ALONE_PROGRAMS = Programs()


def alone(params, prompt, n, sampling=None, seed=0, **kw):
    eng = tiny_engine(params, ALONE_PROGRAMS, **kw)
    s = eng.add_request(prompt, sampling, max_new_tokens=n, seed=seed, ignore_eos=True)
    eng.run()
    return s.token_ids


def test_tiny_engine_equals_the_contiguous_generator(tiny_params):
    prompts = [[1, 5, 9, 33, 7, 80, 12, 19, 20, 21, 22], [1, 44], [1] + list(range(100, 130))]
    want = [r.generated_ids for r in Generator(tiny_params).generate(prompts, 12, ignore_eos=True)]
    eng = tiny_engine(tiny_params, ALONE_PROGRAMS)  # the reference engines' programs (top_logprobs runs them again)
    got = [r.generated_ids for r in eng.generate(prompts, 12, ignore_eos=True)]
    assert got == want


def test_the_timings_leave_out_the_compiles_as_the_generators_do(tiny_params):
    """A fresh engine compiles its prefill program before the first token and its decode program after it: prefill and
    decode seconds count neither (as Generator's), so the three timings add up to no more than the call's wall time."""
    import time

    eng = tiny_engine(tiny_params)  # its own program table: this call compiles (or loads) every program it runs
    t0 = time.perf_counter()
    (r,) = eng.generate([[1, 5, 9, 33]], 6, ignore_eos=True)
    wall = time.perf_counter() - t0
    assert r.compile_seconds > 0 and r.prefill_seconds > 0 and r.decode_seconds > 0
    assert r.prefill_seconds + r.decode_seconds + r.compile_seconds <= wall + 1e-3, (r, wall)


def random_mix(rng, n):
    """n requests: (arrival step, prompt, new tokens, sampling, seed)."""
    out = []
    for i in range(n):
        prompt = [1] + [rng.randrange(3, 263) for _ in range(rng.randrange(1, 30))]
        sp = SamplingParams() if rng.random() < 0.5 else SamplingParams(temperature=0.9, top_k=20)
        out.append((rng.randrange(0, 12), prompt, rng.randrange(1, 16), sp, i))
    return out


@pytest.mark.parametrize("seed, speculative", [(0, 0), (1, 0), (2, 0), (0, 3)])
def test_batch_invariance_under_random_arrivals_and_preemptions(tiny_params, seed, speculative):
    """Each request's tokens through a crowded engine (arrivals at random steps, a pool small enough to
    preempt) equal its tokens alone through the same kind of engine; greedy and sampled requests mixed. With
    ``speculative`` drafts (prompt lookup; a preempted request replays its tokens as drafts) they equal plain
    decoding's alone."""
    rng = random.Random(seed)
    mix = random_mix(rng, 9)
    # 12 pages of 4: three long requests do not fit at once
    eng = tiny_engine(tiny_params, num_pages=1 + 12, speculative=speculative)
    streams, step = {}, 0
    pending = sorted(mix, key=lambda m: m[0])
    while pending or eng.has_work:
        while pending and pending[0][0] <= step:
            _, prompt, n, sp, i = pending.pop(0)
            streams[i] = eng.add_request(prompt, sp, max_new_tokens=n, seed=i, ignore_eos=True)
        eng.step()
        step += 1
        assert step < 3000
    assert eng.scheduler.preemptions > 0, "the mix was meant to preempt"
    assert not speculative or eng.accepted > 0, "the drafts were meant to be kept"
    for _, prompt, n, sp, i in mix:
        assert streams[i].token_ids == alone(tiny_params, prompt, n, sp, seed=i), f"request {i}"
        assert len(streams[i].token_ids) == n and streams[i].finish_reason == "length"
    assert eng.pool.free_count == eng.pool.capacity


def test_more_running_than_rows_decode_in_several_calls_with_the_same_tokens(tiny_params):
    """``max_running`` above ``slots``: six requests run at once in a 3-row engine, each step decoding them in
    calls of at most 3 rows, admitted by memory (``kv_tokens``); every request's tokens equal its tokens alone."""
    mix = random_mix(random.Random(3), 6)
    eng = tiny_engine(tiny_params, ALONE_PROGRAMS, max_running=6, kv_tokens=6 * 64, token_budget=6 + 48)
    assert eng.pool.capacity == 6 * 64 // 4 and eng.scheduler.max_running == 6
    streams = {i: eng.add_request(prompt, sp, max_new_tokens=n, seed=i, ignore_eos=True) for _, prompt, n, sp, i in mix}
    most, calls = 0, 0
    while eng.has_work:
        before = sum(eng.runner.bucket_steps.values())
        eng.step()
        most, calls = max(most, len(eng.scheduler.running)), max(calls, sum(eng.runner.bucket_steps.values()) - before)
    assert most > 3 and calls == 2  # up to six running: two decode calls of at most 3 rows in a step
    for _, prompt, n, sp, i in mix:
        assert streams[i].token_ids == alone(tiny_params, prompt, n, sp, seed=i), f"request {i}"


@pytest.mark.parametrize("buckets", [False, True])
def test_the_look_ahead_gives_the_same_tokens_and_logprobs_as_a_step_at_a_time(tiny_params, buckets):
    """``overlap``: a step launches the next decode call before its tokens reach the host. Over arrivals at random
    steps, preemptions, sampled and greedy rows, top logprobs and an abort, every request's tokens and logprobs equal
    those of an engine that waits for each step, and the engine took look-ahead calls, also after a row left one
    (with buckets, the call keeps its rows where they sat)."""
    got, programs = {}, Programs()  # both engines compile the same programs: once
    for overlap in (False, True):
        eng = tiny_engine(tiny_params, programs, num_pages=1 + 16, slots=4, decode_buckets=buckets, overlap=overlap)
        eng.warmup()
        pending = sorted(random_mix(random.Random(7), 9), key=lambda m: m[0])
        streams, step = {}, 0
        with CompileCounter() as cc:
            while pending or eng.has_work:
                while pending and pending[0][0] <= step:
                    _, prompt, n, sp, i = pending.pop(0)
                    streams[i] = eng.add_request(
                        prompt, sp, str(i), max_new_tokens=n + 8, seed=i, logprobs=True, top_logprobs=2 * (i == 3)
                    )
                eng.step()
                step += 1
                if step == 9:
                    victim = next(s.seq.id for s in eng.requests.values() if s.seq.generated)  # one decoding
                    eng.abort(victim)
        assert cc.count == 0, cc.names
        got[overlap] = {i: (s.token_ids, s.logprobs, s.top_logprobs, s.finish_reason) for i, s in streams.items()}
        assert eng.pool.free_count == eng.pool.capacity
    assert got[True] == got[False]
    assert eng.scheduler.preemptions > 0 and got[True][int(victim)][3] == "abort"
    assert eng.ahead_steps["used"] > 10, eng.ahead_steps


def test_the_kv_budget_is_given_once_in_tokens_or_bytes(tiny_params):
    from jaxlab.engine.paged import paged_cache_bytes

    cfg = tiny_params.config
    by_bytes = tiny_engine(tiny_params, kv_bytes=paged_cache_bytes(cfg, 1 + 40, 4))
    assert by_bytes.pool.capacity == 40
    with pytest.raises(InvalidRequestError, match="give the KV budget once"):
        tiny_engine(tiny_params, kv_tokens=256, num_pages=65)
    with pytest.raises(InvalidRequestError, match="fewer than one request's context"):
        tiny_engine(tiny_params, kv_bytes=paged_cache_bytes(cfg, 1 + 8, 4))


def test_the_default_chunk_is_128_prompt_tokens_or_the_contexts_pages(tiny_params):
    """A context shorter than the chunk prefills no positions it cannot hold (a 40-position context: 3 pages of 16);
    a chunk given is kept."""
    assert [Engine(tiny_params, context=c).chunk for c in (40, 128, 256)] == [48, 128, 128]
    assert Engine(tiny_params, context=40, chunk=16).chunk == 16


def test_prefix_reuse_gives_the_same_tokens_and_computes_less(tiny_params):
    system = [1] + list(range(50, 70))  # 21 tokens: 5 full pages of 4
    prompts = [system + [200 + i, 201 + i] for i in range(4)]
    results, programs = {}, Programs()  # the two engines run the same shapes
    for reuse in (False, True):
        eng = tiny_engine(tiny_params, programs, prefix_reuse=reuse, slots=2)
        streams = [eng.add_request(p, max_new_tokens=6, ignore_eos=True) for p in prompts]
        eng.run()
        results[reuse] = ([s.token_ids for s in streams], eng.pool.reused_pages)
    assert results[True][0] == results[False][0]
    # requests 1 and 2 start together, but 2 waits while 1 computes the system prompt: 2, 3 and 4 read its 5 pages
    assert results[False][1] == 0 and results[True][1] == 3 * 5


def test_no_compilation_after_warmup_under_any_mix(tiny_params):
    eng = tiny_engine(tiny_params)
    eng.warmup()
    with CompileCounter() as cc:
        rng = random.Random(5)
        for _, prompt, n, sp, i in random_mix(rng, 6):
            eng.add_request(prompt, sp, max_new_tokens=n, seed=i)
        eng.step()
        eng.abort("2")
        eng.add_request([1] * 50, max_new_tokens=10)  # a long prompt: wider page tables, several chunks
        eng.run()
    assert cc.count == 0, cc.names


@pytest.mark.parametrize("speculative", [0, 3])
def test_decode_buckets_keep_batch_invariance_and_compile_nothing_after_warmup(tiny_params, speculative):
    """With decode buckets, warm-up probes each row bucket and keeps those whose probe row equals the full step's
    bit for bit; requests then decode in the smallest kept bucket that holds them, their tokens those of the same
    requests alone, and no mix compiles anything; with speculative drafts too (the probe runs the verify step)."""
    eng = tiny_engine(tiny_params, slots=4, decode_buckets=True, speculative=speculative)
    eng.warmup()
    assert set(eng.runner.bucket_probe) == {1, 2, 4} and eng.runner.bucket_probe[4]
    assert eng.runner.row_buckets == tuple(b for b in (1, 2, 4) if eng.runner.bucket_probe[b])
    mix = random_mix(random.Random(11), 6)
    with CompileCounter() as cc:
        streams = {i: eng.add_request(prompt, sp, max_new_tokens=n, seed=i, ignore_eos=True)
                   for _, prompt, n, sp, i in mix}  # fmt: skip
        eng.run()
    assert cc.count == 0, cc.names
    assert set(eng.runner.bucket_steps) <= set(eng.runner.row_buckets)
    if len(eng.runner.row_buckets) > 1:  # the tail of the run, fewer than 4 running, took a smaller bucket
        assert min(eng.runner.bucket_steps) < 4, eng.runner.bucket_steps
    for _, prompt, n, sp, i in mix:
        assert streams[i].token_ids == alone(tiny_params, prompt, n, sp, seed=i), f"request {i}"
    assert not speculative or eng.accepted > 0


def test_with_int8_weights_and_pages_every_bucket_is_kept_and_one_request_decodes_alone():
    """int8 weights and pages compute a row alike at every row count (tests/engine/test_model.py), so the probe keeps
    every bucket, a lone request decodes in the 1-row bucket, and a mix still equals each request alone. The probe
    row has a page of its own: in the null page, which the padding rows write, it read their keys instead."""
    from jaxlab.quant import quantize_params

    params = quantize_params(init_params(tiny(), 7), "int8")
    programs = Programs()
    eng = tiny_engine(params, programs, slots=4, decode_buckets=True, cache_dtype="int8")
    eng.runner.verdicts = Verdicts("")
    eng.warmup()
    assert eng.runner.row_buckets == (1, 2, 4), eng.runner.bucket_probe
    mix = random_mix(random.Random(5), 5)
    streams = {i: eng.add_request(prompt, sp, max_new_tokens=n, seed=i, ignore_eos=True)
               for _, prompt, n, sp, i in mix}  # fmt: skip
    eng.run()
    assert 1 in eng.runner.bucket_steps, eng.runner.bucket_steps  # the last request ran alone
    for _, prompt, n, sp, i in mix:
        ref = tiny_engine(params, programs, slots=4, decode_buckets=True, cache_dtype="int8")
        ref.runner.row_buckets = eng.runner.row_buckets  # the probe's verdict, not probed again
        s = ref.add_request(prompt, sp, max_new_tokens=n, seed=i, ignore_eos=True)
        ref.run()
        assert streams[i].token_ids == s.token_ids, f"request {i}"


def test_the_probes_verdicts_are_kept_beside_the_compile_cache(tiny_params, tmp_path):
    """A second engine with the same programs on the same host takes the probe's verdicts from the first (kept in
    the compile cache's folder, keyed by the program's text and the host) and runs no probe; other programs (more
    slots), or a file that cannot be read, probe again."""
    probed = []

    def engine(slots):
        eng = tiny_engine(tiny_params, slots=slots, decode_buckets=True)
        eng.runner.verdicts = Verdicts(tmp_path)
        real = eng.runner.probe_buckets
        eng.runner.probe_buckets = lambda buckets: probed.append(slots) or real(buckets)
        eng.warmup()
        return eng.runner

    first = engine(4)
    assert probed == [4] and not first.probe_stored and (tmp_path / Verdicts.FILE).exists()
    second = engine(4)
    assert probed == [4] and second.probe_stored
    assert (second.bucket_probe, second.row_buckets) == (first.bucket_probe, first.row_buckets)
    assert not engine(8).probe_stored and probed == [4, 8]
    (tmp_path / Verdicts.FILE).write_text("{not json")
    assert not engine(4).probe_stored and probed == [4, 8, 4]


def test_a_bucket_whose_probe_differs_is_not_used(tiny_params, monkeypatch):
    eng = tiny_engine(tiny_params, slots=4, decode_buckets=True)
    eng.runner.verdicts = Verdicts("")  # keep nothing: this probe's verdict is made up
    monkeypatch.setattr(eng.runner, "probe_buckets", lambda buckets: {b: b != 2 for b in buckets})
    eng.warmup()
    assert eng.runner.row_buckets == (1, 4)
    streams = [eng.add_request([1, 5 + i], max_new_tokens=3, ignore_eos=True) for i in range(2)]
    eng.run()  # two running: bucket 2 would hold them, but it was dropped
    assert (
        all(len(s.token_ids) == 3 for s in streams)
        and 2 not in eng.runner.bucket_steps
        and 4 in eng.runner.bucket_steps
    )


def test_abort_frees_the_slot_and_pages_at_once(tiny_params):
    eng = tiny_engine(tiny_params, slots=1)
    a = eng.add_request([1, 2, 3, 4, 5, 6], max_new_tokens=30, ignore_eos=True)
    b = eng.add_request([1, 9], max_new_tokens=2, ignore_eos=True)
    eng.step()
    eng.step()
    assert eng.scheduler.running[0].id == a.request_id and eng.pool.used > 0
    assert eng.abort(a.request_id) and not eng.abort("no such request")
    assert a.finished and a.finish_reason == "abort" and eng.pool.used == 0
    eng.step()
    assert eng.scheduler.running and eng.scheduler.running[0].id == b.request_id
    eng.run()
    assert b.finish_reason == "length" and len(b.token_ids) == 2


def test_bad_requests_say_what_to_do(tiny_params):
    eng = tiny_engine(tiny_params)
    with pytest.raises(InvalidRequestError, match="empty"):
        eng.add_request([], max_new_tokens=3)
    with pytest.raises(InvalidRequestError, match="at most 64"):
        eng.add_request([1] * 60, max_new_tokens=10)
    with pytest.raises(InvalidRequestError, match="tokenizer"):
        eng.add_request([1, 2], max_new_tokens=3, stop=["x"])  # stop strings need text: this engine has none
    assert not eng.has_work and not eng.requests  # nothing refused was queued
    eng.add_request([1, 2], request_id="x")
    with pytest.raises(InvalidRequestError, match="already running"):
        eng.add_request([1, 2], request_id="x")
    with pytest.raises(InvalidRequestError, match="context"):
        Engine(tiny_params, context=10_000)
    assert eng.has_work  # the failed requests left nothing behind but the one accepted


# --------------------------------------------------------------------------------------------------
# The real model
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine(smollm):
    # context 256 = one page-table width (paged.BLOCK_TOKENS): warm-up compiles one decode and one prefill program,
    # all these short requests need (the widths past the first: test_chunks_of_one_step_may_cross_page_table_widths)
    eng = Engine(smollm.params, smollm.tokenizer, slots=4, page_size=16, chunk=64, context=256)
    eng.warmup()
    return eng


def test_real_model_greedy_tokens_equal_the_generator(engine, generator, smollm):
    tok = smollm.tokenizer
    texts = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a land far away, there lived"]
    prompts = [tok.encode(t) for t in texts]
    want = generator.generate(prompts, max_new_tokens=16, ignore_eos=True)
    with CompileCounter() as cc:
        got = engine.generate(prompts, max_new_tokens=16, ignore_eos=True)
    assert cc.count == 0
    for w, g in zip(want, got):
        assert g.generated_ids == w.generated_ids and g.text == w.text


def test_real_model_speculative_engine_gives_plain_greedys_tokens(engine, smollm):
    """Speculative decoding on the engine with the real model: a copy-heavy prompt and an open-ended one in one
    batch, each row its own accepted run; the tokens are the plain engine's (greedy, which the test above ties to
    the Generator), in fewer row-calls."""
    from jaxlab.bench.speculative import PARAGRAPH
    from jaxlab.io.tokenizer import prompt_ids

    tok = smollm.tokenizer
    prompts = [prompt_ids(tok, f"Repeat this text exactly: {PARAGRAPH}"), tok.encode("Once upon a time, in a land")]
    want = [r.generated_ids for r in engine.generate(prompts, 24, ignore_eos=True)]
    spec = Engine(smollm.params, tok, slots=4, page_size=16, chunk=64, context=256, speculative=4)
    spec.programs = engine.programs  # the same prefill program; the verify program is compiled once more
    got = [r.generated_ids for r in spec.generate(prompts, 24, ignore_eos=True)]
    assert got == want
    assert spec.accepted > 10 and spec.row_calls < 2 * 23


def test_pallas_attention_gives_the_same_tokens_with_no_compile_after_warmup(small_model):
    """The engine with ``attention="pallas"`` (the ragged paged kernel, interpret mode on a CPU): the XLA engine's
    greedy tokens, past a page boundary, and 0 compilations once warm. On the embedded model's first two layers
    (its weights, GQA and head size): the kernel runs per layer, and 30 layers of it in interpret mode took
    tens of seconds to compile. The whole model with the Pallas kernels: notebook 13 (greedy tokens equal XLA's)."""
    from jaxlab.engine.model import with_attention

    tok = small_model.tokenizer
    prompts = [tok.encode(t) for t in ("The capital of France is", "def fibonacci(n):")]
    opts = dict(slots=2, page_size=16, chunk=64, context=256)
    # 16 new tokens after a prompt of 5+ tokens: the decode steps write and read a second page of 16
    want = Engine(small_model.params, tok, **opts).generate(prompts, max_new_tokens=16, ignore_eos=True)
    kern = Engine(with_attention(small_model.params, "pallas"), tok, **opts)
    kern.warmup()
    with CompileCounter() as cc:
        got = kern.generate(prompts, max_new_tokens=16, ignore_eos=True)
    assert cc.count == 0, cc.names
    assert [g.generated_ids for g in got] == [w.generated_ids for w in want]


def test_real_model_streams_text_and_stops(engine, smollm):
    tok = smollm.tokenizer
    s = engine.add_request(tok.encode("The capital of France is"), max_new_tokens=24, stop=["."])
    pieces = list(s)
    assert "".join(pieces) == s.text and "Paris" in s.text and "." not in s.text
    assert s.finish_reason == "stop" and s.first_token_at is not None


def test_real_model_with_the_extraction_schema_answers_valid_json(engine, smollm):
    """The base model's replies to the extraction task, constrained by its schema: every one valid, in the programs
    the unconstrained requests use (nothing compiles)."""
    from jaxlab.engine.grammar import Constraint
    from jaxlab.io.assets import data_file
    from jaxlab.io.tokenizer import prompt_ids
    from jaxlab.train.data import read_jsonl
    from jaxlab.train.task import SCHEMA, fields_exact, schema_valid

    items = read_jsonl(data_file("finetune", "test.jsonl"))[:4]
    prompts = [prompt_ids(smollm.tokenizer, e["prompt"]) for e in items]
    with CompileCounter() as cc:
        got = engine.generate(prompts, 96, constraint=Constraint.json_schema(SCHEMA))
    assert cc.count == 0
    assert all(r.finish_reason == "eos" and schema_valid(r.text) for r in got), [r.text for r in got]
    assert sum(fields_exact(r.text, e["answer"]) for r, e in zip(got, items)) / len(items) >= 0.5


def test_logits_on_real_weights_equal_the_contiguous_cache(small_model):
    """Logits within 1e-5 (float32) of the contiguous cache for a prompt and decode steps on the real weights (the
    embedded model's first two layers; pages in reverse order). The whole model through the paged cache:
    test_real_model_greedy_tokens_equal_the_generator."""
    import jax.numpy as jnp
    from conftest import jit_forward as forward

    from jaxlab.engine.kvcache import init_cache
    from jaxlab.engine.paged import init_paged_cache

    params = small_model.params
    ids = small_model.tokenizer.encode("The quick brown fox jumps over the lazy dog because")
    n = len(ids)
    ref_cache = init_cache(params.config, 1, 256)
    pcache = init_paged_cache(params.config, 17, 16).with_table(np.asarray([list(range(16, 0, -1))]))
    pos = jnp.arange(n)[None]
    ref, ref_cache = forward(params, jnp.asarray([ids]), pos, ref_cache, last_only=True)
    got, pcache = forward(params, jnp.asarray([ids]), pos, pcache, last_only=True)
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), atol=1e-5, rtol=0)
    tok = jnp.argmax(ref[:, 0], -1)
    for i in range(3):
        p = jnp.asarray([[n + i]])
        ref, ref_cache = forward(params, tok[:, None], p, ref_cache, last_only=True)
        got, pcache = forward(params, tok[:, None], p, pcache, last_only=True)
        np.testing.assert_allclose(np.asarray(got), np.asarray(ref), atol=1e-5, rtol=0)
        tok = jnp.argmax(ref[:, 0], -1)


def test_chunks_of_one_step_may_cross_page_table_widths(tiny_params, monkeypatch):
    """Several chunks of one long prompt in one step, the later ones past the first chunk's table width: each
    call reads the table as wide as its own chunk needs (the pages taken for the later chunks are not read)."""
    from jaxlab.engine import paged

    monkeypatch.setattr(paged, "BLOCK_TOKENS", 16)  # widths 16, 32, 64
    prompt = [1] + list(range(30, 69))  # 40 tokens: chunks [0,8) ... [32,40), four per step
    eng = tiny_engine(tiny_params, slots=2, token_budget=2 + 32)
    assert eng.runner.widths == (16, 32, 64)
    got = eng.generate([prompt], max_new_tokens=6, ignore_eos=True)[0].generated_ids
    want = Generator(tiny_params).generate([prompt], 6, ignore_eos=True)[0].generated_ids
    assert got == want


def test_top_logprobs_come_with_each_token(tiny_params):
    """A request asking for top logprobs gets, per token, that many alternatives, most likely first; greedy picks
    the first of them, with the logprob reported for the token itself; a request beside it is unchanged.

    And what the steps hand out is each request's record, in pieces: the outputs' token ids, logprobs and text add
    up to the stream's, nothing twice, the last one finished with its reason; with logprobs asked each new token
    comes with its own text and its alternatives' texts (detokenized by the engine, so a server forwards them)."""
    from conftest import byte_tokenizer

    tok = byte_tokenizer()
    prompt = [1, 5, 9, 33, 7]
    eng = tiny_engine(tiny_params, tokenizer=tok)
    plain = eng.add_request([1, 44, 45], max_new_tokens=6, ignore_eos=True)
    top = eng.add_request(prompt, max_new_tokens=6, ignore_eos=True, top_logprobs=3)
    got: dict[str, list] = {plain.request_id: [], top.request_id: []}
    while eng.has_work:
        for o in eng.step():
            got[o.request_id].append(o)
    assert len(top.top_logprobs) == len(top.token_ids) == 6 == len(top.logprobs)
    for tok_id, lp, alts in zip(top.token_ids, top.logprobs, top.top_logprobs):
        assert len(alts) == 3 and alts[0][0] == tok_id and alts[0][1] == pytest.approx(lp, abs=1e-6)
        assert alts[0][1] >= alts[1][1] >= alts[2][1]
    alone = tiny_engine(tiny_params, ALONE_PROGRAMS).add_request([1, 44, 45], max_new_tokens=6, ignore_eos=True)
    alone = alone.result()
    assert (
        plain.token_ids == alone.generated_ids
        and top.token_ids
        == tiny_engine(tiny_params, ALONE_PROGRAMS).generate([prompt], 6, ignore_eos=True)[0].generated_ids
    )
    for stream in (plain, top):
        outs = got[stream.request_id]
        assert [o.finished for o in outs] == [False] * (len(outs) - 1) + [True]
        assert outs[-1].finish_reason == stream.finish_reason and outs[-1].total_tokens == len(stream.token_ids)
        assert sum((o.token_ids for o in outs), []) == stream.token_ids
        assert "".join(o.text for o in outs) == stream.text
    assert not any(o.logprobs or o.token_texts or o.top for o in got[plain.request_id])
    outs = got[top.request_id]
    assert sum((o.logprobs for o in outs), []) == top.logprobs
    assert sum((o.token_texts for o in outs), []) == [tok.decode([t]) for t in top.token_ids]
    assert sum((o.top for o in outs), []) == [[(tok.decode([i]), v) for i, v in a] for a in top.top_logprobs]
    with pytest.raises(InvalidRequestError, match="top_logprobs"):
        eng.add_request(prompt, top_logprobs=21)


SPEC_PROMPTS = [[1] + [5, 6, 7, 8] * 6, [1, 9, 10, 11, 9, 10, 11, 9, 10], [1, 44, 45], [1, 70, 71, 72, 70, 71]]


def test_speculative_rows_keep_their_own_runs_and_give_plain_greedys_tokens(tiny_params):
    """Speculative decoding on the engine (prompt lookup, ``speculative=k``): each row carries its own drafts and
    advances by its own accepted count in the same step; every request's tokens equal plain greedy's, in fewer
    decode rows; a sampling row beside them is unchanged (it carries no drafts)."""
    plain = tiny_engine(tiny_params, ALONE_PROGRAMS, slots=4)
    want = [r.generated_ids for r in plain.generate(SPEC_PROMPTS, 20, ignore_eos=True)]
    sp = SamplingParams(temperature=0.8)
    want_sampled = alone(tiny_params, [1, 3, 4], 10, sp, seed=5, slots=4)
    eng = tiny_engine(tiny_params, slots=4, max_running=5, speculative=4)
    streams = [eng.add_request(p, max_new_tokens=20, ignore_eos=True) for p in SPEC_PROMPTS]
    sampled = eng.add_request([1, 3, 4], sp, max_new_tokens=10, seed=5, ignore_eos=True)
    advances = []
    while eng.has_work:
        before = [len(s.token_ids) for s in streams]
        eng.step()
        advances.append([len(s.token_ids) - b for s, b in zip(streams, before)])
    assert [s.token_ids for s in streams] == want and sampled.token_ids == want_sampled
    assert eng.accepted > 0 and eng.row_calls < plain.row_calls
    assert any(len({a for a in step if a}) > 1 for step in advances), "no step advanced rows by different counts"
    assert max(max(step) for step in advances) > 1
