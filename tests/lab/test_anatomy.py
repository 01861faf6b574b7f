"""jaxlab.lab.anatomy (what notebooks 03 and 05 show) and the exercise checkers of those notebooks.

Most tests use the tiny config with random weights; the GGUF byte counts read the embedded file's header.
Each exercise checker must FAIL on a wrong answer and PASS on the solution in notebooks/solutions.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import load_solution, not_implemented

from jaxlab.engine.kvcache import init_cache, left_pad, rollback
from jaxlab.engine.model import init_params
from jaxlab.io.config import tiny
from jaxlab.lab import anatomy as ji
from jaxlab.lab.exercises import nb03, nb05


@pytest.fixture(scope="module")
def params():
    return init_params(tiny(), 0)


# ---- structure and parameters ------------------------------------------------------------------


def test_param_table_counts_every_parameter(params):
    rows = ji.param_table(params)
    total = rows[-1]
    assert total["component"] == "total"
    assert total["parameters"] == params.config.n_params() == sum(r["parameters"] for r in rows[:-1])
    assert total["arrays"] == len(params.flat())
    for r in rows:
        assert r["float32 MB"] == pytest.approx(4 * r["parameters"] / 1e6)
        assert r["bfloat16 MB"] == pytest.approx(2 * r["parameters"] / 1e6)
    assert [r["component"] for r in rows[:-1]] == ["embedding", "attention", "MLP", "norms"]


def test_param_table_reads_gguf_bytes(smollm):
    rows = {r["component"]: r for r in ji.param_table(smollm.params, smollm.path)}
    assert rows["attention"]["GGUF type"] == "Q4_1" and rows["MLP"]["GGUF type"] == "Q4_1"
    assert rows["embedding"]["GGUF type"] == "Q8_0" and rows["norms"]["GGUF type"] == "F32"
    # Q4_1: 20 bytes per block of 32 weights; Q8_0: 34 bytes per 32; F32: 4 bytes each
    assert rows["MLP"]["GGUF MB"] * 1e6 == rows["MLP"]["parameters"] * 20 // 32
    assert rows["embedding"]["GGUF MB"] * 1e6 == rows["embedding"]["parameters"] * 34 // 32
    assert rows["norms"]["GGUF MB"] * 1e6 == rows["norms"]["parameters"] * 4
    assert rows["total"]["GGUF MB"] * 1e6 < smollm.path.stat().st_size  # the header and tokenizer are the rest


def test_component_names_agree_between_tree_and_gguf():
    pairs = [
        ("embed", "token_embd.weight"),
        ("layers.3.attn.wq", "blk.3.attn_q.weight"),
        ("layers.3.attn.wo", "blk.3.attn_output.weight"),
        ("layers.0.mlp.w_down", "blk.0.ffn_down.weight"),
        ("layers.0.attn_norm.weight", "blk.0.attn_norm.weight"),
        ("norm.weight", "output_norm.weight"),
        ("lm_head", "output.weight"),
    ]
    for ours, theirs in pairs:
        assert ji.component(ours) == ji.gguf_component(theirs), (ours, theirs)


def test_tree_summary_folds_the_blocks(params, capsys):
    text = ji.tree_summary(params)
    cfg = params.config
    assert f"layers: {cfg.n_layers} x Block" in text
    assert f"{cfg.n_params():,} parameters" in text
    assert text.count("attn.wq") == 1  # one line for all blocks
    assert "[40, 60]" in text  # wq: dim x (6 heads x 10)
    assert capsys.readouterr().out.strip() == text


def test_left_pad_marks_padding_with_negative_positions():
    tokens, positions = left_pad([[5, 6, 7], [8]], pad_id=0)
    assert tokens.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert positions.tolist() == [[0, 1, 2], [-1, -1, 0]]


# ---- RoPE --------------------------------------------------------------------------------------


def test_rope_dot_products_depend_only_on_distance():
    assert ji.rope_is_relative(64, 100000.0, shift=1000) < 1e-4
    sim = ji.rope_similarity([0, 1, 10, 1000], head_dim=64, theta=100000.0)
    assert sim[0] == pytest.approx(1.0, abs=1e-5)  # distance 0: the same vector
    assert sim[0] > sim[1] > sim[3]  # similarity falls with distance


def test_plot_rope_draws_two_panels():
    import matplotlib

    matplotlib.use("Agg")
    fig = ji.plot_rope(16, 10000.0, max_position=64)
    assert len(fig.axes) == 2


# ---- the cache: structure and memory ------------------------------------------------------------


def test_slot_axes_follow_init_cache():
    cfg = tiny()
    ka, va = ji.slot_axes(cfg)
    c = init_cache(cfg, 2, 13)
    assert c.k[0].shape[ka] == 13 and c.v[0].shape[va] == 13


def test_cache_structure_names_every_field(capsys):
    cfg = tiny()
    text = ji.cache_structure(init_cache(cfg, 1, 16), cfg)
    assert f"{2 * cfg.n_layers + 2} leaves" in text
    assert f"tuple of {cfg.n_layers} arrays" in text
    assert "index  int32[] = 0" in text and "pos    int32[1, 16]" in text


def test_cache_memory_formula_equals_real_caches():
    cfg = tiny()
    rows = ji.cache_memory_rows(cfg, [(1, 16), (3, 40)])
    assert all(r["same"] for r in rows) and len(rows) == 4
    for r in rows:
        real = init_cache(cfg, r["batch"], r["slots"], jnp.dtype(r["dtype"])).nbytes()
        assert r["formula MB"] * 1e6 == pytest.approx(real)
        # without GQA: n_heads / n_kv_heads times the bytes
        assert r[f"no GQA ({cfg.n_heads} KV heads) MB"] == pytest.approx(r["formula MB"] * cfg.q_per_kv)


def test_live_growth_is_the_cache_plus_bookkeeping():
    cfg = tiny()
    cache, grew = ji.live_growth(lambda: init_cache(cfg, 2, 24))
    assert grew == cache.nbytes() + 2 * 24 * 4 + 4


# ---- prefill, decode, rollback -----------------------------------------------------------------


def test_cached_decoding_equals_uncached_forward(params):
    prompt = [1, 17, 40, 99, 5]
    toks, logits, cache = ji.greedy_with_cache(params, prompt, n=6, slots=16)
    assert len(toks) == 6 and logits.shape == (6, params.config.vocab_size)
    assert int(cache.index) == len(prompt) + 5
    seq = prompt + toks[:-1]
    full = ji.uncached_logits(params, jnp.asarray([seq]), jnp.arange(len(seq))[None])[0]
    assert ji.max_logit_error(logits, full[len(prompt) - 1 :]) < 1e-5
    assert toks == [int(i) for i in np.argmax(np.asarray(full[len(prompt) - 1 :]), axis=-1)]


def test_rollback_then_decode_gives_the_same_tokens(params):
    prompt = [1, 2, 3, 4]
    toks, _, cache = ji.greedy_with_cache(params, prompt, n=6, slots=16)
    cache = rollback(cache, len(prompt) + 2)
    assert int(cache.index) == len(prompt) + 2 and int((cache.pos >= 0).sum()) == len(prompt) + 2
    again, _, _ = ji.greedy_with_cache(params, [toks[2]], n=3, slots=16, cache=cache)
    assert again == toks[3:6]


def test_decode_step_donates_and_updates_in_place(params):
    cache = init_cache(params.config, 1, 8)
    _, cache = ji.prefill(params, jnp.asarray([[1, 2]]), jnp.asarray([[0, 1]]), cache)
    old = cache
    ptrs = [a.unsafe_buffer_pointer() for a in cache.k]
    _, cache = ji.decode_step(params, jnp.asarray([[3]]), jnp.asarray([[2]]), cache)
    assert old.k[0].is_deleted()
    assert [a.unsafe_buffer_pointer() for a in cache.k] == ptrs


def test_write_token_writes_one_slot_and_donation_deletes_the_input():
    cfg = tiny()
    cache = init_cache(cfg, 2, 8)
    k, v = ji.one_token_kv(cfg, 2, value=3.0)
    kept = ji.write_token(cache, k, v, 0, cfg, donate=False)
    assert not cache.k[0].is_deleted()
    ka, va = ji.slot_axes(cfg)
    assert float(jnp.take(kept.k[1], 0, axis=ka).min()) == 3.0
    assert float(jnp.abs(jnp.take(kept.k[1], 1, axis=ka)).max()) == 0.0
    assert float(jnp.take(kept.v[2], 0, axis=va).min()) == 3.0
    assert kept.pos[:, 0].tolist() == [0, 0] and int(kept.index) == 1
    moved = ji.write_token(cache, k, v, 0, cfg, donate=True)
    assert cache.k[0].is_deleted() and int(moved.index) == 1


def test_time_cache_write_returns_positive_times():
    for donate in (False, True):
        times = ji.time_cache_write(tiny(), 1, 32, donate=donate, steps=2)
        assert len(times) == 2 and all(t > 0 for t in times)


def test_time_prefill_decode_rows(params):
    rows = ji.time_prefill_decode(params, [1, 2, 3, 4, 5], slots=16, repeats=1)
    assert [r["call"] for r in rows] == ["prefill: 5 tokens in one call", "decode: 1 token"]
    assert rows[0]["ms per token"] == pytest.approx(rows[0]["ms"] / 5)


# ---- latency against context -------------------------------------------------------------------


def test_filled_cache_marks_context_slots():
    c = ji.filled_cache(tiny(), 2, 10, 4)
    assert c.pos[0].tolist() == [0, 1, 2, 3] + [-1] * 6 and int(c.index) == 4


def test_latency_vs_context_rows(params):
    rows = ji.latency_vs_context(params, [4, 8], slots=16, repeats=1)
    assert [r["context"] for r in rows] == [4, 8]
    for r in rows:
        assert r["without cache ms"] > 0 and r["with cache ms"] > 0
        assert r["speed-up"] == pytest.approx(r["without cache ms"] / r["with cache ms"])
    with pytest.raises(ValueError, match="slots"):
        ji.latency_vs_context(params, [4, 8], slots=8)


def test_cache_claim_verdict_logic():
    def rows(no, c):
        return [
            {"context": 32, "without cache ms": no[0], "with cache ms": c[0], "speed-up": no[0] / c[0]},
            {"context": 512, "without cache ms": no[1], "with cache ms": c[1], "speed-up": no[1] / c[1]},
        ]

    holds, why = ji.cache_claim_holds(rows((50, 800), (20, 25)))
    assert holds and "more than 3x faster" in why and "grew more than 3x" in why
    holds, why = ji.cache_claim_holds(rows((2.0, 2.5), (1.0, 1.0)))  # a GPU-like case: flat without cache
    assert not holds and "less than 3x faster" in why
    assert ji.cached_growth(rows((50, 800), (20, 25))) == pytest.approx(1.25)


def test_plot_latency(params):
    import matplotlib

    matplotlib.use("Agg")
    fig = ji.plot_latency(
        [
            {"context": 4, "without cache ms": 2.0, "with cache ms": 1.0},
            {"context": 8, "without cache ms": 4.0, "with cache ms": 1.0},
        ]
    )
    assert len(fig.axes[0].lines) == 2


def test_model_step_traces_once_per_shape_and_on_step_sees_every_cache(params):
    before = ji.TRACES["model_step"]
    seen = []
    filled = lambda c: seen.append(int((c.pos >= 0).sum()))  # noqa: E731  (the cache itself is donated next step)
    toks, _, cache = ji.greedy_with_cache(params, [3, 1, 4, 1, 5, 9, 2], n=5, slots=24, on_step=filled)
    assert seen == [7, 8, 9, 10, 11]
    traced = ji.TRACES["model_step"] - before
    assert traced <= 2  # at most one trace for the 7-token prompt and one for the decode step (0 if traced before)
    ji.greedy_with_cache(params, [3, 1, 4, 1, 5, 9, 2], n=5, slots=24)  # same shapes: no new trace
    assert ji.TRACES["model_step"] - before == traced


def test_cache_plots_draw(params):
    import matplotlib

    matplotlib.use("Agg")
    cfg = params.config
    seen = []
    _, _, cache = ji.greedy_with_cache(
        params, [1, 2, 3], n=3, slots=8, on_step=lambda c: seen.append(np.asarray(c.pos[0]))
    )
    fig = ji.plot_cache_fill([(f"step {i}", p) for i, p in enumerate(seen)], cache.k[0], cfg, show=8)
    assert len(fig.axes) == 2 and fig.axes[0].images and fig.axes[1].images
    fig = ji.plot_speedup([{"context": 8, "speed-up": 1.5}, {"context": 64, "speed-up": 6.0}])
    assert fig.axes[0].get_ylabel() and fig.axes[0].get_title()
    fig = ji.plot_param_bytes(ji.param_table(params))
    assert len(fig.axes[0].patches) == 2 * (len(ji.param_table(params)) - 1)


# ---- exercise checkers -------------------------------------------------------------------------


def test_nb03_checkers_pass_solutions_and_fail_wrong_answers(capsys):
    sol = load_solution("03_flax_model")
    assert nb03.check_gqa_attention(sol.my_gqa_attention)
    assert nb03.check_rope(sol.my_apply_rope)

    def tiled(q, k, v, visible):  # query head h paired with K/V head h % KVH instead of h // group
        reps = q.shape[2] // k.shape[2]
        k, v = jnp.tile(k, (1, 1, reps, 1)), jnp.tile(v, (1, 1, reps, 1))
        s = jnp.einsum("bthd,bshd->bhts", q, k) / jnp.sqrt(q.shape[-1])
        s = jnp.where(visible[:, None], s, -jnp.inf)
        return jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(s, -1), v)

    def no_mask(q, k, v, visible):
        return sol.my_gqa_attention(q, k, v, jnp.ones_like(visible))

    def no_scale(q, k, v, visible):
        return sol.my_gqa_attention(q * jnp.sqrt(q.shape[-1]), k, v, visible)

    assert not nb03.check_gqa_attention(tiled)
    assert not nb03.check_gqa_attention(no_mask)
    assert not nb03.check_gqa_attention(no_scale)
    assert not nb03.check_gqa_attention(not_implemented)
    assert not nb03.check_rope(lambda x, c, s: x * c[:, :, None] + x * s[:, :, None])  # no rotate_half
    # interleaved pairs (llama.cpp layout) instead of "rotate half"
    assert not nb03.check_rope(
        lambda x, c, s: x * c[:, :, None] + jnp.stack([-x[..., 1::2], x[..., ::2]], -1).reshape(x.shape) * s[:, :, None]
    )
    assert not nb03.check_rope(not_implemented)
    out = capsys.readouterr().out
    assert "FAIL: apply_rope: not implemented yet" in out and "PASS: gqa_attention" in out
    assert "FAIL: gqa_attention: not implemented yet" in out


def test_nb05_checkers_pass_solutions_and_fail_wrong_answers(capsys):
    sol = load_solution("05_kv_cache")
    assert nb05.check_cache_update(sol.my_cache_update)
    assert nb05.check_kv_cache_bytes(sol.my_kv_cache_bytes)
    assert not nb05.check_cache_update(
        lambda c, n, i, a: jax.lax.dynamic_update_slice(c, n, (0, i, 0, 0))
    )  # axis 1 always
    assert not nb05.check_cache_update(
        lambda c, n, i, a: sol.my_cache_update(c, n, i + 1 if i + 1 + n.shape[a] <= c.shape[a] else i - 1, a)
    )
    assert not nb05.check_kv_cache_bytes(lambda cfg, b, s, i: 2 * cfg.n_layers * b * s * cfg.n_heads * cfg.head_dim * i)
    assert not nb05.check_kv_cache_bytes(lambda cfg, b, s, i: cfg.n_layers * b * s * cfg.n_kv_heads * cfg.head_dim * i)
    assert not nb05.check_kv_cache_bytes(not_implemented)
    out = capsys.readouterr().out
    assert "FAIL: KV cache bytes: not implemented yet" in out and "PASS: cache update" in out
