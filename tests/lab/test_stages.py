"""jaxlab.lab.stages (notebooks 04 and 06; the ladder it imports from jaxlab.bench.stages) and the exercise checkers nb04/nb06.

Every stage is an optimization of the one before, so every stage must give the same greedy tokens;
vmap over one sequence must equal the batched model; a ragged batch must equal each prompt alone.
Most tests use the tiny config with numpy-drawn weights (fast, no per-op compiles); one uses the real
model's first two layers (``small_model``); notebook 04 checks every stage against the golden file on the whole
model.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import load_solution

from jaxlab.engine.generate import Generator
from jaxlab.engine.kernels import common
from jaxlab.engine.kvcache import init_cache
from jaxlab.engine.model import forward
from jaxlab.engine.plan import bucket
from jaxlab.engine.sampling import Sampling, SamplingParams, filter_logits
from jaxlab.lab import stages
from jaxlab.lab.exercises import nb04, nb06
from jaxlab.tools.profile import CompileCounter, Roofline
from jaxlab.tools.program_export import tiny_params


@pytest.fixture(scope="module")
def params():
    """Tiny random weights large enough that greedy tokens vary from step to step (the nb04 checker's too)."""
    return tiny_params()


_jit_forward = jax.jit(forward)


def uncached_greedy(params, ids, n):
    """The obvious reference: the whole sequence through the uncached forward, argmax, append.

    Right-padded to one length so one compiled program serves every step (a causal model's logits at
    position t do not depend on the tokens after t)."""
    total = len(ids) + n
    seq = np.zeros((1, total), np.int32)
    seq[0, : len(ids)] = ids
    for t in range(len(ids), total):
        logits, _ = _jit_forward(params, jnp.asarray(seq), jnp.arange(total)[None])
        seq[0, t] = int(jnp.argmax(logits[0, t - 1]))
    return seq[0, len(ids) :].tolist()


# ------------------------------------------------------------------------------------ padding


def test_left_pad_puts_padding_first_at_position_minus_one():
    tokens, positions = stages.left_pad([[5, 6, 7], [8]], pad_id=2)
    assert tokens.tolist() == [[5, 6, 7], [2, 2, 8]]
    assert positions.tolist() == [[0, 1, 2], [-1, -1, 0]]
    assert tokens.dtype == positions.dtype == np.int32
    with pytest.raises(ValueError, match="longer"):
        stages.left_pad([[1, 2, 3]], 0, length=2)


@pytest.mark.parametrize("n", [1, 3, 4, 5, 8, 9, 17])
def test_pad_to_bucket(n):
    tokens, positions = stages.pad_to_bucket(list(range(10, 10 + n)), (4, 8), pad_id=0)
    length = bucket(n, (4, 8))
    assert tokens.shape == positions.shape == (length,)
    assert tokens[length - n :].tolist() == list(range(10, 10 + n)) and (tokens[: length - n] == 0).all()
    assert positions.tolist() == [-1] * (length - n) + list(range(n))


# ------------------------------------------------------------------------------------ notebook 04 stages


def test_every_stage_gives_the_uncached_greedy_tokens(params):
    ids = [5, 9, 11, 200, 17, 3, 80]
    want = uncached_greedy(params, ids, 10)
    assert len(set(want)) > 3  # the weights make a varied sequence, so the comparison means something
    naive = stages.naive_generate(params, ids, 5)  # lengths 7..11: shapes no other test gives it
    assert naive.compiles == 5  # five lengths, five shapes, five programs
    again = stages.naive_generate(params, ids, 5)
    assert again.compiles == 0 and again.compile_s == 0  # the same shapes: kept programs
    runs = [
        naive,
        again,
        stages.padded_generate(params, ids, 10),
        stages.cached_generate(params, ids, 10),
        stages.cached_generate(params, ids, 6, jit=False),
        stages.on_device_generate(params, ids, 10),
    ]
    for r in runs:
        assert r.tokens == want[: len(r.tokens)], r.name
        assert r.run_s > 0 and r.compile_s >= 0
        assert set(r.row()) >= {"stage", "tokens", "compiles", "compile s", "tokens/s"}


def test_padded_compiles_once_per_bucket(params):
    """(The naive stage's one program per length: test_every_stage_gives_the_uncached_greedy_tokens.)"""
    padded = stages.padded_generate(params, [7, 8, 9], 6, buckets=(24,))  # a buffer length no other test uses
    assert padded.compiles == 1
    other = stages.padded_generate(params, [4, 5, 6, 7, 8, 9, 10, 11], 6, buckets=(24,))  # same bucket
    assert other.compiles == 0


def test_cached_and_on_device_compile_nothing_the_second_time(params):
    stages.cached_generate(params, [5, 6, 7], 6)
    stages.on_device_generate(params, [5, 6, 7], 6)
    with CompileCounter() as cc:
        a = stages.cached_generate(params, [9, 10, 11, 12], 6)
        b = stages.on_device_generate(params, [9, 10, 11, 12], 6)
    assert cc.count == 0 and a.compiles == b.compiles == 0
    assert a.tokens == b.tokens == uncached_greedy(params, [9, 10, 11, 12], 6)
    assert len(a.step_s) == 5


def test_eager_stage_counts_its_first_step_as_compile(params):
    r = stages.cached_generate(params, [5, 6, 7], 4, jit=False)
    assert len(r.step_s) == 2  # 3 decode steps, the first one counted as compilation
    assert r.compile_s > 0


def test_greedy_decode_step_matches_the_forward_argmax(params):
    cfg = params.config
    tokens, positions = stages.left_pad([[5, 6, 7], [8, 9]], cfg.pad_id)
    cache = init_cache(cfg, 2, 8)
    _, cache = _jit_forward(params, jnp.asarray(tokens), jnp.asarray(positions), cache)
    step = jax.jit(stages.greedy_decode_step)
    nxt, cache2 = step(params, jnp.asarray([20, 21], jnp.int32), jnp.asarray([3, 2], jnp.int32), cache)
    for row, seq in enumerate(([5, 6, 7, 20], [8, 9, 21, 0])):  # row 1 right-padded: causal, so harmless
        logits, _ = _jit_forward(params, jnp.asarray([seq]), jnp.arange(4)[None])
        assert int(nxt[row]) == int(jnp.argmax(logits[0, 3 - row]))
    assert int(cache2.index) == 4 and nxt.dtype == jnp.int32


def test_stage_helpers():
    assert stages.first_difference([1, 2, 3], [1, 2, 4]) == 2
    assert stages.first_difference([1, 2], [1, 2, 3]) is None
    assert stages.break_even_tokens(2.0, 0.01, 0.11) == pytest.approx(20.0)
    assert stages.break_even_tokens(2.0, 0.1, 0.05) == float("inf")
    run = stages.StageRun("x", [1, 2, 3, 4], compiles=1, compile_s=1.0, run_s=1.0)
    assert run.tokens_per_s == 4.0 and run.tokens_per_s_with_compile == 2.0


# ------------------------------------------------------------------------------------ notebook 06


def test_vmap_over_one_sequence_equals_the_batched_model(params):
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12, 13], [14], [100, 101]]
    batched = stages.step_generate(params, prompts, 6, step="batched", cache_len=16)
    vmapped = stages.step_generate(params, prompts, 6, step="vmap", cache_len=16)
    assert batched.tokens.shape == (4, 6)
    np.testing.assert_array_equal(vmapped.tokens, batched.tokens)
    assert stages.logits_agree(vmapped.last_logits, batched.last_logits)
    # the same work, measured with rows_alike's copies of zeros off: under vmap a row's norm and softmax get copies
    # sized for one row, which the batched arrays of this tiny model need fewer of (kernels/common.py); a cache
    # length no other program here has, so both are traced and compiled under the patch
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(common, "ALIKE_ELEMENTS", 0)
        cb, cv = stages.step_cost(params, 4, "batched", 24), stages.step_cost(params, 4, "vmap", 24)
    assert cv["flops"] == pytest.approx(cb["flops"], rel=0.01)


def test_ragged_batch_equals_each_prompt_alone_and_the_uncached_reference(params):
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12, 13], [14]]
    batched = stages.step_generate(params, prompts, 5, cache_len=16)
    for i, p in enumerate(prompts):
        alone = stages.step_generate(params, [p], 5, cache_len=16)
        np.testing.assert_array_equal(alone.tokens[0], batched.tokens[i])
        assert stages.logits_agree(alone.last_logits[0], batched.last_logits[i])
        assert batched.tokens[i].tolist() == uncached_greedy(params, p, 5)
    with pytest.raises(ValueError, match="do not fit"):
        stages.step_generate(params, prompts, 20, cache_len=16)


def test_logits_agree():
    a = np.array([1.0, -2.0, 10.0])
    assert stages.logits_agree(a, a + 1e-4)
    assert not stages.logits_agree(a, a + 0.1)
    assert not stages.logits_agree(a, a[:2])


def test_throughput_rows_and_roofline(params):
    rows = stages.throughput_vs_batch(params, (1, 2), steps=2, context=4, cache_len=8)
    assert [r["batch"] for r in rows] == [1, 2]
    assert rows[0]["x batch 1"] == 1.0 and all(r["tokens/s"] > 0 for r in rows)
    stages.add_roofline(rows, params, Roofline(bandwidth=1e10, peak_flops=1e11))
    assert rows[1]["FLOP/byte"] > rows[0]["FLOP/byte"]
    assert all(r["bound"] in ("memory", "compute") and r["bound tokens/s"] > 0 for r in rows)


def test_decode_step_cost_counts_weights_once_per_batch(params):
    f1, b1 = stages.decode_step_cost(params, 1, 8)
    f4, b4 = stages.decode_step_cost(params, 4, 8)
    assert f4 == pytest.approx(4 * f1)
    assert b1 > params.nbytes() and b4 - params.nbytes() == pytest.approx(4 * (b1 - params.nbytes()))


def test_filtered_probabilities_and_sample_frequencies():
    toy = np.array([2.0, 1.5, 1.0, 0.0, -0.5, -2.0], np.float32)
    assert stages.filtered_probabilities(toy, SamplingParams()).tolist() == [1, 0, 0, 0, 0, 0]
    p = stages.filtered_probabilities(toy, SamplingParams(temperature=1.0, top_k=2))
    assert (p[2:] == 0).all() and p.sum() == pytest.approx(1.0)
    sp = SamplingParams(temperature=1.0, top_p=0.9)
    want = stages.filtered_probabilities(toy, sp)
    freq = stages.sample_frequencies(toy, sp, draws=4000, seed=0)
    assert np.abs(freq - want).max() < 0.03 and freq[want == 0].sum() == 0
    np.testing.assert_array_equal(freq, stages.sample_frequencies(toy, sp, draws=4000, seed=0))


class FakeTokenizer:
    """Enough of a tokenizer for the explorer on the tiny model."""

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True):
        return [3 + (ord(ch) % 200) for ch in messages[-1]["content"]][:12]

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(97 + i % 26) for i in ids)


def test_explorer_callback_runs_headless_and_streams(params, monkeypatch):
    import jaxlab.io.tokenizer as tokmod

    class Stream:  # the Generator streams through StreamDecoder; give it our fake tokenizer's text
        def __init__(self, tok):
            self.tok = tok

        def push(self, i):
            return self.tok.decode([i])

        def flush(self):
            return ""

    monkeypatch.setattr(tokmod, "StreamDecoder", Stream)
    gen = Generator(params, FakeTokenizer())
    ex = stages.Explorer(gen, FakeTokenizer(), prompt="hello", max_new_tokens=6)
    pieces = []
    a = ex.generate("hello there", temperature=0.9, top_p=0.8, seed=3, on_text=pieces.append)
    assert "".join(pieces) == a and len(a) > 0
    assert ex.generate("hello there", temperature=0.9, top_p=0.8, seed=3) == a
    with CompileCounter() as cc:  # new slider values: no recompilation
        ex.generate("hello there", temperature=0.3, top_p=0.5, seed=4)
    assert cc.count == 0


def test_explorer_widget_button_fills_the_output(params, monkeypatch):
    pytest.importorskip("ipywidgets")
    calls = []
    ex = stages.Explorer(Generator(params, FakeTokenizer()), FakeTokenizer(), prompt="hi", max_new_tokens=4)
    monkeypatch.setattr(ex, "generate", lambda *a, on_text=None, **k: (calls.append(a), on_text("xyz"))[1])
    box = ex.widget()
    assert box.children and set(ex.widgets) == {"prompt", "temperature", "top_p", "seed", "button", "output"}
    ex.widgets["temperature"].value = 1.3
    ex.widgets["button"].click()
    assert calls == [("hi", 1.3, 0.9, 0)]
    assert any("xyz" in o.get("text", "") for o in ex.widgets["output"].outputs)


# ------------------------------------------------------------------------------------ exercise checkers


def stub(*args):
    raise NotImplementedError


def test_nb04_checkers_fail_on_wrong_answers_and_pass_on_the_solutions(capsys):
    sol = load_solution("04_jit_and_generation")
    assert not nb04.check_pad_to_bucket(stub)
    assert "not implemented yet" in capsys.readouterr().out

    def right_padded(ids, buckets, pad_id):
        t, p = sol.my_pad_to_bucket(ids, buckets, pad_id)
        return t[::-1], p[::-1]

    def no_overflow(ids, buckets, pad_id):  # forgets "past the largest bucket, the next multiple"
        length = next((b for b in buckets if len(ids) <= b), buckets[-1])
        return sol.my_pad_to_bucket(ids, (max(length, len(ids)),), pad_id)

    assert not nb04.check_pad_to_bucket(right_padded)
    assert not nb04.check_pad_to_bucket(no_overflow)
    assert "FAIL" in capsys.readouterr().out
    assert nb04.check_pad_to_bucket(sol.my_pad_to_bucket)
    assert "PASS" in capsys.readouterr().out

    def forgets_the_cache(params, token, pos, cache):
        nxt, _ = sol.my_decode_step(params, token, pos, cache)
        return nxt, cache

    def wrong_position(params, token, pos, cache):
        return sol.my_decode_step(params, token, pos + 1, cache)

    assert not nb04.check_decode_step(stub)
    assert not nb04.check_decode_step(forgets_the_cache)
    assert not nb04.check_decode_step(wrong_position)
    out = capsys.readouterr().out
    assert out.count("FAIL") == 3 and "not implemented yet" in out
    assert nb04.check_decode_step(sol.my_decode_step)
    assert nb04.check_decode_step(stages.greedy_decode_step)


def test_nb06_checkers_fail_on_wrong_answers_and_pass_on_the_solutions(capsys):
    sol = load_solution("06_batching_and_sampling")
    assert not nb06.check_top_p(stub) and not nb06.check_min_p(stub)
    assert capsys.readouterr().out.count("not implemented yet") == 2

    def top_p_excluding_boundary(logits, top_p):  # keeps tokens whose cumulative mass is < top_p
        logits = jnp.asarray(logits)
        order = jnp.sort(logits, axis=-1)[..., ::-1]
        cum = jnp.cumsum(jax.nn.softmax(order, axis=-1), axis=-1)
        cutoff = jnp.min(jnp.where(cum < top_p, order, jnp.inf), axis=-1, keepdims=True)
        return jnp.where(logits < cutoff, -jnp.inf, logits)

    def min_p_on_logits(logits, min_p):  # compares logits instead of probabilities
        logits = jnp.asarray(logits)
        return jnp.where(logits < min_p * logits.max(axis=-1, keepdims=True), -jnp.inf, logits)

    assert not nb06.check_top_p(top_p_excluding_boundary)
    assert not nb06.check_top_p(sol.my_min_p)
    assert not nb06.check_min_p(min_p_on_logits)
    assert not nb06.check_min_p(lambda logits, p: np.where(np.isinf(sol.my_min_p(logits, p)), -1e9, logits))
    assert nb06.check_top_p(sol.my_top_p)
    assert nb06.check_min_p(sol.my_min_p)


def test_nb06_references_are_filter_logits():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 30)).astype(np.float32)
    one = np.float32(1.0)
    np.testing.assert_array_equal(
        nb06.reference_top_p(logits, 0.7),
        filter_logits(logits, Sampling(one, np.int32(0), np.float32(0.7), np.float32(0.0), greedy=False)),
    )
    np.testing.assert_array_equal(
        nb06.reference_min_p(logits, 0.2),
        filter_logits(logits, Sampling(one, np.int32(0), np.float32(1.0), np.float32(0.2), greedy=False)),
    )


# ------------------------------------------------------------------------------------ the real model


def test_stages_on_real_weights_give_the_uncached_greedy_ids(small_model):
    """The first two layers of the real model (its shapes: 9 query heads over 3 KV heads, a 49152-token
    vocabulary) on golden prompt 1: padded, cached and on-device greedy give the uncached reference's tokens.
    That they give the golden ids on the whole model is notebook 04's own check (each stage == golden)."""
    from jaxlab.tools.reference import load_golden

    ids = load_golden()["prompts"][1]["prompt_ids"]
    want = uncached_greedy(small_model.params, ids, 12)
    assert len(set(want)) > 3  # real weights, varied tokens: the comparison means something
    for r in (
        stages.padded_generate(small_model.params, ids, 4),
        stages.cached_generate(small_model.params, ids, 12),
        stages.on_device_generate(small_model.params, ids, 12),
    ):
        assert r.tokens == want[: len(r.tokens)], r.name


def test_stage_figures_have_titles_and_labels():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [
        stages.StageRun("1 naive: recompute", [1, 2], compiles=2, compile_s=1.0, run_s=0.5),
        stages.StageRun("3e cached: eager step (no jit)", [1, 2, 3], compiles=1, compile_s=0.2, run_s=0.3),
    ]
    try:
        for fig in (stages.plot_stage_speed(runs), stages.plot_compile_vs_run(runs)):
            ax = fig.axes[0]
            assert ax.get_title() and ax.get_xlabel()
            assert [t.get_text() for t in ax.get_yticklabels()] == ["1 naive", "3e cached (eager)"]
    finally:
        plt.close("all")
