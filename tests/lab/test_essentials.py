"""Tests for jaxlab.lab.essentials (notebook 01's helpers) and the exercise checks of notebooks 00 and 01.

Every checker must FAIL on a wrong answer and PASS on the solution in notebooks/solutions/."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import load_solution, not_implemented

from jaxlab import forward, init_params, tiny
from jaxlab.lab import essentials
from jaxlab.lab.exercises import nb00, nb01


@pytest.fixture(scope="module")
def sol00():
    return load_solution("00_setup")


@pytest.fixture(scope="module")
def sol01():
    return load_solution("01_jax_essentials")


@pytest.fixture(scope="module")
def tiny_params():
    return init_params(tiny(), key=3)


# ------------------------------------------------------------------------------------ essentials


def test_block_steps_chained_give_the_model_logits(tiny_params):
    """block_step is the real block: chaining all layers, then norm and head, equals forward()."""
    cfg = tiny_params.config
    tokens = jnp.array([[5, 17, 3, 250, 9, 1, 44]], jnp.int32)
    tokens_, positions = essentials.prompt_inputs(tokens[0].tolist())
    assert tokens_.shape == positions.shape == (1, 7) and positions.dtype == jnp.int32
    model = tiny_params.module()
    x = jnp.take(model.embed[...], tokens, axis=0)
    for i in range(cfg.n_layers):
        step, state = essentials.block_step(tiny_params, layer=i)
        x = jax.jit(step)(state, x, positions)
    logits = jnp.einsum("btd,vd->btv", model.norm(x), model.embed[...], precision="highest")
    # compiled, not eager: op by op, the two whole passes compiled one small program per operation and shape
    want = jax.jit(essentials.forward_logits)(tiny_params, tokens, positions)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(want), rtol=1e-4, atol=1e-4)
    same = jax.jit(lambda p, t, q: forward(p, t, q)[0])(tiny_params, tokens, positions)
    np.testing.assert_array_equal(np.asarray(want), np.asarray(same))


def test_block_inputs_shapes():
    x, pos = essentials.block_inputs(tiny(), seq_len=5, batch=2, seed=1)
    assert x.shape == (2, 5, 40) and x.dtype == jnp.float32
    assert pos.shape == (2, 5) and pos[1].tolist() == [0, 1, 2, 3, 4]


def test_eager_vs_jit_fields_and_fresh_compile(tiny_params):
    step, state = essentials.block_step(tiny_params)
    x, pos = essentials.block_inputs(tiny_params.config, seq_len=4)
    r = essentials.eager_vs_jit(step, state, x, pos, repeats=2)
    assert r.same and r.max_abs_diff < 1e-4
    assert r.eager_s > 0 and r.jit_s > 0 and r.eager_first_s > 0
    assert r.speedup == pytest.approx(r.eager_s / r.jit_s)
    row = r.row("tiny block")
    assert row["what"] == "tiny block" and row["speed-up x"] == pytest.approx(r.speedup)
    # a second measurement of the same function and shapes compiles again (a fresh jit wrapper)
    from jaxlab.tools.profile import CompileCounter

    with CompileCounter() as cc:
        essentials.eager_vs_jit(step, state, x, pos, repeats=1)
    assert cc.count >= 1


def test_eager_vs_jit_detects_a_difference():
    calls = {"n": 0}

    def flaky(x):  # a Python side effect: the eager calls and the traced call see different constants
        calls["n"] += 1
        return x * (1.0 if calls["n"] == 1 else 2.0)

    r = essentials.eager_vs_jit(flaky, jnp.ones(3), repeats=1)
    assert r.max_abs_diff > 0.5 and not r.same


def test_break_even():
    r = essentials.EagerVsJit(
        eager_first_s=1.0, eager_s=0.010, jit_compile_s=1.0, jit_s=0.005, max_abs_diff=0.0, same=True
    )
    assert r.calls_to_break_even == pytest.approx(200.0)
    slower = essentials.EagerVsJit(1.0, 0.001, 1.0, 0.002, 0.0, True)
    assert slower.calls_to_break_even == float("inf")


def test_compile_log_counts_only_the_function():
    def scale(x, *, power=2):
        return x**power

    f = jax.jit(scale, static_argnames="power")
    a, b = jnp.ones(3), jnp.arange(3.0)
    rows = essentials.compile_log(
        f,
        [
            ("a", (a,), {}),
            ("b", (b,), {}),
            ("shape", (jnp.ones(5),), {}),
            ("int", (jnp.ones(3, jnp.int32),), {}),
            ("py", (2.0,), {}),
            ("static", (a,), {"power": 3}),
            ("static again", (a,), {"power": 3}),
        ],
    )
    assert [r["compiled"].split()[0] for r in rows] == ["yes", "no", "yes", "yes", "yes", "yes", "no"]
    assert rows[0]["input"] == "float32[3]"
    assert rows[3]["input"] == "int32[3]"
    assert rows[4]["input"] == "python float"
    assert rows[5]["input"] == "float32[3], power=3 (static)"


def test_time_unsynced_and_per_call():
    f = jax.jit(lambda w: w @ w)
    w = jnp.ones((64, 64))
    unsynced, synced = essentials.time_unsynced(f, w, repeats=3)
    assert len(unsynced) == len(synced) == 3 and min(unsynced) > 0 and min(synced) > 0
    assert essentials.per_call_seconds(f, w, calls=20) > 0


# ------------------------------------------------------------------------------ nb01 exercises


def test_rms_norm_reference_is_the_model_module():
    from jaxlab.engine.model import Policy, RMSNorm

    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 3, 7)), jnp.float32)
    w = jnp.arange(7.0)
    norm = RMSNorm(7, 1e-5, Policy())
    norm.weight[...] = w
    np.testing.assert_array_equal(np.asarray(nb01.reference_rms_norm(x, w, 1e-5)), np.asarray(norm(x)))


def test_check_rms_norm(sol01, capsys):
    assert nb01.check_rms_norm(sol01.rms_norm)
    assert "PASS" in capsys.readouterr().out
    assert not nb01.check_rms_norm(not_implemented)
    assert "not implemented yet" in capsys.readouterr().out
    no_eps = lambda x, w, eps: w * x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True))  # noqa: E731
    assert not nb01.check_rms_norm(no_eps)
    no_weight = lambda x, w, eps: x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)  # noqa: E731
    assert not nb01.check_rms_norm(no_weight)
    wrong_axis = lambda x, w, eps: w * x * jax.lax.rsqrt(jnp.mean(x * x) + eps)  # noqa: E731
    assert not nb01.check_rms_norm(wrong_axis)
    out = capsys.readouterr().out
    assert out.count("FAIL") == 3 and "element(s) differ" in out


def test_check_rms_norm_rejects_unjittable(capsys):
    def concrete_only(x, w, eps):
        return w * x / float(np.sqrt(np.mean(np.asarray(x) ** 2) + eps))

    assert not nb01.check_rms_norm(concrete_only)
    assert "TracerArrayConversionError" in capsys.readouterr().out


def test_check_scale_logits(sol01, capsys):
    assert nb01.check_scale_logits(sol01.scale_logits)
    assert nb01.check_scale_logits(sol01.scale_logits_cond)
    assert capsys.readouterr().out.count("PASS") == 2
    assert not nb01.check_scale_logits(not_implemented)
    assert "not implemented yet" in capsys.readouterr().out
    assert not nb01.check_scale_logits(nb01.scale_logits_python_if)
    assert "TracerBoolConversionError" in capsys.readouterr().out
    assert not nb01.check_scale_logits(lambda logits, t: logits / t)  # forgets the greedy branch
    assert not nb01.check_scale_logits(lambda logits, t: jnp.where(t > 0, logits * t, logits))  # multiplies
    assert capsys.readouterr().out.count("FAIL") == 2


def test_python_if_version_works_eagerly():
    logits = jnp.array([[1.0, 3.0, 2.0]])
    np.testing.assert_allclose(nb01.scale_logits_python_if(logits, 2.0), logits / 2.0)
    greedy = nb01.scale_logits_python_if(logits, 0.0)
    assert greedy.tolist() == [[-np.inf, 0.0, -np.inf]]


def test_quiz_and_check_compile_count(sol01, capsys):
    rows = nb01.run_quiz()
    assert [r["call"] for r in rows] == [c for c, _ in nb01.QUIZ]
    measured = sum(r["compiled"] == "yes" for r in rows)
    assert measured == sol01.COMPILE_COUNT
    assert nb01.run_quiz() == rows  # a fresh function each time: the same answer on every run
    assert nb01.check_compile_count(sol01.COMPILE_COUNT)
    assert "PASS" in capsys.readouterr().out
    for wrong in (None, sol01.COMPILE_COUNT - 1, sol01.COMPILE_COUNT + 1, str(sol01.COMPILE_COUNT), True, 5.5):
        assert not nb01.check_compile_count(wrong)
    out = capsys.readouterr().out
    assert "not implemented yet" in out and "too few" in out and "too many" in out and "whole number" in out


# ------------------------------------------------------------------------------ nb00 exercises


def test_check_device_env_flags(sol00, capsys):
    assert nb00.check_device_env(sol00.device_env, run_subprocess=False)
    assert "PASS" in capsys.readouterr().out
    assert not nb00.check_device_env(not_implemented, run_subprocess=False)
    assert "not implemented yet" in capsys.readouterr().out


@pytest.mark.parametrize(
    "wrong, why",
    [
        (
            lambda n, base: base.update(XLA_FLAGS=f"{nb00.DEVICE_FLAG}={n}", JAX_PLATFORMS="cpu") or base,
            "changed the environment",
        ),
        (lambda n, base: dict(base, XLA_FLAGS=f"{nb00.DEVICE_FLAG}={n}", JAX_PLATFORMS="cpu"), "lost the flags"),
        (
            lambda n, base: dict(
                base, XLA_FLAGS=(base.get("XLA_FLAGS", "") + f" {nb00.DEVICE_FLAG}={n}").strip(), JAX_PLATFORMS="cpu"
            ),
            "device-count flags",
        ),
        (lambda n, base: dict(base, XLA_FLAGS=f"{nb00.DEVICE_FLAG}={n}"), "JAX_PLATFORMS"),
        (lambda n, base: {"XLA_FLAGS": f"{nb00.DEVICE_FLAG}={n}", "JAX_PLATFORMS": "cpu"}, "PATH"),
        (lambda n, base: f"{nb00.DEVICE_FLAG}={n}", "expected a dict"),
    ],
)
def test_check_device_env_rejects(wrong, why, capsys):
    assert not nb00.check_device_env(wrong, run_subprocess=False)
    out = capsys.readouterr().out
    assert out.startswith("FAIL") and why in out


@pytest.mark.slow
def test_check_device_env_subprocess(sol00):
    """The solution's environment really gives a fresh process 4 devices (and 8)."""
    assert nb00.check_device_env(sol00.device_env, run_subprocess=True)
    assert nb00.simulated_device_count(sol00.device_env(8, dict(os.environ))) == 8


def test_check_chat_ids(sol00, gguf_path, capsys):
    from jaxlab.io.tokenizer import Tokenizer

    tok = Tokenizer.from_gguf(gguf_path)
    assert nb00.check_chat_ids(sol00.chat_ids, tok)
    assert "PASS: chat_ids: 6 prompts" in capsys.readouterr().out
    assert not nb00.check_chat_ids(not_implemented, tok)
    assert not nb00.check_chat_ids(lambda t, q: t.encode(q), tok)  # no template

    def no_prompt(t, q):
        return t.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=False, tokenize=True)

    assert not nb00.check_chat_ids(no_prompt, tok)
    out = capsys.readouterr().out
    assert "not implemented yet" in out and out.count("FAIL") == 3


# ------------------------------------------------------------------------- measurements and figures


def test_python_calls_per_call_is_zero_for_a_cached_program_and_many_for_new_shapes():
    f = jax.jit(lambda v: v + 1)
    one = jnp.ones(3)
    jax.block_until_ready(f(one))  # compiled before counting
    assert essentials.python_calls_per_call(f, [(one,)] * 20) == 0
    fresh = jax.jit(lambda v: v * 2)
    assert essentials.python_calls_per_call(fresh, [(jnp.ones(n),) for n in (2, 5, 7)]) > 50


def test_python_calls_per_call_restores_the_profiler():
    import sys

    def mine(frame, event, arg):
        return None

    sys.setprofile(mine)
    try:
        essentials.python_calls_per_call(lambda: 1, [()])
        assert sys.getprofile() is mine
    finally:
        sys.setprofile(None)


@pytest.mark.parametrize("spec, minor", [(">=3.11", 11), (">=3.8,<4", 8), ("~=3.9", 9), (">= 3.10", 10), ("", 0)])
def test_min_python_minor(spec, minor):
    assert essentials.min_python_minor(spec) == minor


def test_min_python_minor_refuses_an_impossible_spec():
    with pytest.raises(ValueError, match="no Python 3.x"):
        essentials.min_python_minor(">=4.0")


def test_first_call_x():
    r = essentials.EagerVsJit(eager_first_s=1.0, eager_s=0.01, jit_compile_s=0.9, jit_s=0.1, max_abs_diff=0, same=True)
    assert r.first_call_x == pytest.approx(10.0)


@pytest.fixture
def agg():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    yield plt
    plt.close("all")


def _labelled(fig):
    ax = fig.axes[0]
    return ax.get_title() and (ax.get_xlabel() or ax.get_ylabel())


def test_figures_have_titles_and_labels(tiny_params, agg):
    class Tok:
        def decode(self, ids):
            return f"t{ids[0]}"

    step, state = essentials.block_step(tiny_params)
    x, pos = essentials.block_inputs(tiny_params.config, seq_len=2)
    r = essentials.eager_vs_jit(step, state, x, pos, repeats=1)
    figs = [
        essentials.plot_token_probabilities(Tok(), [3, 4, 5], [-0.01, -1.5, -0.2]),
        essentials.plot_eager_vs_jit({"tiny block, 2 tokens": r}),
        essentials.plot_settings("jit_speedup_2_3x", {"a": 0.9, "b": 5.0}, "speed-ups"),
    ]
    assert all(_labelled(f) for f in figs)
    bars = figs[2].axes[0].patches
    assert [b.get_facecolor() != bars[0].get_facecolor() for b in bars] == [False, True]  # only "b" meets >= 2x
