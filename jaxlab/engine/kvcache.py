"""The KV cache as explicit state: a pytree passed into the model step and returned from it.

Layout, per layer: ``k`` of shape [B * n_kv_heads, S, head_dim] and ``v`` of shape
[B * n_kv_heads, head_dim, S], where S is the cache length (slots). Batch and head share one axis, so XLA
updates the donated cache in place and reads it without a transpose. (Measured on XLA's CPU backend: with
[B, S, KVH, Hd], or any layout with a size-1 batch axis at batch 1, the compiled decode step copied every
layer's whole cache on every step.) That is key layout "sd", the default, the Pallas flash kernel's.

Key layout "ds" (``init_cache(..., key_layout="ds")``, :func:`key_layout_for`) swaps both: ``k`` [B * n_kv_heads,
head_dim, S] and ``v`` [B * n_kv_heads, S, head_dim]. XLA:CPU's batched float32 matmul runs 2-3x faster when
its big operand's contracted axis is not the minor one (benchmarks/NOTES.md 17: scores from K [N, Hd, S] 1.69 ms
against 5.68 from [N, S, Hd] at 32 rows x 1,024 positions), so the Generator takes "ds" for a float32 cache
where XLA:CPU computes the attention; the tokens are the same (benchmarks/NOTES.md 18).

``pos`` [B, S] holds the position of the token stored in each slot, -1 for an empty slot or a padding token;
``index`` is the next slot to write (shared by the batch, so a write is one ``dynamic_update_slice``, done in place
when the cache is donated).

Batches are left-padded: a row whose prompt is shorter starts with padding (position -1), so every row
writes its next token at the same slot. A query at position p attends to slots whose position lies in
[0, p]. Rolling back (speculative decoding) only moves ``index`` back: stale slots hold positions
greater than any later query's, so they are invisible until overwritten.

Memory: 2 x layers x B x S x kv_heads x head_dim x itemsize (:func:`cache_bytes`, the one formula).

int8 cache (``init_cache(..., dtype="int8")``): ``k`` and ``v`` hold int8 and ``k_scale`` / ``v_scale``
[B * n_kv_heads, S] float32 hold one scale per stored key / value vector (symmetric, over head_dim,
computed when the token is written: :func:`quantize_kv`). Attention multiplies the scores by the key
scales and folds the value scales into the attention weights, so the int8 arrays are read as they are.
Memory: a quarter of float32 plus 8 bytes per slot per kv head per layer.

What a layer's attention sees (:meth:`KVCache.layer`): a :class:`KVLayer`, float or int8, with two methods, the
interface every cache kind shares (the paged cache's is :class:`~jaxlab.engine.paged.PagedLayer`): ``write(k, v,
positions)`` stores the new tokens and returns the updated layer, ``attend(q, positions, policy)`` returns the
attention output. The "int8 or not" and "XLA or Pallas" branching lives there, not in the model; the model puts
the layers back together with :meth:`KVCache.with_layers`.

The write itself is one small function, :func:`write_slots` (``new`` at slots ``index..`` of an array's slot axis),
and a cache carries it as static metadata (``KVCache.slot_write``): every K, V, position and scale write of
:meth:`KVLayer.write` goes through it. It is the hook of the lab's build-the-engine track, which runs the model
with a student's own cache write (``init_cache(..., slot_write=my_cache_update)``); everything else passes nothing
and gets :func:`write_slots`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.engine.kernels import cpu as cpu_kernels
from jaxlab.engine.kernels import flash_attention
from jaxlab.engine.kernels.common import MASK_VALUE, SOFTMAX, rows_alike
from jaxlab.errors import ConfigError
from jaxlab.io.config import LlamaConfig
from jaxlab.quant.formats import join_split, split_activations


def write_slots(array: jax.Array, new: jax.Array, index, axis: int) -> jax.Array:
    """``array`` with ``new`` (T slots) written at slots ``index .. index+T-1`` of its slot ``axis`` (0 on every
    other axis): one ``dynamic_update_slice``, done in place when the cache is donated. The cache write."""
    start = [0] * array.ndim
    start[axis] = index
    return jax.lax.dynamic_update_slice(array, new.astype(array.dtype), tuple(start))


#: (array, new, index, slot axis) -> array: how a cache writes new slots (:func:`write_slots`, or a student's own)
SlotWrite = Callable[[jax.Array, jax.Array, jax.Array, int], jax.Array]


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class KVCache:
    k: tuple  # per layer [B*KVH, S, Hd] ("ds": [B*KVH, Hd, S])
    v: tuple  # per layer [B*KVH, Hd, S] ("ds": [B*KVH, S, Hd])
    pos: jax.Array  # [B, S] int32, -1 = empty or padding
    index: jax.Array  # [] int32, next slot to write
    k_scale: tuple = ()  # int8 cache only: per layer [B*KVH, S] float32
    v_scale: tuple = ()  # int8 cache only: per layer [B*KVH, S] float32
    slot_write: SlotWrite = field(default=write_slots, metadata=dict(static=True))  # every write goes through it
    key_layout: str = field(default="sd", metadata=dict(static=True))  # "sd" or "ds" (the module's docstring)

    @property
    def batch(self) -> int:
        return self.pos.shape[0]

    @property
    def length(self) -> int:
        return self.pos.shape[1]

    @property
    def quantized(self) -> bool:
        return bool(self.k_scale)

    @property
    def slot_axes(self) -> tuple[int, int]:
        """(axis of the slots in a layer's K array, in its V array): (1, 2) in key layout "sd", (2, 1) in "ds"."""
        return slot_axes(self.key_layout)

    def nbytes(self) -> int:
        return sum(a.size * a.dtype.itemsize for a in (*self.k, *self.v, *self.k_scale, *self.v_scale))

    def layer(self, i: int) -> KVLayer:
        """Layer ``i`` as its attention sees it (the shared ``pos`` and ``index`` included)."""
        scales = (self.k_scale[i], self.v_scale[i]) if self.k_scale else (None, None)
        return KVLayer(
            self.k[i], self.v[i], self.pos, self.index, *scales, slot_write=self.slot_write, key_layout=self.key_layout
        )

    def with_layers(self, layers: Sequence[KVLayer]) -> KVCache:
        """The cache after a pass: every layer as :meth:`KVLayer.write` left it (each wrote the same ``pos`` and
        ``index``; the first layer's are taken)."""
        scales = {}
        if self.k_scale:
            scales = dict(k_scale=tuple(x.k_scale for x in layers), v_scale=tuple(x.v_scale for x in layers))
        k, v = tuple(x.k for x in layers), tuple(x.v for x in layers)
        return KVCache(
            k, v, layers[0].pos, layers[0].index, **scales, slot_write=self.slot_write, key_layout=self.key_layout
        )


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class KVLayer:
    """One layer of the contiguous cache, float or int8: :meth:`write` the new tokens, then :meth:`attend`.

    Layouts: K [B*KVH, S, Hd] and V [B*KVH, Hd, S] (key layout "sd"), or K [B*KVH, Hd, S] and V [B*KVH, S, Hd]
    ("ds", XLA:CPU's faster float32 matmuls). Either way both attention matmuls have one batch axis with no size-1
    dimension; with [B, S, KVH, Hd] (or any layout with a size-1 batch axis) XLA copied every layer's whole cache
    each step."""

    k: jax.Array  # [B*KVH, S, Hd] ("ds": [B*KVH, Hd, S])
    v: jax.Array  # [B*KVH, Hd, S] ("ds": [B*KVH, S, Hd])
    pos: jax.Array  # [B, S] int32, each slot's position; -1 = empty or padding
    index: jax.Array | int  # [] int32, the next slot to write
    k_scale: jax.Array | None = None  # int8 cache only: [B*KVH, S] float32
    v_scale: jax.Array | None = None  # int8 cache only: [B*KVH, S] float32
    slot_write: SlotWrite = field(default=write_slots, metadata=dict(static=True))
    key_layout: str = field(default="sd", metadata=dict(static=True))  # "sd" or "ds"

    @staticmethod
    def of(k: jax.Array, v: jax.Array, positions: jax.Array, key_layout: str = "sd") -> KVLayer:
        """The keys and values k, v [B, T, KVH, Hd] of tokens at ``positions`` [B, T] as a layer of their own T
        slots, in the cache's layouts: attention without a cache, and what :meth:`write` stores."""
        ka, va = slot_axes(key_layout)
        return KVLayer(_heads_first(k, ka), _heads_first(v, va), positions, k.shape[1], key_layout=key_layout)

    def write(self, k: jax.Array, v: jax.Array, positions: jax.Array) -> KVLayer:
        """Store k, v [B, T, KVH, Hd] of tokens at ``positions`` [B, T] in slots ``index .. index+T-1``: one
        ``slot_write`` (:func:`write_slots`: a ``dynamic_update_slice``) per array, in place when the cache is
        donated. int8: each vector quantized with its own scale (:func:`quantize_kv`)."""
        new, i, write = KVLayer.of(k, v, positions, self.key_layout), self.index, self.slot_write
        ka, va = slot_axes(self.key_layout)  # the slots' axis in K and in V; head_dim is the other one (3 - axis)
        pos = write(self.pos, positions.astype(self.pos.dtype), i, 1)  # [B, S]
        if self.k_scale is None:
            nk, nv, scales = new.k.astype(self.k.dtype), new.v.astype(self.v.dtype), {}
        else:
            (nk, ks), (nv, vs) = quantize_kv(new.k, axis=3 - ka), quantize_kv(new.v, axis=3 - va)
            scales = dict(k_scale=write(self.k_scale, ks, i, 1), v_scale=write(self.v_scale, vs, i, 1))  # [B*KVH, S]
        k = write(self.k, nk, i, ka)
        v = write(self.v, nv, i, va)
        return KVLayer(k, v, pos, i + new.k.shape[ka], **scales, slot_write=write, key_layout=self.key_layout)

    def attend(self, q: jax.Array, positions: jax.Array, policy) -> jax.Array:
        """Attention of q [B, T, KVH, G, Hd] at ``positions`` [B, T] over the layer's slots -> [B, T, KVH*G*Hd]
        float32: a query at position p sees the slots holding positions 0..p. ``policy`` is the model's
        :class:`~jaxlab.engine.model.Policy`: its matmul, and its attention switch ("xla" or "pallas"): XLA's
        :func:`read_slots`, the flash kernel (:func:`pallas_contiguous`), or on a CPU jaxlab's own kernel
        (:func:`cpu_contiguous`, where :func:`uses_cpu_kernel` says so)."""
        if policy.attention == "pallas":
            b, t, kvh, g, hd = q.shape
            q = q.transpose(0, 2, 3, 1, 4).reshape(b * kvh, g * t, hd)  # [B*KVH, G*T, Hd]
            out = pallas_contiguous(q, self, positions, policy)
            return out.reshape(b, kvh, g, t, hd).transpose(0, 3, 1, 2, 4).reshape(b, t, kvh * g * hd)
        if uses_cpu_kernel(q, self, policy):  # other platforms' programs, vmap and grad keep XLA's read
            xla = functools.partial(xla_contiguous, policy=policy)
            return cpu_kernels.on_cpu(cpu_contiguous, xla)(q, positions, self.k, self.v, self.pos, self.index)
        return read_slots(q, positions, self, policy)


def read_slots(q: jax.Array, positions: jax.Array, layer: KVLayer, policy) -> jax.Array:
    """XLA's attention over a contiguous layer, every slot read and masked by its position: q [B, T, KVH, G, Hd] at
    ``positions`` [B, T] -> [B, T, KVH*G*Hd] float32 (the policy's sums: float64 under "float64")."""
    b, t, kvh, g, hd = q.shape
    bk, s = b * kvh, layer.pos.shape[1]
    q = q.transpose(0, 2, 3, 1, 4).reshape(bk, g * t, hd)  # [B*KVH, G*T, Hd]: a group's G heads read one K/V head
    ka, va = slot_axes(layer.key_layout)
    if layer.k_scale is not None:  # int8: the key scales multiply the scores
        scores = int8_bmm(q, layer.k, 3 - ka) * layer.k_scale[:, None, :]
    else:
        scores = policy.matmul("nqd,nsd->nqs" if ka == 1 else "nqd,nds->nqs", q, layer.k)
    scores = scores.astype(policy.acc_dtype).reshape(b, kvh, g, t, s) * (hd**-0.5)
    visible = (layer.pos[:, None, :] >= 0) & (layer.pos[:, None, :] <= positions[:, :, None])  # [B, T, S]
    scores = jnp.where(visible[:, None, None], scores, MASK_VALUE)
    probs = rows_alike(SOFTMAX, scores).reshape(bk, g * t, s)
    if layer.v_scale is not None:  # fold each value vector's scale into its attention weight
        out = int8_bmm(probs * layer.v_scale[:, None, :], layer.v, va)  # [B*KVH, G*T, Hd]
    else:
        out = policy.matmul("nqs,nds->nqd" if va == 2 else "nqs,nsd->nqd", probs, layer.v)
    return out.reshape(b, kvh, g, t, hd).transpose(0, 3, 1, 2, 4).reshape(b, t, kvh * g * hd)


def uses_cpu_kernel(q: jax.Array, layer: KVLayer, policy) -> bool:
    """Whether attention over ``layer`` runs on jaxlab's CPU kernel (:mod:`jaxlab.engine.kernels.cpu`) when the
    program is lowered for a CPU: float32 queries (a decode step's or a prefill's) over the float32 layout XLA:CPU
    gets from :func:`key_layout_for` ("ds"), the kernel built and not turned off."""
    if policy.dtype != "float32" or q.dtype != jnp.float32 or layer.k_scale is not None or layer.key_layout != "ds":
        return False
    return layer.k.dtype == jnp.float32 and cpu_kernels.uses_contiguous_attention(q.shape[-1])


def cpu_contiguous(q, positions, k, v, slot_pos, index) -> jax.Array:
    """The contiguous float32 "ds" layer's attention by jaxlab's CPU kernel: q [B, T, KVH, G, Hd] at ``positions``
    [B, T] -> [B, T, KVH*G*Hd] float32, each query reading the written slots up to the last it sees
    (benchmarks/NOTES.md 28, 29); what
    :meth:`KVLayer.attend` computes with XLA, within float32 rounding."""
    b, t = positions.shape
    return cpu_kernels.contiguous_attention(q, positions, k, v, slot_pos, index).reshape(b, t, -1)


def xla_contiguous(q, positions, k, v, slot_pos, index, policy) -> jax.Array:
    """:func:`cpu_contiguous`'s arguments, XLA's attention (:func:`read_slots`)."""
    return read_slots(q, positions, KVLayer(k, v, slot_pos, index, key_layout="ds"), policy)


def _heads_first(x: jax.Array, slot_axis: int) -> jax.Array:
    """x [B, T, KVH, Hd] -> [B*KVH, T, Hd] (``slot_axis`` 1) or [B*KVH, Hd, T] (``slot_axis`` 2)."""
    b, t, kvh, hd = x.shape
    if slot_axis == 1:
        return x.transpose(0, 2, 1, 3).reshape(b * kvh, t, hd)
    return x.transpose(0, 2, 3, 1).reshape(b * kvh, hd, t)


def pallas_contiguous(q: jax.Array, layer: KVLayer, positions: jax.Array, policy) -> jax.Array:
    """The contiguous cache's attention as the Pallas flash kernel: q [B*KVH, G*T, Hd] at positions [B, T] over a
    float layer (K [B*KVH, S, Hd], V [B*KVH, Hd, S], its slots' positions [B, S]) -> [B*KVH, G*T, Hd] float32."""
    if layer.k_scale is not None:
        raise ConfigError("attention='pallas' reads a float KV cache: drop the int8 cache, or use attention 'xla'")
    if layer.key_layout != "sd":
        raise ConfigError(
            f"attention='pallas' reads the keys as [.., S, Hd], and this cache has key_layout {layer.key_layout!r}: "
            "make it with init_cache(..., key_layout='sd'), or use attention 'xla'"
        )
    b, t = positions.shape
    kvh, g_t = q.shape[0] // b, q.shape[1]
    q_pos = jnp.broadcast_to(jnp.tile(positions, (1, g_t // t))[:, None], (b, kvh, g_t))
    k_pos = jnp.broadcast_to(layer.pos[:, None], (b, kvh, layer.pos.shape[1]))
    return flash_attention(
        q,
        layer.k,
        layer.v,
        q_pos.reshape(b * kvh, -1),
        k_pos.reshape(b * kvh, -1),
        v_transposed=True,
        dtype=policy.jnp_dtype,
        precision=policy.lax_precision,
    )


def kv_vector_bytes(cfg: LlamaConfig, dtype=jnp.float32) -> int:
    """Bytes of one cached key or value vector: head_dim values, plus its float32 scale in the int8 cache."""
    dtype = jnp.dtype(dtype)
    return cfg.head_dim * dtype.itemsize + (4 if dtype == jnp.int8 else 0)


def cache_bytes(cfg: LlamaConfig, batch: int, slots: int, dtype=jnp.float32) -> int:
    """Bytes of a KV cache of ``batch`` rows x ``slots`` slots: 2 (K and V) x layers x batch x slots x
    kv_heads x vector bytes (:func:`kv_vector_bytes`). The one formula every report uses; it equals
    ``init_cache(...).nbytes()`` (tests/engine/test_generate.py checks it). ``slots`` may be fractional
    (an average context, in the cost model)."""
    return 2 * cfg.n_layers * batch * slots * cfg.n_kv_heads * kv_vector_bytes(cfg, dtype)


#: the cache's key layouts: "sd" K [.., S, Hd] and V [.., Hd, S]; "ds" K [.., Hd, S] and V [.., S, Hd]
KEY_LAYOUTS = ("sd", "ds")


def check_key_layout(key_layout: str) -> str:
    """``key_layout`` if it is one of :data:`KEY_LAYOUTS` (the contiguous cache's and the paged pool's), else a
    ValueError that names them."""
    if key_layout not in KEY_LAYOUTS:
        raise ValueError(f"key_layout is 'sd' or 'ds', got {key_layout!r}")
    return key_layout


def slot_axes(key_layout: str) -> tuple[int, int]:
    """(axis of the slots in a contiguous layer's K array, in its V array) in ``key_layout``."""
    return (1, 2) if check_key_layout(key_layout) == "sd" else (2, 1)


def key_layout_for(attention: str, dtype, backend: str | None = None) -> str:
    """The key layout an engine gives its cache (contiguous or paged): "ds" (keys transposed) for float32 where
    XLA:CPU computes the attention, else "sd": the Pallas kernels' layout (on a TPU a [.., head_dim, 16] page
    would pad its 16 positions to 128 lanes), and int8's: the paged int8 step ran 5-19 % slower with "ds" on the
    same CPU (its int8 matmuls alone take the same time from either layout, so the transposing gather of int8
    pages is the likely cost: benchmarks/NOTES.md 17), and the contiguous int8 cache's step up to 13 % slower at 1
    and 32 rows (18)."""
    cpu = (backend or jax.default_backend()) == "cpu"
    return "ds" if attention == "xla" and cpu and jnp.dtype(dtype) == jnp.float32 else "sd"


def init_cache(
    cfg: LlamaConfig,
    batch: int,
    length: int,
    dtype=jnp.float32,
    slot_write: SlotWrite = write_slots,
    key_layout: str = "sd",
) -> KVCache:
    """An empty cache for ``batch`` rows of ``length`` slots; ``dtype="int8"`` gives the int8 cache. ``slot_write``:
    the function every write goes through (:func:`write_slots`; the lab's track passes a student's own).
    ``key_layout``: "sd" or "ds" (the module's docstring; :func:`key_layout_for`)."""
    n, (ka, _) = batch * cfg.n_kv_heads, slot_axes(key_layout)
    slots_then_hd, hd_then_slots = (n, length, cfg.head_dim), (n, cfg.head_dim, length)
    k_shape, v_shape = (slots_then_hd, hd_then_slots) if ka == 1 else (hd_then_slots, slots_then_hd)
    dtype = jnp.dtype(dtype)
    scales = {}
    if dtype == jnp.int8:
        scales = dict(
            k_scale=tuple(jnp.zeros((batch * cfg.n_kv_heads, length), jnp.float32) for _ in range(cfg.n_layers)),
            v_scale=tuple(jnp.zeros((batch * cfg.n_kv_heads, length), jnp.float32) for _ in range(cfg.n_layers)),
        )
    elif not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(f"KV cache dtype must be a float type or int8, got {dtype}")
    return KVCache(
        k=tuple(jnp.zeros(k_shape, dtype) for _ in range(cfg.n_layers)),
        v=tuple(jnp.zeros(v_shape, dtype) for _ in range(cfg.n_layers)),
        pos=jnp.full((batch, length), -1, jnp.int32),
        index=jnp.zeros((), jnp.int32),
        **scales,
        slot_write=slot_write,
        key_layout=key_layout,
    )


def quantize_kv(x: jax.Array, axis: int) -> tuple[jax.Array, jax.Array]:
    """Symmetric int8 over ``axis`` (head_dim): x ~ q * scale. Keys [N, T, Hd] use axis=2, values
    [N, Hd, T] axis=1 (key layout "ds": the other way round); the scale comes back [N, T]."""
    x = x.astype(jnp.float32)
    s = jnp.max(jnp.abs(x), axis=axis) / 127.0
    s = jnp.where(s > 0, s, 1.0)
    q = jnp.clip(jnp.round(x / jnp.expand_dims(s, axis)), -127, 127).astype(jnp.int8)
    return q, s


def int8_bmm(x: jax.Array, m8: jax.Array, axis: int) -> jax.Array:
    """Batched ``x [N, R, K] . m8 [N, *, K]`` contracting ``K`` (axis ``axis`` of ``m8``) -> [N, R, M]
    float32, for the int8 KV cache: ``x`` is written as two int8 rows (``quant.split_activations``,
    ~15 bits) and the product runs as an int8 x int8 -> int32 matmul, which XLA:CPU runs ~2.4x faster
    than the float32 one at batch 32 (benchmarks/NOTES.md §6). Scales of ``m8`` are applied by the caller."""
    rows, s = split_activations(x.astype(jnp.float32))
    acc = jax.lax.dot_general(rows, m8, (((2,), (axis,)), ((0,), (0,))), preferred_element_type=jnp.int32)
    return join_split(acc.astype(jnp.float32), x.shape[1]) * s


def rollback(cache: KVCache, index) -> KVCache:
    """Forget every slot from ``index`` on (they stay allocated and are overwritten later)."""
    slots = jnp.arange(cache.length)
    pos = jnp.where(slots[None, :] < index, cache.pos, -1)
    return replace(cache, pos=pos, index=jnp.asarray(index, jnp.int32))


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int, length: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Left-pad id lists to one length -> (tokens [B, L], positions [B, L]) int32; padding has position -1.

    Left padding puts every row's last prompt token in the last column, so every row writes its next
    token into the same cache slot; position -1 tells attention that a slot is padding."""
    length = max(len(p) for p in prompts) if length is None else length
    if any(len(p) > length for p in prompts):
        raise ValueError(f"a prompt is longer than the padded length {length}")
    tokens = np.full((len(prompts), length), pad_id, np.int32)
    positions = np.full((len(prompts), length), -1, np.int32)
    for i, p in enumerate(prompts):
        tokens[i, length - len(p) :] = p
        positions[i, length - len(p) :] = np.arange(len(p))
    return tokens, positions
