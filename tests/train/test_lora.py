"""LoRA through the linear-layer hook: a fresh adapter changes nothing, merged equals unmerged, and the gradient
of the adapter equals a central finite difference (float64)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import jit_forward as forward

from jaxlab.engine.model import Policy, init_params
from jaxlab.errors import ConfigError, ModelFileError
from jaxlab.io.config import tiny
from jaxlab.quant import quantize_params
from jaxlab.quant.formats import QuantizedMatrix
from jaxlab.train import lora

TOKENS = jnp.array([[1, 5, 7, 9, 3, 2, 11], [4, 8, 15, 16, 23, 42, 6]])
POSITIONS = jnp.array([[0, 1, 2, 3, 4, 5, 6], [-1, -1, 0, 1, 2, 3, 4]])  # the second row left-padded


def perturbed(adapter, scale=0.05, seed=3):
    leaves, treedef = jax.tree.flatten(adapter)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return jax.tree.unflatten(
        treedef, [x + scale * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]
    )


def test_fresh_adapter_changes_nothing_and_only_targets_get_one():
    params = init_params(tiny(), 0)
    config = lora.LoraConfig(rank=4, targets=("wq", "wv", "w_down"))
    adapter = lora.init_adapter(params, config, 1)
    assert sorted({name.split(".")[-1] for name in adapter}) == ["w_down", "wq", "wv"]
    assert len(adapter) == 3 * tiny().n_layers
    base, _ = forward(params, TOKENS, POSITIONS)
    adapted, _ = forward(lora.apply(params, adapter, config), TOKENS, POSITIONS)
    assert float(jnp.abs(base - adapted).max()) == 0.0  # b starts at zero
    assert all(float(jnp.abs(m["a"]).max()) > 0 for m in adapter.values())  # ... and a does not


def test_merged_adapter_gives_the_unmerged_logits():
    params = init_params(tiny(), 0)
    config = lora.LoraConfig(rank=4, alpha=8.0)
    adapter = perturbed(lora.init_adapter(params, config, 1))
    unmerged, _ = forward(lora.apply(params, adapter, config), TOKENS, POSITIONS)
    merged, _ = forward(lora.merge(params, adapter, config), TOKENS, POSITIONS)
    base, _ = forward(params, TOKENS, POSITIONS)
    assert float(jnp.abs(unmerged - base).max()) > 0.1  # the adapter does change the model
    assert float(jnp.abs(unmerged - merged).max()) <= 1e-5


def test_gradient_equals_central_finite_difference_in_float64():
    with jax.enable_x64(True):
        params = init_params(tiny(), 0, Policy("float64", "highest"))
        config = lora.LoraConfig(rank=3)
        adapter = jax.tree.map(lambda x: x.astype(jnp.float64), perturbed(lora.init_adapter(params, config, 1)))

        @jax.jit
        def loss(a):
            logits, _ = forward(lora.apply(params, a, config), TOKENS, POSITIONS)
            assert logits.dtype == jnp.float64  # every part of the pass in float64, or the check means nothing
            logp = jax.nn.log_softmax(logits[:, :-1], -1)
            return -jnp.take_along_axis(logp, TOKENS[:, 1:, None], -1).mean()

        grad = jax.jit(jax.grad(loss))(adapter)
        rng = np.random.default_rng(0)
        for trial in range(3):  # directional derivatives along random unit directions
            leaves, treedef = jax.tree.flatten(adapter)
            d = [rng.standard_normal(x.shape) for x in leaves]
            norm = np.sqrt(sum((x**2).sum() for x in d))
            d = jax.tree.unflatten(treedef, [jnp.asarray(x / norm) for x in d])
            eps = 1e-5
            plus = loss(jax.tree.map(lambda a, v: a + eps * v, adapter, d))
            minus = loss(jax.tree.map(lambda a, v: a - eps * v, adapter, d))
            numeric = float((plus - minus) / (2 * eps))
            analytic = sum(float(jnp.vdot(g, v)) for g, v in zip(jax.tree.leaves(grad), jax.tree.leaves(d)))
            assert abs(numeric - analytic) <= 1e-6 * abs(analytic), (trial, numeric, analytic)
        # and the gradient reaches every adapter matrix
        assert all(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(grad))


def test_adapter_over_a_quantized_base_runs_and_merge_refuses_it():
    params = init_params(tiny(), 0)
    qparams = quantize_params(params, "int8")
    config = lora.LoraConfig(rank=2)
    adapter = perturbed(lora.init_adapter(params, config, 1))
    assert isinstance(qparams.flat()["layers.0.attn.wq"], QuantizedMatrix)
    q_logits, _ = forward(lora.apply(qparams, adapter, config), TOKENS, POSITIONS)
    f_logits, _ = forward(lora.apply(params, adapter, config), TOKENS, POSITIONS)
    assert float(jnp.abs(q_logits - f_logits).max()) < 0.05  # int8 rounding of the base only
    with pytest.raises(ConfigError, match="load the float model"):
        lora.merge(qparams, adapter, config)


def test_save_load_round_trip_and_clear_errors(tmp_path):
    params = init_params(tiny(), 0)
    config = lora.LoraConfig(rank=2, targets=("wo",))
    adapter = perturbed(lora.init_adapter(params, config, 1))
    lora.save(tmp_path / "a", adapter, config, base="tiny")
    back, back_config, meta = lora.load(tmp_path / "a")
    assert back_config == config and meta["base"] == "tiny"
    for name in adapter:
        np.testing.assert_array_equal(np.asarray(back[name]["a"]), np.asarray(adapter[name]["a"]))
    with pytest.raises(ModelFileError, match="not a LoRA adapter folder"):
        lora.load(tmp_path)
    with pytest.raises(ConfigError, match="rank 4"):
        lora.check_adapter(params, back, lora.LoraConfig(rank=4, targets=("wo",)))
    with pytest.raises(ConfigError, match="no adapter for"):
        lora.check_adapter(params, back, lora.LoraConfig(rank=2, targets=("wo", "wq")))
    for bad in (dict(rank=0), dict(alpha=0.0), dict(targets=("embed",))):
        with pytest.raises(ConfigError):
            lora.LoraConfig(**bad)
