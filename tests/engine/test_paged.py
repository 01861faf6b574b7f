"""The paged KV cache computes what the contiguous cache computes: the same forward, pages read through a table."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import jit_forward

from jaxlab.engine import paged
from jaxlab.engine.kvcache import cache_bytes, init_cache, left_pad
from jaxlab.engine.model import forward, init_params
from jaxlab.engine.paged import PagedKVCache, init_paged_cache, paged_cache_bytes
from jaxlab.io.config import tiny


def greedy_steps(params, first, prompts, cache, steps, fwd=jit_forward):
    """``steps`` greedy decode steps after the prompts' last logits ``first`` [B, V], with either cache ->
    [B, 1 + steps, V] (the first logits included). ``fwd``: the forward pass (jitted, or ``forward`` eagerly)."""
    out = [first]
    pos = jnp.asarray([len(p) for p in prompts])
    for _ in range(steps):
        nxt = jnp.argmax(out[-1], -1)
        logits, cache = fwd(params, nxt[:, None], pos[:, None], cache, last_only=True)
        out.append(logits[:, 0])
        pos = pos + 1
    return jnp.stack(out, 1)


def contiguous_logits(params, prompts, steps, dtype=jnp.float32, fwd=jit_forward):
    """Prefill (left-padded) then ``steps`` greedy decode steps with the contiguous cache -> [B, 1 + steps, V]."""
    cfg = params.config
    tokens, positions = left_pad(prompts, cfg.pad_id)
    cache = init_cache(cfg, len(prompts), 64, dtype)
    logits, cache = fwd(params, jnp.asarray(tokens), jnp.asarray(positions), cache, last_only=True)
    return greedy_steps(params, logits[:, 0], prompts, cache, steps, fwd)


def paged_logits(params, prompts, steps, page_size, width, dtype=jnp.float32, seed=0, fwd=jit_forward, layout="sd"):
    """The same with a paged cache: each row's pages scattered at random over the pool; prompts prefilled
    row by row in one call each (right-aligned in a chunk of the longest length), then decode steps for all rows.
    ``layout``: the pool's key layout ("sd", or "ds": each page's keys transposed)."""
    cfg = params.config
    rng = np.random.default_rng(seed)
    per_row = width // page_size
    pool = 1 + len(prompts) * per_row
    order = rng.permutation(np.arange(1, pool)).reshape(len(prompts), per_row)
    cache = init_paged_cache(cfg, pool, page_size, dtype=dtype, key_layout=layout)
    longest = max(len(p) for p in prompts)
    firsts = []
    for r, p in enumerate(prompts):
        tokens = np.zeros((1, longest), np.int32)
        positions = np.full((1, longest), -1, np.int32)
        tokens[0, longest - len(p) :] = p
        positions[0, longest - len(p) :] = np.arange(len(p))
        logits, cache = fwd(
            params, jnp.asarray(tokens), jnp.asarray(positions), cache.with_table(order[r : r + 1]), last_only=True
        )
        firsts.append(logits[0, 0])
    return greedy_steps(params, jnp.stack(firsts), prompts, cache.with_table(order), steps, fwd)


PROMPTS = [[1, 5, 9, 33, 7, 80, 12], [1, 44], [1, 3, 3, 3, 90, 100, 200, 201, 17, 4, 4, 60, 61]]


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_paged_equals_contiguous_float32(page_size):
    params = init_params(tiny(), 0)
    ref = contiguous_logits(params, PROMPTS, 6)
    got = paged_logits(params, PROMPTS, 6, page_size, width=32)
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), atol=1e-5, rtol=0)
    assert (np.argmax(got, -1) == np.argmax(ref, -1)).all()


def test_int8_pages_equal_the_int8_contiguous_cache():
    params = init_params(tiny(), 1)
    ref = contiguous_logits(params, PROMPTS, 4, jnp.int8)
    got = paged_logits(params, PROMPTS, 4, 4, width=32, dtype=jnp.int8)
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), atol=1e-5, rtol=0)


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_keys_transposed_in_their_pages_give_the_same_logits(dtype, monkeypatch):
    """The pool with each page's keys transposed ("ds", what XLA:CPU's float32 engine uses) computes what the Pallas
    kernels' layout ("sd") does: one read and block by block, prefill chunks and decode steps."""
    params = init_params(tiny(), 5)
    fwd = jit_forward  # the shapes of the tests above: no new program
    if dtype == "int8":
        # int8 "sd" pages are read by jaxlab's CPU kernel where it runs (the attention of the dequantized vectors;
        # tests/engine/kernels/test_cpu.py), int8 "ds" pages by XLA's int8 path, which rounds q and the weights to
        # ~15 bits first: the layouts are compared on XLA's path, as they were written
        monkeypatch.setattr(paged, "uses_cpu_kernel", lambda *a: False)
        fwd = fresh_jit()
    sd = paged_logits(params, PROMPTS, 4, 4, width=32, dtype=dtype, fwd=fwd)
    ds = paged_logits(params, PROMPTS, 4, 4, width=32, dtype=dtype, layout="ds", fwd=fwd)
    np.testing.assert_allclose(np.asarray(ds), np.asarray(sd), atol=1e-6, rtol=0)
    assert (np.argmax(ds, -1) == np.argmax(sd, -1)).all()
    if dtype == "int8":  # its keys go through the same gather; the loop is the float32 case's
        return
    monkeypatch.setattr(paged, "BLOCK_TOKENS", 8)  # 4 blocks of 2 pages: the gather inside the loop
    blocks = paged_logits(params, PROMPTS, 4, 4, width=32, dtype=dtype, fwd=fresh_jit(), layout="ds")
    np.testing.assert_allclose(np.asarray(blocks), np.asarray(sd), atol=1e-5, rtol=0)


def test_the_pools_key_layouts_and_their_checks():
    from jaxlab.engine.model import default_policy
    from jaxlab.errors import ConfigError

    # which layout an engine takes: tests/engine/test_kvcache.py (kvcache.key_layout_for)
    with pytest.raises(ValueError, match="'sd' or 'ds'"):
        init_paged_cache(tiny(), 3, 4, key_layout="dsd")
    cfg = tiny()
    c = init_paged_cache(cfg, 5, 4, key_layout="ds").with_table(np.asarray([[1, 2]]))
    assert c.k[0].shape == (cfg.n_kv_heads, 5, cfg.head_dim, 4) and c.page_size == 4 and c.width == 8
    assert c.layer(0).key_layout == "ds" and c.with_layers([c.layer(0)] * cfg.n_layers).key_layout == "ds"
    q = jnp.zeros((1, 1, cfg.n_kv_heads, cfg.q_per_kv, cfg.head_dim))
    with pytest.raises(ConfigError, match="key_layout 'ds'"):
        paged.pallas_paged(q, c.layer(0), jnp.zeros((1, 1), jnp.int32), default_policy())


def fresh_jit():
    """``forward`` jitted anew: a trace of its own, which sees module constants as they are now (a shared jitted
    ``forward`` reuses its trace for the same shapes and would not see a monkeypatched constant)."""
    return jax.jit(functools.partial(forward), static_argnames=("last_only", "upto", "reduce"))


def test_reading_in_blocks_equals_one_read(monkeypatch):
    """A table wider than BLOCK_TOKENS is read block by block with an online softmax: the same logits."""
    params = init_params(tiny(), 2)
    one = paged_logits(params, PROMPTS, 3, 4, width=32, fwd=fresh_jit())
    monkeypatch.setattr(paged, "BLOCK_TOKENS", 8)  # 4 blocks of 2 pages
    blocks = paged_logits(params, PROMPTS, 3, 4, width=32, fwd=fresh_jit())
    np.testing.assert_allclose(np.asarray(blocks), np.asarray(one), atol=1e-5, rtol=0)
    monkeypatch.setattr(paged, "BLOCK_TOKENS", 12)  # 3 pages per block do not divide 8
    with pytest.raises(ValueError, match="multiple"):
        paged_logits(params, PROMPTS, 1, 4, width=32, fwd=fresh_jit())


@pytest.mark.parametrize("layout", ["sd", "ds"])
def test_padding_writes_only_the_null_page(layout):
    params = init_params(tiny(), 3)
    cfg = params.config
    cache = init_paged_cache(cfg, 5, 4, rows=2, pages_per_row=2, key_layout=layout)
    cache = cache.with_table(np.asarray([[1, 2], [3, 4]]))
    tokens = jnp.asarray([[0, 0, 7, 8], [5, 6, 7, 8]])
    positions = jnp.asarray([[-1, -1, 0, 1], [-1, -1, -1, -1]])  # row 1 is idle
    _, cache = jit_forward(params, tokens, positions, cache, last_only=True)
    k = np.asarray(cache.k[0])  # [KVH, pages, page_size, Hd]
    if layout == "ds":  # [KVH, pages, Hd, page_size]: the same keys, each page transposed
        k = k.transpose(0, 1, 3, 2)
        np.testing.assert_array_equal(np.asarray(cache.v[0])[:, 1, :2] != 0, k[:, 1, :2] != 0)
    assert np.abs(k[:, 1, :2]).sum() > 0 and np.abs(k[:, 1, 2:]).sum() == 0  # row 0's two tokens, page 1
    assert np.abs(k[:, 2:]).sum() == 0  # nothing else but the null page
    assert np.abs(k[:, 0]).sum() > 0


def test_one_tokens_int8_write_copies_no_pool():
    """A lone request's decode step (one token) over an int8 pool: the compiled step copies no pool-sized array
    (XLA:CPU rewrote the one-element scale scatter into an update fused into the attention's read, and copied the
    whole scale pool twice a layer, so the step grew with the pool: benchmarks/NOTES.md 23), and the token's
    key, value and scales land in its own page, a zero scale in the null page, nothing elsewhere."""
    params = init_params(tiny(), 3)
    cfg = params.config
    pool = 67  # a page count no other array of the step has
    cache = init_paged_cache(cfg, pool, 4, dtype=jnp.int8).with_table(np.asarray([[5, 9]]))
    step = jax.jit(lambda p, t, pos, c: forward(p, t, pos, c, last_only=True), donate_argnums=(3,))
    args = (params, jnp.asarray([[7]]), jnp.asarray([[5]]), cache)
    compiled = step.lower(*args).compile()
    text = compiled.as_text()
    entry = text[text.index("\nENTRY ") :]
    copies = [line.split("=")[1].split("{")[0] for line in entry.splitlines() if " copy(" in line]
    assert not [c for c in copies if f",{pool}," in c or f"[{pool}," in c], copies
    _, out = compiled(*args)
    for scales in (out.k_scale[0], out.v_scale[0]):  # [KVH, pages, page_size]
        s = np.array(scales)
        assert (s[:, 9, 1] > 0).all()  # position 5: the table's second page, offset 1
        s[:, 9, 1] = 0
        assert not s.any()  # the null page's scale is the zero written beside it; nothing else
    k = np.asarray(out.k[0])
    assert np.abs(k[:, 9, 1]).sum() > 0 and np.abs(np.delete(k, 9, axis=1)).sum() == 0


def test_bytes_and_shapes():
    cfg = tiny()
    c = init_paged_cache(cfg, 9, 4, rows=3, pages_per_row=2, dtype=jnp.int8)
    assert isinstance(c, PagedKVCache) and c.quantized and c.width == 8 and c.rows == 3
    assert c.nbytes() == paged_cache_bytes(cfg, 9, 4, jnp.int8)
    assert paged_cache_bytes(cfg, 1 + 2 * 8, 4) == cache_bytes(cfg, 2, 32) + cache_bytes(cfg, 1, 4)  # + null page
    assert c.k[0].shape == (cfg.n_kv_heads, 9, 4, cfg.head_dim)
    with pytest.raises(ValueError, match="float type or int8"):
        init_paged_cache(cfg, 3, 4, dtype=jnp.int32)


def test_jit_with_a_donated_paged_cache():
    params = init_params(tiny(), 4)
    cfg = params.config
    cache = init_paged_cache(cfg, 9, 4, rows=1, pages_per_row=4).with_table(np.asarray([[3, 1, 8, 2]]))
    step = jax.jit(lambda p, t, pos, c: forward(p, t, pos, c, last_only=True), donate_argnums=(3,))
    tokens = jnp.asarray([[1, 5, 9, 33, 7]])
    logits, cache = step(params, tokens, jnp.arange(5)[None], cache)
    ref = contiguous_logits(params, [[1, 5, 9, 33, 7]], 0)
    np.testing.assert_allclose(np.asarray(logits[:, 0]), np.asarray(ref[:, 0]), atol=1e-5)


@pytest.mark.parametrize("kind", ["float32", "int8", "paged"])
def test_every_cache_kind_is_one_layer_interface(kind):
    """``cache.layer(i)`` gives what a layer's attention uses, for every kind: a pytree with ``write`` and ``attend``
    that goes through ``jit`` and ``scan`` as it is; ``cache.with_layers`` puts a pass's layers back together."""
    from jaxlab.engine.model import default_policy

    cfg, pol = tiny(), default_policy()
    if kind == "paged":
        cache = init_paged_cache(cfg, 5, 4, rows=2, pages_per_row=2).with_table(np.asarray([[1, 2], [3, 4]]))
    else:
        cache = init_cache(cfg, 2, 8, kind)
    keys = jax.random.split(jax.random.key(0), 3)
    k, v = (jax.random.normal(x, (2, 3, cfg.n_kv_heads, cfg.head_dim)) for x in keys[:2])
    q = jax.random.normal(keys[2], (2, 3, cfg.n_kv_heads, cfg.q_per_kv, cfg.head_dim))
    positions = jnp.asarray([[0, 1, 2], [-1, 0, 1]])

    def step(layer):  # a layer in -> the layer after the write, and the attention output [B, T, H*Hd]
        layer = layer.write(k, v, positions)
        return layer, layer.attend(q, positions, pol)

    looped = [jax.jit(step)(cache.layer(i)) for i in range(cfg.n_layers)]
    stacked = jax.tree.map(lambda *a: jnp.stack(a), *[cache.layer(i) for i in range(cfg.n_layers)])
    _, (scanned, outs) = jax.lax.scan(lambda c, layer: (c, step(layer)), None, stacked)
    for i, (layer, out) in enumerate(looped):
        assert out.shape == (2, 3, cfg.n_heads * cfg.head_dim)
        np.testing.assert_allclose(np.asarray(outs[i]), np.asarray(out), atol=1e-6)
        for a, b in zip(jax.tree.leaves(layer), jax.tree.leaves(jax.tree.map(lambda x: x[i], scanned))):
            atol = 1 if a.dtype == jnp.int8 else 1e-6  # an int8 value may round one step apart
            np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), atol=atol)
    new = cache.with_layers([layer for layer, _ in looped])
    assert type(new) is type(cache) and jax.tree.structure(new) == jax.tree.structure(cache)
    assert all(np.abs(np.asarray(a, np.float32)).sum() > 0 for a in new.k)  # every layer's write is in
    if kind != "paged":
        assert int(new.index) == 3 and np.asarray(new.pos)[:, :3].tolist() == positions.tolist()


#: bfloat16: the pages and the contiguous cache store the same bfloat16 keys and values; the two attentions sum
#: in different orders, so logits agree to a stated tolerance (measured on the tiny model: max |diff| < 3e-3).
BF16_ATOL = 2e-2


def test_paged_equals_contiguous_bfloat16():
    from jaxlab.engine.model import cast_params, default_policy

    params = cast_params(init_params(tiny(), 5), default_policy("bfloat16"))
    ref = contiguous_logits(params, PROMPTS, 5, jnp.bfloat16)
    got = paged_logits(params, PROMPTS, 5, 4, width=32, dtype=jnp.bfloat16)
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), atol=BF16_ATOL, rtol=0)
    assert (np.argmax(got, -1) == np.argmax(ref, -1)).all()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_pallas_attention_equals_xla_with_both_caches(dtype):
    """``attention="pallas"`` (flash over the contiguous cache, ragged paged over pages) gives the logits of the XLA
    attention: within 1e-5 in float32, within the bfloat16 tolerance above, same argmax; the tiny model has GQA."""
    from jaxlab.engine.model import cast_params, default_policy, with_attention

    params = cast_params(init_params(tiny(), 6), default_policy(dtype))
    kernels = with_attention(params, "pallas")
    assert kernels.policy.attention == "pallas" and kernels.policy.dtype == dtype
    atol, cache = (1e-5, jnp.float32) if dtype == "float32" else (BF16_ATOL, jnp.bfloat16)
    ref = contiguous_logits(params, PROMPTS, 3, cache)
    for got in (contiguous_logits(kernels, PROMPTS, 3, cache), paged_logits(kernels, PROMPTS, 3, 4, 32, cache)):
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(ref, np.float32), atol=atol, rtol=0)
        assert (np.argmax(got, -1) == np.argmax(ref, -1)).all()
