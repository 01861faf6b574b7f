"""The paged KV cache: fixed-size pages in one pool, a page table per sequence, attention read through it.

Layout, per layer: ``v`` of shape [n_kv_heads, num_pages, page_size, head_dim], and ``k`` the same
(``key_layout="sd"``: the layout of the Pallas TPU paged-attention kernel,
``jax.experimental.pallas.ops.tpu.paged_attention``: k_pages [num_kv_heads, total_num_pages, page_size, head_dim],
so a kernel can read it as it is) or each page's keys transposed, [n_kv_heads, num_pages, head_dim, page_size]
(``key_layout="ds"``, what :func:`~jaxlab.engine.kvcache.key_layout_for` gives XLA:CPU: a block of gathered keys
is then [rows, head_dim, positions], and XLA:CPU's batched float32 matmul computes the scores ``q . k`` about 2x
faster from it than from [rows, positions, head_dim]; same bits; benchmarks/NOTES.md 17). ``page_table``
[rows, pages_per_row] int32 says where each row's pages are: row ``r``'s token at position ``p`` lives in page
``page_table[r, p // page_size]`` at offset ``p % page_size``. A row stores no padding: its positions run
0, 1, 2, ... and each row has its own length, so rows of one batch start, grow and finish independently.

Page 0 is the *null page*: never given to a sequence. Table entries a row does not use point at it, and a
padding token (position -1: an idle row of a decode step, the left padding of a prefill chunk) writes its
key and value there, where nobody reads them.

int8 pages (``dtype="int8"``): ``k``/``v`` hold int8 and ``k_scale``/``v_scale`` [n_kv_heads, num_pages,
page_size] float32 one scale per stored vector, as in the contiguous int8 cache
(:func:`~jaxlab.engine.kvcache.quantize_kv`).

Reading (:func:`read_pages`): a query at position ``p`` of row ``r`` attends to the row's keys at positions
``0..p``, read through the table. Up to :data:`BLOCK_TOKENS` keys per row are gathered in one go and
attended with one softmax, as the contiguous cache does; a longer table is read block by block in a
``fori_loop`` with the kernels' online softmax (:func:`~jaxlab.engine.kernels.common.online_softmax`), so the
gathered copy of a block stays small instead of a copy of the whole context per step (measured on 2 CPU cores,
one layer at batch 32 and 1,024 positions: gathering everything 29 ms, block by block 12 ms, the contiguous
cache 12-15 ms).

The host side (which pages are free, which row holds which, prefix reuse) is :mod:`jaxlab.engine.pages`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.engine.kernels import cpu as cpu_kernels
from jaxlab.engine.kernels import paged_attention
from jaxlab.engine.kernels.common import MASK_VALUE, SOFTMAX, online_softmax, rows_alike
from jaxlab.engine.kvcache import check_key_layout, int8_bmm, kv_vector_bytes, quantize_kv
from jaxlab.errors import ConfigError
from jaxlab.io.config import LlamaConfig

#: Keys per row gathered at once; a longer page table is read in blocks of this many (online softmax).
BLOCK_TOKENS = 256

Matmul = Callable[[str, jax.Array, jax.Array], jax.Array]  # (einsum spec, a, b) -> float32


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class PagedKVCache:
    k: tuple  # per layer [KVH, num_pages, page_size, Hd], or [KVH, num_pages, Hd, page_size] (key_layout "ds")
    v: tuple  # per layer [KVH, num_pages, page_size, Hd]
    page_table: jax.Array  # [rows, pages_per_row] int32; 0 = the null page
    k_scale: tuple = ()  # int8 pages only: per layer [KVH, num_pages, page_size] float32
    v_scale: tuple = ()
    key_layout: str = field(default="sd", metadata=dict(static=True))  # "sd" or "ds" (see the module's docstring)

    @property
    def page_size(self) -> int:
        return self.v[0].shape[2]

    @property
    def num_pages(self) -> int:
        return self.k[0].shape[1]

    @property
    def rows(self) -> int:
        return self.page_table.shape[0]

    @property
    def width(self) -> int:
        """Positions a row can hold with this table: pages_per_row x page_size."""
        return self.page_table.shape[1] * self.page_size

    @property
    def quantized(self) -> bool:
        return bool(self.k_scale)

    def nbytes(self) -> int:
        return sum(a.size * a.dtype.itemsize for a in (*self.k, *self.v, *self.k_scale, *self.v_scale))

    def with_table(self, page_table) -> PagedKVCache:
        """The same pools read through another table (another set of rows, another width)."""
        table = (
            jax.device_put(np.asarray(page_table, np.int32)) if not isinstance(page_table, jax.Array) else page_table
        )
        return PagedKVCache(self.k, self.v, table, self.k_scale, self.v_scale, self.key_layout)

    def layer(self, i: int) -> PagedLayer:
        """Layer ``i``'s pools and the table, as its attention sees them."""
        scales = (self.k_scale[i], self.v_scale[i]) if self.k_scale else (None, None)
        return PagedLayer(self.k[i], self.v[i], self.page_table, *scales, key_layout=self.key_layout)

    def with_layers(self, layers: Sequence[PagedLayer]) -> PagedKVCache:
        """The cache after a pass: every layer's pools as :meth:`PagedLayer.write` left them, the same table."""
        scales = {}
        if self.k_scale:
            scales = dict(k_scale=tuple(x.k_scale for x in layers), v_scale=tuple(x.v_scale for x in layers))
        k, v = tuple(x.k for x in layers), tuple(x.v for x in layers)
        return PagedKVCache(k, v, self.page_table, **scales, key_layout=self.key_layout)


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class PagedLayer:
    """One layer's pools and the table, as the attention of that layer sees them: the interface of the contiguous
    :class:`~jaxlab.engine.kvcache.KVLayer` (:meth:`write`, then :meth:`attend`), over pages."""

    k: jax.Array  # [KVH, num_pages, page_size, Hd], or [KVH, num_pages, Hd, page_size] (key_layout "ds")
    v: jax.Array  # [KVH, num_pages, page_size, Hd]
    page_table: jax.Array  # [rows, pages_per_row] int32
    k_scale: jax.Array | None = None  # int8 pages only: [KVH, num_pages, page_size] float32
    v_scale: jax.Array | None = None
    key_layout: str = field(default="sd", metadata=dict(static=True))

    def write(self, k: jax.Array, v: jax.Array, positions: jax.Array) -> PagedLayer:
        """k, v [B, T, KVH, Hd] of tokens at ``positions`` [B, T] stored in their rows' pages (:func:`write_pages`)."""
        return write_pages(self, k, v, positions)

    def attend(self, q: jax.Array, positions: jax.Array, policy) -> jax.Array:
        """q [B, T, KVH, G, Hd] at ``positions`` [B, T] -> [B, T, KVH*G*Hd] float32, read through the table:
        :func:`read_pages` (XLA), or the ragged paged kernel (:func:`pallas_paged`) under ``attention="pallas"``.
        ``policy``: the model's :class:`~jaxlab.engine.model.Policy` (its matmul and its attention switch)."""
        if policy.attention == "pallas":
            return pallas_paged(q, self, positions, policy)
        if uses_cpu_kernel(q, self, policy):  # other platforms' programs keep XLA's read
            xla = functools.partial(read_pages, matmul=policy.matmul)
            return jax.lax.platform_dependent(q, self, positions, cpu=cpu_paged, default=xla)
        return read_pages(q, self, positions, policy.matmul)


def paged_cache_bytes(cfg: LlamaConfig, num_pages: int, page_size: int, dtype=jnp.float32) -> int:
    """Bytes of a page pool: 2 (K and V) x layers x pages x page_size x kv_heads x vector bytes (the same
    vector bytes as :func:`~jaxlab.engine.kvcache.cache_bytes`; page 0, the null page, included)."""
    return 2 * cfg.n_layers * num_pages * page_size * cfg.n_kv_heads * kv_vector_bytes(cfg, dtype)


def kv_tokens_for(cfg: LlamaConfig, budget_bytes: int, page_size: int, dtype=jnp.float32) -> int:
    """The KV positions (whole pages) a pool of at most ``budget_bytes`` holds, the null page set aside: the
    inverse of :func:`paged_cache_bytes`, for a KV budget given as memory."""
    page = paged_cache_bytes(cfg, 1, page_size, dtype)
    return max(0, budget_bytes // page - 1) * page_size


def init_paged_cache(
    cfg: LlamaConfig,
    num_pages: int,
    page_size: int,
    rows: int = 1,
    pages_per_row: int = 1,
    dtype=jnp.float32,
    key_layout: str = "sd",
) -> PagedKVCache:
    """An empty pool of ``num_pages`` pages (page 0 the null page) and a table of ``rows`` x ``pages_per_row``
    pointing at the null page; ``dtype="int8"`` gives int8 pages with their scales. ``key_layout``: "sd" or "ds"
    (the module's docstring; :func:`~jaxlab.engine.kvcache.key_layout_for`)."""
    shape = (cfg.n_kv_heads, num_pages, page_size, cfg.head_dim)
    k_shape = shape if check_key_layout(key_layout) == "sd" else (cfg.n_kv_heads, num_pages, cfg.head_dim, page_size)
    dtype = jnp.dtype(dtype)
    scales = {}
    if dtype == jnp.int8:
        zeros = tuple(jnp.zeros(shape[:3], jnp.float32) for _ in range(cfg.n_layers))
        scales = dict(k_scale=zeros, v_scale=tuple(jnp.zeros(shape[:3], jnp.float32) for _ in range(cfg.n_layers)))
    elif not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(f"KV cache dtype must be a float type or int8, got {dtype}")
    return PagedKVCache(
        k=tuple(jnp.zeros(k_shape, dtype) for _ in range(cfg.n_layers)),
        v=tuple(jnp.zeros(shape, dtype) for _ in range(cfg.n_layers)),
        page_table=jnp.zeros((rows, pages_per_row), jnp.int32),
        **scales,
        key_layout=key_layout,
    )


def write_pages(layer: PagedLayer, k: jax.Array, v: jax.Array, positions: jax.Array) -> PagedLayer:
    """Store the new keys and values k, v [B, T, KVH, Hd] of tokens at ``positions`` [B, T] (-1: padding,
    written to the null page) into the layer's pages; a scatter, in place when the cache is donated."""
    ps = layer.v.shape[2]
    b, t, kvh, hd = k.shape
    valid = positions >= 0
    safe = jnp.where(valid, positions, 0)
    page = jnp.where(valid, jnp.take_along_axis(layer.page_table, safe // ps, axis=1), 0).reshape(-1)
    off = jnp.where(valid, safe % ps, 0).reshape(-1)
    kn = k.transpose(2, 0, 1, 3).reshape(kvh, b * t, hd)
    vn = v.transpose(2, 0, 1, 3).reshape(kvh, b * t, hd)
    scales = {}
    if layer.k_scale is not None:
        (kn, ks), (vn, vs) = quantize_kv(kn, axis=2), quantize_kv(vn, axis=2)
        sp, so = page, off
        if b * t == 1:
            # One token's scales (a lone request's decode step) also write a zero into the null page, where nobody
            # reads: a one-element scatter is rewritten by XLA:CPU into an in-place update that it then fuses into
            # the attention's read of the same scales, which needs a copy of the whole scale pool first, twice a
            # layer, so a lone request's step grew with the pool (benchmarks/NOTES.md 23); two elements stay a scatter.
            sp, so = jnp.append(page, 0), jnp.append(off, 0)
            ks, vs = (jnp.pad(x, ((0, 0), (0, 1))) for x in (ks, vs))
        scales = dict(k_scale=layer.k_scale.at[:, sp, so].set(ks), v_scale=layer.v_scale.at[:, sp, so].set(vs))
    if layer.key_layout == "sd":
        keys = layer.k.at[:, page, off].set(kn.astype(layer.k.dtype))
    else:  # [KVH, N, Hd, ps]: the indexed axes (page, offset) come first in the update, [B*T, KVH, Hd]
        keys = layer.k.at[:, page, :, off].set(kn.transpose(1, 0, 2).astype(layer.k.dtype))
    values = layer.v.at[:, page, off].set(vn.astype(layer.v.dtype))
    return PagedLayer(keys, values, layer.page_table, **scales, key_layout=layer.key_layout)


def _gather(pool: jax.Array, pages: jax.Array) -> jax.Array:
    """pool [KVH, N, ps, ...] read at pages [B, P] -> [B*KVH, P*ps, ...] (rows of the contiguous layout)."""
    g = pool[:, pages]  # [KVH, B, P, ps, ...]
    g = jnp.moveaxis(g, 0, 1)  # [B, KVH, P, ps, ...]
    b, kvh, p, ps = g.shape[:4]
    return g.reshape(b * kvh, p * ps, *g.shape[4:])


def _gather_keys(layer: PagedLayer, pages: jax.Array) -> jax.Array:
    """The keys of ``pages`` [B, P]: [B*KVH, P*ps, Hd] ("sd"), or [B*KVH, Hd, P*ps] ("ds")."""
    if layer.key_layout == "sd":
        return _gather(layer.k, pages)
    g = layer.k[:, pages].transpose(1, 0, 3, 2, 4)  # [KVH, B, P, Hd, ps] -> [B, KVH, Hd, P, ps]
    b, kvh, hd, p, ps = g.shape
    return g.reshape(b * kvh, hd, p * ps)


def _block(q, layer: PagedLayer, pages, first: int | jax.Array, positions, matmul: Matmul, scale: float):
    """Scores and values of one block of pages: (scores [B*KVH, G*T, S] masked, values [B*KVH, S, Hd],
    value scales [B*KVH, S] or None)."""
    b, t = positions.shape
    bk, gt, _ = q.shape
    k, v = _gather_keys(layer, pages), _gather(layer.v, pages)
    by_dim = layer.key_layout == "ds"  # k [B*KVH, Hd, S]: the scores contract its axis 1
    if layer.k_scale is not None:
        scores = int8_bmm(q, k, 1 if by_dim else 2) * _gather(layer.k_scale, pages)[:, None, :]
        v_scale = _gather(layer.v_scale, pages)
    else:
        scores = matmul("nqd,nds->nqs" if by_dim else "nqd,nsd->nqs", q, k)
        v_scale = None
    s = v.shape[1]
    scores = scores.astype(jnp.float32).reshape(b, bk // b, gt // t, t, s) * scale
    key_pos = first + jnp.arange(s)
    visible = key_pos[None, None, :] <= positions[:, :, None]  # [B, T, S]; padding queries (-1) see nothing
    scores = jnp.where(visible[:, None, None], scores, MASK_VALUE).reshape(bk, gt, s)
    return scores, v, v_scale


def _values(probs, v, v_scale, matmul: Matmul):
    if v_scale is not None:  # fold each value vector's scale into its attention weight
        return int8_bmm(probs * v_scale[:, None, :], v, 1)
    return matmul("nqs,nsd->nqd", probs, v)


def read_pages(q: jax.Array, layer: PagedLayer, positions: jax.Array, matmul: Matmul) -> jax.Array:
    """Attention through the page table: q [B, T, KVH, G, Hd] at ``positions`` [B, T] -> [B, T, KVH*G*Hd].

    A query at position p sees its row's keys at positions 0..p (all written before, or in this same call by
    :func:`write_pages`). ``matmul(spec, a, b)`` is the model's float matmul (its dtype and precision)."""
    b, t, kvh, g, hd = q.shape
    qn = q.transpose(0, 2, 3, 1, 4).reshape(b * kvh, g * t, hd)  # [B*KVH, G*T, Hd], as the contiguous cache
    ps, pages_per_row = layer.v.shape[2], layer.page_table.shape[1]
    scale = hd**-0.5
    per_block = max(1, min(pages_per_row, BLOCK_TOKENS // ps))
    if pages_per_row <= per_block:
        scores, v, vs = _block(qn, layer, layer.page_table, 0, positions, matmul, scale)
        out = _values(rows_alike(SOFTMAX, scores), v, vs, matmul)
    else:
        if pages_per_row % per_block:
            raise ValueError(
                f"a page table of {pages_per_row} pages is read in blocks of {per_block}: make it a multiple"
            )

        def body(i, carry):
            pages = jax.lax.dynamic_slice_in_dim(layer.page_table, i * per_block, per_block, axis=1)
            scores, v, vs = _block(qn, layer, pages, i * per_block * ps, positions, matmul, scale)
            return online_softmax(*carry, scores, lambda p: _values(p, v, vs, matmul), alike=True)

        init = (
            jnp.full((b * kvh, g * t, 1), MASK_VALUE, jnp.float32),
            jnp.zeros((b * kvh, g * t, 1), jnp.float32),
            jnp.zeros((b * kvh, g * t, hd), jnp.float32),
        )
        _, total, acc = jax.lax.fori_loop(0, pages_per_row // per_block, body, init)
        out = acc / total
    out = out.reshape(b, kvh, g, t, hd).transpose(0, 3, 1, 2, 4)
    return out.reshape(b, t, kvh * g * hd)


def uses_cpu_kernel(q: jax.Array, layer: PagedLayer, policy) -> bool:
    """Whether attention over ``layer`` runs on jaxlab's CPU kernel (:mod:`jaxlab.engine.kernels.cpu`) when the
    program is lowered for a CPU: a few float32 queries a row over the pages :func:`~jaxlab.engine.kvcache.key_layout_for`
    gives XLA:CPU (float32 with each page's keys transposed, or int8 with their scales), the kernel built and not
    turned off."""
    b, t, kvh, g, hd = q.shape
    if policy.dtype != "float32" or q.dtype != jnp.float32:
        return False
    if layer.k_scale is not None:
        pages = layer.k.dtype == jnp.int8 and layer.key_layout == "sd"
    else:
        pages = layer.k.dtype == jnp.float32 and layer.key_layout == "ds"
    return pages and cpu_kernels.uses_paged_attention(t, hd)


def cpu_paged(q: jax.Array, layer: PagedLayer, positions: jax.Array) -> jax.Array:
    """Attention through the page table by jaxlab's CPU kernel: q [B, T, KVH, G, Hd] at ``positions`` [B, T] ->
    [B, T, KVH*G*Hd] float32, each page read where it lies instead of gathered (benchmarks/NOTES.md 27); what
    :func:`read_pages` computes, within float32 rounding (int8 pages: of their dequantized vectors)."""
    b, t = positions.shape
    scales = (layer.k_scale, layer.v_scale) if layer.k_scale is not None else ()
    return cpu_kernels.paged_attention(q, positions, layer.k, layer.v, layer.page_table, *scales).reshape(b, t, -1)


def pallas_paged(q: jax.Array, layer: PagedLayer, positions: jax.Array, policy) -> jax.Array:
    """Attention through the page table as the Pallas ragged paged kernel: q [B, T, KVH, G, Hd] at positions
    [B, T] -> [B, T, KVH*G*Hd] float32, the layout :func:`read_pages` returns. ``policy``: the model's
    :class:`~jaxlab.engine.model.Policy` (the kernel's matmul dtype and precision)."""
    if layer.k_scale is not None:
        raise ConfigError("attention='pallas' reads float pages: drop the int8 cache, or use attention 'xla'")
    if layer.key_layout != "sd":
        raise ConfigError(
            "attention='pallas' reads keys laid out [KVH, pages, page_size, Hd] (key_layout 'sd'); this pool was made"
            " for XLA's attention (key_layout 'ds'): make the engine with the pallas policy, or use attention 'xla'"
        )
    b, t, kvh, g, hd = q.shape
    qn = q.transpose(0, 2, 3, 1, 4).reshape(b, kvh, g * t, hd)  # query (g, t) at row g*T + t
    out = paged_attention(
        qn,
        layer.k,
        layer.v,
        layer.page_table,
        jnp.tile(positions, (1, g)),
        dtype=policy.jnp_dtype,
        precision=policy.lax_precision,
    )
    return out.reshape(b, kvh, g, t, hd).transpose(0, 3, 1, 2, 4).reshape(b, t, kvh * g * hd)
