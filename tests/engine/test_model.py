"""The hooks of the one forward pass: ``upto=L`` (the model cut after L layers), ``reduce`` (what joins
the row-parallel matmuls' outputs: the identity on one device, ``psum`` in a tensor-parallel shard) and the cache's
``slot_write`` (every write into a KV cache: ``write_slots``, or a student's own in the lab's track)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import jit_forward

import jaxlab
from jaxlab.engine.kvcache import init_cache, left_pad, write_slots
from jaxlab.engine.model import forward, init_params, params_from_flat
from jaxlab.errors import ConfigError

PROMPTS = [[1, 5, 7, 9, 11], [1, 20, 30], [1, 40, 41, 42, 43, 44, 45]]


@pytest.fixture(scope="module")
def params():
    return init_params(jaxlab.tiny(), 0)


@pytest.fixture(scope="module")
def batch():
    tokens, positions = left_pad(PROMPTS, 2)
    return jnp.asarray(tokens), jnp.asarray(positions)


def first_layers(params, n: int):
    """The first ``n`` blocks of ``params`` as a model of their own (with the same norm and head)."""
    cfg = params.config
    flat = {k: v for k, v in params.flat().items() if not k.startswith("layers.") or int(k.split(".")[1]) < n}
    return params_from_flat(cfg.replace(n_layers=n), flat, params.policy)


def test_upto_all_layers_is_the_full_forward(params, batch):
    full = jit_forward(params, *batch)[0]
    np.testing.assert_array_equal(jit_forward(params, *batch, upto=params.config.n_layers)[0], full)


@pytest.mark.parametrize("n", [1, 2])
def test_upto_l_is_the_model_cut_after_l_layers(params, batch, n):
    # the early-exit probe's reading: layer L's output through the final norm and the output head
    want = jit_forward(first_layers(params, n), *batch)[0]
    got = jit_forward(params, *batch, upto=n)[0]
    np.testing.assert_array_equal(got, want)
    assert not np.allclose(got, jit_forward(params, *batch)[0])  # and it is not the full model


def test_upto_a_tuple_reads_every_exit_in_one_pass(params, batch):
    cfg = params.config
    exits, _ = jit_forward(params, *batch, upto=(1, 2, cfg.n_layers))
    assert len(exits) == 3
    for n, got in zip((1, 2, cfg.n_layers), exits):
        np.testing.assert_array_equal(got, jit_forward(params, *batch, upto=n)[0])
    last = jit_forward(params, *batch, upto=(2,), last_only=True)[0]
    assert len(last) == 1 and last[0].shape == (len(PROMPTS), 1, cfg.vocab_size)


def test_upto_with_its_own_cache_equals_the_uncached_pass(params, batch):
    cfg, n = params.config, 2
    tokens, positions = batch
    cache = init_cache(cfg.replace(n_layers=n), tokens.shape[0], 16)
    logits, cache = jit_forward(params, tokens[:, :-1], positions[:, :-1], cache, upto=n)
    assert len(cache.k) == n and int(cache.index) == tokens.shape[1] - 1
    last, _ = jit_forward(params, tokens[:, -1:], positions[:, -1:], cache, upto=n)
    want = jit_forward(params, tokens, positions, upto=n)[0]
    real = np.asarray(positions) >= 0  # a padding query sees no key: its row is arbitrary
    got = np.concatenate([logits, last], axis=1)
    np.testing.assert_allclose(got[real], np.asarray(want)[real], atol=1e-5, rtol=1e-5)


def test_upto_checks_its_layers_and_the_cache_depth(params, batch):
    cfg = params.config
    for bad in (0, cfg.n_layers + 1, True, (2, 1), (1, 1), (), (1, cfg.n_layers + 1)):
        with pytest.raises(ConfigError, match="upto"):
            forward(params, *batch, upto=bad)
    with pytest.raises(ConfigError, match="holds 3 layers but the pass runs 2"):
        forward(params, *batch, init_cache(cfg, 3, 16), upto=2)


def test_reduce_identity_is_the_default_and_runs_after_each_row_parallel_matmul(params, batch):
    full = jit_forward(params, *batch)[0]
    np.testing.assert_array_equal(jit_forward(params, *batch, reduce=lambda x: x)[0], full)
    seen = []

    def spy(x):  # counted when the program runs (the block is traced once, then called for every layer)
        jax.debug.callback(lambda v: seen.append(v.shape), x)
        return x

    jax.block_until_ready(jit_forward(params, *batch, reduce=spy))
    jax.effects_barrier()
    b, t = batch[0].shape
    assert seen == [(b, t, params.config.dim)] * (2 * params.config.n_layers)  # wo and w_down, every layer
    # and it joins the residual stream: doubling what it returns changes the logits
    assert not np.allclose(jit_forward(params, *batch, reduce=lambda x: 2 * x)[0], full)


def test_every_cache_write_goes_through_the_caches_slot_write(params, batch):
    cfg, (b, t) = params.config, batch[0].shape
    seen = []

    def spy(array, new, index, axis):  # recorded as the program runs (one block trace serves every layer)
        jax.debug.callback(lambda: seen.append((array.ndim, axis)), ordered=True)
        return write_slots(array, new, index, axis)

    cache = init_cache(cfg, b, t + 2, slot_write=spy)
    logits, cache = jit_forward(params, *batch, cache)
    jax.effects_barrier()
    assert cache.slot_write is spy  # the cache keeps it through the pass
    # per layer: the positions [B, S] (slots on axis 1), K [B*KVH, S, Hd] (axis 1), V [B*KVH, Hd, S] (axis 2)
    assert seen == [(2, 1), (3, 1), (3, 2)] * cfg.n_layers
    want, _ = jit_forward(params, *batch, init_cache(cfg, b, t + 2))
    np.testing.assert_array_equal(logits, want)
    # and the pass reads what it wrote: a write that stores zeros changes the logits
    zeros = init_cache(cfg, b, t + 2, slot_write=lambda a, new, i, axis: spy(a, new * 0, i, axis))
    assert not np.allclose(jit_forward(params, *batch, zeros)[0], want)


def test_at_gives_the_full_passes_logits_at_those_positions(params, batch):
    tokens, positions = batch
    full, _ = jit_forward(params, tokens, positions)
    at = jnp.array([[4, 0, 2, 2], [1, 1, 6, 3], [6, 5, 0, 1]])
    picked, _ = jit_forward(params, tokens, positions, at=at)
    assert picked.shape == (3, 4, params.config.vocab_size)
    np.testing.assert_allclose(
        np.asarray(picked), np.asarray(jnp.take_along_axis(full, at[..., None], axis=1)), atol=1e-6
    )


def test_remat_changes_neither_the_logits_nor_the_gradient(params, batch):
    tokens, positions = batch

    def loss(p, remat):
        logits, _ = forward(p, tokens, positions, remat=remat)
        return jnp.mean(jax.nn.log_softmax(logits) ** 2)  # a smooth function of every logit

    value_and_grad = jax.jit(jax.value_and_grad(loss), static_argnums=1)
    (plain, g_plain), (remat, g_remat) = value_and_grad(params, False), value_and_grad(params, True)
    np.testing.assert_allclose(float(remat), float(plain), rtol=1e-6)
    for a, b in zip(jax.tree.leaves(g_remat), jax.tree.leaves(g_plain)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-8)
    with pytest.raises(ConfigError, match="remat is for training"):
        forward(params, tokens, positions, init_cache(params.config, 3, 16), remat=True)


def test_a_gpu_without_the_triton_path_falls_back_with_one_sentence(monkeypatch):
    from types import SimpleNamespace

    from jaxlab.engine.kernels import common
    from jaxlab.engine.model import init_params, with_attention
    from jaxlab.errors import FallbackWarning
    from jaxlab.io.config import tiny

    h200, t4, unknown = (SimpleNamespace(platform="gpu", compute_capability=cc) for cc in ("9.0", "7.5", None))
    assert common.gpu_too_old(h200) is None and common.gpu_too_old(SimpleNamespace(platform="tpu")) is None
    assert "reports 7.5" in common.gpu_too_old(t4) and "no compute capability" in common.gpu_too_old(unknown)
    params = init_params(tiny())
    assert with_attention(params, "pallas", h200).policy.attention == "pallas"
    for device in (t4, unknown):  # the model keeps XLA's attention (the same tokens), said in one sentence
        with pytest.warns(FallbackWarning, match="attention runs through XLA instead"):
            assert with_attention(params, "pallas", device) is params
    # a kernel called on a T4 runs interpreted, not as a Triton error
    monkeypatch.setattr(common.jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(common.jax, "devices", lambda *a: [t4])
    with pytest.warns(FallbackWarning, match="interpret mode"):
        assert common.variant_for() == ("gpu", True)
    monkeypatch.setattr(common.jax, "devices", lambda *a: [h200])
    assert common.variant_for() == ("gpu", False)


def test_the_cli_prints_a_fallback_as_one_note(capsys):
    from jaxlab import cli
    from jaxlab.errors import FallbackWarning

    cli.show_warning(FallbackWarning("--attention pallas: this GPU reports 7.5"), FallbackWarning, "f.py", 1)
    assert capsys.readouterr().err == "jaxlab: note: --attention pallas: this GPU reports 7.5\n"


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("preset", ["tiny", "smollm2_135m"])
def test_the_files_contract_is_what_the_model_holds(preset, tied):
    """``jaxlab.io.config.param_shapes`` (what the readers check a file against) names and shapes exactly the model's
    parameters."""
    from flax import nnx

    from jaxlab.engine.model import Llama, param_name
    from jaxlab.io import config

    cfg = getattr(config, preset)().replace(tie_embeddings=tied)
    _, state = nnx.split(nnx.eval_shape(lambda: Llama(cfg, rngs=nnx.Rngs(0))))
    held = {param_name(p): tuple(v.get_value().shape) for p, v in nnx.to_flat_state(state)}
    assert list(config.param_shapes(cfg).items()) == list(held.items())  # in the same order


def test_a_compiled_step_names_each_layers_attention_and_mlp(params, batch):
    """Profiles and HLO read by part: every layer's attention and MLP run under their own ``named_scope`` (in the
    compiled program, where XLA has inlined the block that the pass traced once: ``layer3/jit(block)/mlp/...``)."""
    tokens, positions = batch
    hlo = jax.jit(forward).lower(params, tokens, positions, None).compile().as_text()
    for i in range(params.config.n_layers):
        for part in ("attention", "mlp"):
            assert re.search(rf'op_name="jit\(forward\)/layer{i}/jit\(block\)/{part}/', hlo), (i, part)


def test_an_int8_decode_row_is_the_same_bits_alone_and_among_others():
    """With int8 weights (integer matmuls) and int8 pages, a decode row's logits are the same bits in a step of 1,
    2, 3 or 8 rows as in one of 128 (the norms and attention's softmax computed alike, whatever the row count: XLA:CPU
    sums the rows of fewer than 4,096 elements in another order, and 128 rows of this model's 40 are more): what lets
    the engine decode one request in the 1-row bucket and stay batch-invariant."""
    from jaxlab.engine.paged import init_paged_cache
    from jaxlab.quant import quantize_params

    params = quantize_params(init_params(jaxlab.tiny(), 3), "int8")
    cfg, pages = params.config, 2

    @jax.jit
    def step(tokens, positions, cache):
        return forward(params, tokens, positions, cache)[0][:, 0]

    def row0(rows):
        tokens = np.arange(5, 5 + rows, dtype=np.int32)[:, None]
        positions = np.full((rows, 1), 3, np.int32)  # every row at position 3 of its own pages
        cache = init_paged_cache(cfg, 1 + rows * pages, 4, rows, pages, "int8")
        table = 1 + np.arange(rows * pages, dtype=np.int32).reshape(rows, pages)
        return np.asarray(step(tokens, positions, cache.with_table(jnp.asarray(table))))[0]

    full = row0(128)
    for rows in (1, 2, 3, 8):
        np.testing.assert_array_equal(row0(rows), full, err_msg=f"{rows} rows")
