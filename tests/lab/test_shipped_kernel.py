"""JAX's shipped ragged paged attention met on our cache (jaxlab.lab.pallas): what it demands, measured."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jaxlab.engine.kernels import paged_attention
from jaxlab.lab import pallas as lp

KVH, G, D, PS, PAGES, PER_ROW = 3, 3, 64, 16, 20, 4


def case():
    rng = np.random.default_rng(0)
    k, v = (jnp.asarray(rng.standard_normal((KVH, PAGES, PS, D)), jnp.float32) for _ in range(2))
    table = jnp.asarray(rng.permutation(np.arange(1, PAGES))[: 3 * PER_ROW].reshape(3, PER_ROW), jnp.int32)
    lengths = np.array([6, 41, 64])
    q = jnp.asarray(rng.standard_normal((3, KVH, G, D)), jnp.float32)
    ours = paged_attention(q, k, v, table, jnp.asarray(np.repeat((lengths - 1)[:, None], G, 1), jnp.int32))
    return (q, k, v, table, lengths), ours


def test_its_reference_on_our_cache_equals_our_kernel():
    args, ours = case()
    np.testing.assert_allclose(np.asarray(lp.jax_ragged_reference(*args)), np.asarray(ours), atol=1e-5, rtol=0)


def test_it_lowers_for_a_tpu_only_with_heads_and_head_dim_padded():
    args, _ = case()
    assert "can not be XLA fully tiled" in lp.jax_ragged_lowering(*args, pad_kv_heads=0, pad_head_dim=0)
    assert lp.jax_ragged_lowering(*args, pad_kv_heads=1, pad_head_dim=0).startswith("AssertionError")
    assert lp.jax_ragged_lowering(*args) == "lowers"  # 3 -> 4 KV heads (9 -> 12 query heads), 64 -> 128


def test_tpu_interpret_mode_runs_it_or_fails_the_known_way():
    """jax 0.10.2's TPU interpreter cannot read the kernel's reshaped refs; once it can, the output must match."""
    args, ours = case()
    out, what = lp.jax_ragged_interpret(*args)
    if out is None:
        assert "ReshapeTransform" in what, what
    else:
        np.testing.assert_allclose(np.asarray(out), np.asarray(ours), atol=1e-5, rtol=0)
