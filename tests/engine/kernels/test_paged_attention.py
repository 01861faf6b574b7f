"""The ragged paged kernel reads what the engine's pure-JAX paged attention reads, each row only its own pages."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from jaxlab.engine.kernels import lower, paged_attention
from jaxlab.engine.kernels.paged_attention import page_counts
from jaxlab.engine.model import Policy, matmul
from jaxlab.engine.paged import PagedLayer, pallas_paged, read_pages
from jaxlab.errors import ConfigError

KVH, G, D, PS = 3, 3, 16, 8


def layer(rng, rows, per_row, num_pages=24, dtype=np.float32):
    """A pool with random contents and each row's pages scattered over it (page 0 the null page)."""
    k, v = (jnp.asarray(rng.standard_normal((KVH, num_pages, PS, D)), dtype) for _ in range(2))
    table = rng.permutation(np.arange(1, num_pages))[: rows * per_row].reshape(rows, per_row)
    return PagedLayer(k, v, jnp.asarray(table, jnp.int32))


def queries(rng, positions):
    b, t = positions.shape
    return jnp.asarray(rng.standard_normal((b, t, KVH, G, D)), jnp.float32)


# rows of different lengths (ragged), one idle row (-1), decode (T = 1) and a prefill chunk (T = 4)
DECODE = np.array([[3], [30], [-1], [17]])
CHUNK = np.array([[8, 9, 10, 11], [-1, -1, 0, 1], [20, 21, 22, 23]])


@pytest.mark.parametrize("positions", [DECODE, CHUNK], ids=["decode", "chunk"])
@pytest.mark.parametrize("variant", ["tpu", "gpu"])
def test_paged_kernel_equals_the_pure_jax_paged_attention(positions, variant, monkeypatch):
    rng = np.random.default_rng(0)
    lay, pos = layer(rng, len(positions), 4), jnp.asarray(positions, jnp.int32)
    q, pol = queries(rng, pos), Policy()
    want = read_pages(q, lay, pos, lambda spec, a, b: matmul(spec, a, b, pol))
    b, t = pos.shape
    qn = q.transpose(0, 2, 3, 1, 4).reshape(b, KVH, G * t, D)
    got = paged_attention(qn, lay.k, lay.v, lay.page_table, jnp.tile(pos, (1, G)), variant=variant)
    got = got.reshape(b, KVH, G, t, D).transpose(0, 3, 1, 2, 4).reshape(b, t, -1)
    valid = np.asarray(pos >= 0)
    np.testing.assert_allclose(np.asarray(got)[valid], np.asarray(want)[valid], atol=1e-5, rtol=0)


def test_the_models_hook_and_tpu_interpret_mode():
    """``pallas_paged`` (what the model calls) under TPU interpret mode: VMEM scratch, SMEM page table, the DMAs."""
    rng = np.random.default_rng(1)
    lay, pos = layer(rng, 2, 3), jnp.asarray([[5], [21]], jnp.int32)
    q, pol = queries(rng, pos), Policy()
    want = read_pages(q, lay, pos, lambda spec, a, b: matmul(spec, a, b, pol))
    np.testing.assert_allclose(np.asarray(pallas_paged(q, lay, pos, pol)), np.asarray(want), atol=1e-5, rtol=0)
    b, t = pos.shape
    qn = q.transpose(0, 2, 3, 1, 4).reshape(b, KVH, G * t, D)
    got = paged_attention(
        qn, lay.k, lay.v, lay.page_table, jnp.tile(pos, (1, G)), variant="tpu", interpret=pltpu.InterpretParams()
    )
    got = got.reshape(b, KVH, G, t, D).transpose(0, 3, 1, 2, 4).reshape(b, t, -1)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=0)


def test_each_row_reads_only_its_own_pages():
    pos = jnp.asarray([[0], [7], [8], [30], [-1]], jnp.int32)
    assert page_counts(pos, PS, 4).tolist() == [1, 1, 2, 4, 0]


def test_int8_pages_get_a_clear_error():
    rng = np.random.default_rng(2)
    lay = layer(rng, 1, 2)
    int8 = PagedLayer(
        lay.k.astype(jnp.int8),
        lay.v.astype(jnp.int8),
        lay.page_table,
        jnp.ones(lay.k.shape[:3]),
        jnp.ones(lay.k.shape[:3]),
    )
    with pytest.raises(ConfigError, match="float pages"):
        pallas_paged(queries(rng, jnp.zeros((1, 1), jnp.int32)), int8, jnp.zeros((1, 1), jnp.int32), Policy())


@pytest.mark.parametrize("platform,variant,call", [("tpu", "tpu", "tpu_custom_call"), ("cuda", "gpu", "triton")])
def test_the_kernel_lowers_for_a_chip_that_is_not_here(platform, variant, call):
    shapes = [
        jax.ShapeDtypeStruct(s, t)
        for s, t in (
            ((8, 3, 3, 64), jnp.float32),
            ((3, 65, 16, 64), jnp.float32),
            ((3, 65, 16, 64), jnp.float32),
            ((8, 16), jnp.int32),
            ((8, 3), jnp.int32),
        )
    ]
    text = lower(lambda *a: paged_attention(*a, variant=variant, interpret=False), platform, *shapes)
    assert call in text
