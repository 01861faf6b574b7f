"""The contiguous KV cache's two key layouts compute the same attention; engines pick theirs by backend and dtype."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import jit_forward

from jaxlab.engine.kvcache import init_cache, key_layout_for, left_pad, pallas_contiguous, rollback, slot_axes
from jaxlab.engine.model import init_params
from jaxlab.errors import ConfigError
from jaxlab.io.config import tiny

PROMPTS = [[1, 5, 9, 33, 7, 80, 12], [1, 44], [1, 3, 3, 3, 90, 100, 200, 201, 17, 4, 4, 60, 61]]


def cached_logits(params, dtype, key_layout, steps=4):
    """Prefill (left-padded) then ``steps`` greedy decode steps in a cache of ``key_layout`` -> [B, 1 + steps, V];
    then one step rolled back and taken again, which must give the same logits."""
    cfg = params.config
    tokens, positions = left_pad(PROMPTS, cfg.pad_id)
    # 64 slots and test_paged.py's prompts: its contiguous cache's shapes, so that "sd" finds its programs in the
    # run's persistent compile cache when that file ran first
    cache = init_cache(cfg, len(PROMPTS), 64, dtype, key_layout=key_layout)
    logits, cache = jit_forward(params, jnp.asarray(tokens), jnp.asarray(positions), cache, last_only=True)
    out, pos = [logits[:, 0]], jnp.asarray([len(p) for p in PROMPTS])
    for _ in range(steps):
        nxt = jnp.argmax(out[-1], -1)
        logits, cache = jit_forward(params, nxt[:, None], pos[:, None], cache, last_only=True)
        out.append(logits[:, 0])
        pos = pos + 1
    assert cache.key_layout == key_layout  # every pass keeps it
    again, _ = jit_forward(params, nxt[:, None], (pos - 1)[:, None], rollback(cache, cache.index - 1), last_only=True)
    np.testing.assert_array_equal(np.asarray(again[:, 0]), np.asarray(out[-1]))
    return np.asarray(jnp.stack(out, 1))


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_keys_transposed_give_the_same_logits(dtype):
    """K [.., Hd, S] and V [.., S, Hd] ("ds", XLA:CPU's float32 engines) compute what the Pallas kernel's layout
    ("sd") does, prefill and decode steps; int8 quantizes each vector over head_dim whichever axis that is."""
    params = init_params(tiny(), 3)
    sd, ds = cached_logits(params, dtype, "sd"), cached_logits(params, dtype, "ds")
    np.testing.assert_allclose(ds, sd, atol=1e-6, rtol=0)
    assert (np.argmax(ds, -1) == np.argmax(sd, -1)).all()


def test_the_layouts_shapes_and_their_checks():
    cfg = tiny()
    n, hd = 2 * cfg.n_kv_heads, cfg.head_dim
    sd, ds = init_cache(cfg, 2, 13), init_cache(cfg, 2, 13, "int8", key_layout="ds")
    assert sd.k[0].shape == (n, 13, hd) and sd.v[0].shape == (n, hd, 13) and sd.slot_axes == (1, 2)
    assert ds.k[0].shape == (n, hd, 13) and ds.v[0].shape == (n, 13, hd) and ds.slot_axes == (2, 1)
    assert ds.k_scale[0].shape == (n, 13) and ds.nbytes() == init_cache(cfg, 2, 13, "int8").nbytes()
    assert ds.layer(1).key_layout == "ds" and ds.with_layers([ds.layer(0)] * cfg.n_layers).key_layout == "ds"
    assert slot_axes("sd") == (1, 2)
    with pytest.raises(ValueError, match="'sd' or 'ds'"):
        init_cache(cfg, 1, 4, key_layout="hd")
    q = jnp.zeros((cfg.n_kv_heads, cfg.q_per_kv, hd))  # [B*KVH, G*T, Hd]
    with pytest.raises(ConfigError, match="key_layout 'ds'"):
        pallas_contiguous(q, init_cache(cfg, 1, 4, key_layout="ds").layer(0), jnp.zeros((1, 1), jnp.int32), None)


def test_the_key_layout_follows_backend_attention_and_dtype():
    assert key_layout_for("xla", jnp.float32, "cpu") == "ds"
    assert key_layout_for("xla", jnp.int8, "cpu") == "sd"  # the int8 steps were slower with "ds"
    assert key_layout_for("xla", jnp.bfloat16, "cpu") == "sd"  # the accelerator proxy's: a TPU's layout
    assert key_layout_for("pallas", jnp.float32, "cpu") == "sd"
    assert key_layout_for("xla", jnp.float32, "tpu") == "sd"
    assert key_layout_for("xla", jnp.float32, "gpu") == "sd"
